#!/usr/bin/python3
"""Writes scikit-learn's digits (1797 8x8 images, 64 features 0..16 and a
class 0..9 in the last column) as two CSV files for trainerd: the first
1497 rows of a fixed shuffle as digits-train.csv, the other 300 as
digits-val.csv.

The data is the digits.csv.gz that scikit-learn ships (Debian:
python3-sklearn, /usr/lib/python3/dist-packages/sklearn/datasets/data/);
only the standard library is used to read it.

Usage: examples/digits_csv.py [--from digits.csv.gz] [OUT_DIR]
(OUT_DIR defaults to the current directory)
"""
import glob
import gzip
import os
import random
import sys

CANDIDATES = [
    "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz",
    "/usr/local/lib/python3*/dist-packages/sklearn/datasets/data/digits.csv.gz",
    "/usr/local/lib/python3*/site-packages/sklearn/datasets/data/digits.csv.gz",
]


def find_digits():
    try:
        import sklearn.datasets  # only to find the file; not needed
        path = os.path.join(os.path.dirname(sklearn.datasets.__file__), "data", "digits.csv.gz")
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    for pattern in CANDIDATES:
        for path in glob.glob(pattern):
            return path
    sys.exit("digits_csv.py: scikit-learn's digits.csv.gz not found; install python3-sklearn "
             "(apt-get install python3-sklearn)")


def main():
    args = sys.argv[1:]
    src = None
    if len(args) >= 2 and args[0] == "--from":
        src, args = args[1], args[2:]
    out = args[0] if args else "."
    os.makedirs(out, exist_ok=True)
    with gzip.open(src or find_digits(), "rt") as f:
        rows = [line.strip() for line in f if line.strip()]
    random.Random(42).shuffle(rows)
    for name, part in (("digits-train.csv", rows[:1497]), ("digits-val.csv", rows[1497:])):
        with open(os.path.join(out, name), "w") as f:
            f.write("\n".join(part) + "\n")
        print("%s: %d rows" % (os.path.join(out, name), len(part)))


if __name__ == "__main__":
    main()
