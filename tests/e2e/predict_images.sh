#!/usr/bin/env bash
# End-to-end checks of `trainerd predict` and `trainerd eval` on image
# folders: a tiny CNN trained on a generated folder of PNG files (one
# subfolder per class) predicts on a flat folder of the same images and on
# the class folder itself, with equal results, a file column and a header
# naming the classes; eval on the class folder reports the accuracy the
# predictions give; a truncated image, an image of another size and class
# folders unlike the model's exit 2 naming what is wrong.
# Usage: predict_images.sh PATH/TO/trainerd   (run from the repository root)
set -u
TRAINERD=${1:?usage: predict_images.sh TRAINERD}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
make_work
need_numpy predict_images
# the PNG writer of the image-to-image checks (tests/e2e/imagelib.py)
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Data: 8x8 grey PNGs (written with zlib alone) in three classes, stripes
# across, stripes down, a bright centre, with noise; train/<class>/, the
# same test images under test/<class>/ and flat/ (named so that flat/'s
# sorted order is test/'s), and a few bad folders.
"$py" - "$work" <<'PY'
import os, sys
import numpy as np
from imagelib import png_write as png
w = sys.argv[1]
rng = np.random.default_rng(5)
def sample(c, size=8):
    x = rng.normal(60, 25, (size, size))
    if c == 0:
        x[::2, :] += 120
    elif c == 1:
        x[:, ::2] += 120
    else:
        x[2:6, 2:6] += 150
    return np.clip(x, 0, 255)
names = ["across", "down", "spot"]
for split, n in (("train", 40), ("test", 15)):
    for c, name in enumerate(names):
        os.makedirs(f"{w}/{split}/{name}", exist_ok=True)
        for i in range(n):
            png(f"{w}/{split}/{name}/{i:03d}.png", sample(c))
os.makedirs(f"{w}/flat")
for c, name in enumerate(names):
    for i in range(15):
        os.link(f"{w}/test/{name}/{i:03d}.png", f"{w}/flat/{c}-{name}-{i:03d}.png")
# a truncated file among good ones
os.makedirs(f"{w}/trunc")
for i in range(3):
    png(f"{w}/trunc/{i}.png", sample(i))
data = open(f"{w}/trunc/1.png", "rb").read()
open(f"{w}/trunc/1.png", "wb").write(data[:len(data) // 2])
# an image of another size
os.makedirs(f"{w}/big")
png(f"{w}/big/a.png", sample(0))
png(f"{w}/big/b.png", sample(0, 10))
# class folders under other names
for name in ("across", "dots", "spot"):
    os.makedirs(f"{w}/renamed/{name}")
    png(f"{w}/renamed/{name}/0.png", sample(0))
# files and subfolders mixed
os.makedirs(f"{w}/mixed/sub")
png(f"{w}/mixed/a.png", sample(0))
png(f"{w}/mixed/sub/b.png", sample(0))
PY

cat >"$work/cnn.json" <<JSON
{"name": "cnn", "seed": 2,
 "model": {"inputs": [1, 8, 8],
           "layers": [{"type": "conv2d", "filters": 4, "kernel": 3, "padding": "same"}, {"type": "relu"},
                      {"type": "flatten"}, {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "images", "path": "$work/train", "labels": "folders"},
          "transforms": [{"type": "scale", "factor": 0.00392156863},
                         {"type": "normalize", "mean": [0.4], "std": [0.3]}]},
 "batch_size": 16, "epochs": 6, "optimizer": {"type": "adam", "lr": 0.01}}
JSON

"$TRAINERD" run "$work/cnn.json" --devices 2 --out "$work/cnn" --quiet 2>"$work/run.err"
check "training on an image folder exits 0" test $? -eq 0
model=$work/cnn/model.safetensors

# 1. predict on a flat folder (found to be images as a directory) and on
#    the class folder (--format images, labels ignored)
"$TRAINERD" predict "$model" "$work/flat" --out "$work/flat.csv" --devices 2 --batch 7
check "predict on a flat folder exits 0" test $? -eq 0
"$TRAINERD" predict "$model" "$work/test" --format images --out "$work/test.csv" --devices 1
check "predict on a class folder exits 0" test $? -eq 0
"$TRAINERD" predict "$model" "$work/flat" --out "$work/flat.npy"
check "predict on a flat folder to .npy exits 0" test $? -eq 0

# 2. eval on the class folder with its labels
"$TRAINERD" eval "$model" "{\"format\": \"images\", \"path\": \"$work/test\", \"labels\": \"folders\"}" --json \
	>"$work/e.json"
check "eval on an image folder exits 0" test $? -eq 0
"$TRAINERD" eval "$model" "{\"format\": \"images\", \"path\": \"$work/test\", \"labels\": \"folders\"}" >"$work/e.txt"
check "eval text names the classes in the confusion matrix" has "$work/e.txt" "^  across"

"$py" - "$work" <<'PY'
import csv, json, sys
import numpy as np
w = sys.argv[1]
names = ["across", "down", "spot"]
def read(p):
    rows = list(csv.reader(open(p)))
    return rows[0], rows[1:]
hf, flat = read(f"{w}/flat.csv")
ht, test = read(f"{w}/test.csv")
assert hf == ht == ["file", "class", "prob_across", "prob_down", "prob_spot"], (hf, ht)
assert [r[0] for r in flat] == sorted(f"{c}-{n}-{i:03d}.png" for c, n in enumerate(names) for i in range(15)), flat[:3]
assert [r[0] for r in test] == [f"{n}/{i:03d}.png" for n in names for i in range(15)], test[:3]
pf = np.array([[float(v) for v in r[1:]] for r in flat])
pt = np.array([[float(v) for v in r[1:]] for r in test])
assert (pf[:, 0] == pt[:, 0]).all(), "classes differ between the flat and the class folder"
assert np.abs(pf[:, 1:] - pt[:, 1:]).max() < 1e-6, np.abs(pf - pt).max()
assert np.allclose(pf[:, 1:].sum(1), 1, atol=1e-5)
n = np.load(f"{w}/flat.npy")
assert n.shape == (45, 4) and np.abs(n - pf).max() < 1e-6, (n.shape, np.abs(n - pf).max())
y = np.repeat(np.arange(3), 15)
acc = (pt[:, 0] == y).mean()
e = json.load(open(f"{w}/e.json"))
assert e["samples"] == 45 and abs(e["accuracy"] - acc) < 1e-12, (e, acc)
cm = np.zeros((3, 3), int)
np.add.at(cm, (y, pt[:, 0].astype(int)), 1)
assert e["confusion_matrix"] == cm.tolist(), (e["confusion_matrix"], cm)
assert acc > 0.8, acc  # the classes are easy: training did learn
PY
check "flat and class folder predict the same; eval's accuracy is the predictions'" test $? -eq 0

# 3. bad input: exit 2 naming the file, no output left behind
"$TRAINERD" predict "$model" "$work/trunc" --out "$work/t.csv" 2>"$work/err"
check "a truncated image exits 2" test $? -eq 2
check "a truncated image is named" grep -q "trunc/1.png" "$work/err"
check "no half-written output" test ! -e "$work/t.csv" -a ! -e "$work/t.csv.tmp"
"$TRAINERD" predict "$model" "$work/big" --out "$work/b.csv" 2>"$work/err"
check "an image of another size exits 2" test $? -eq 2
check "an image of another size is named with both shapes" \
	grep -q "big/b.png: \[1, 10, 10\], the model takes \[1, 8, 8\]" "$work/err"
"$TRAINERD" eval "$model" "{\"format\": \"images\", \"path\": \"$work/renamed\", \"labels\": \"folders\"}" \
	2>"$work/err"
check "class folders unlike the model's exit 2" test $? -eq 2
check "the differing class is named" grep -q "class 1 is 'dots' in the data, 'down' in the model" "$work/err"
"$TRAINERD" predict "$model" "$work/mixed" --out "$work/m.csv" 2>"$work/err"
check "a folder with files and subfolders exits 2" test $? -eq 2
check "files and subfolders mixed are named" grep -q "both image files (a.png) and subfolders (sub)" "$work/err"
"$TRAINERD" predict "$model" "$work/train/across/000.png" --format images --out "$work/f.csv" 2>"$work/err"
check "a file given as an image folder exits 2" test $? -eq 2
"$TRAINERD" predict "$model" "$work/flat" --format pictures --out "$work/f.csv" 2>"$work/err"
check "an unknown --format exits 2" test $? -eq 2
check "the formats are listed" grep -q "csv, npy, idx or images" "$work/err"
"$TRAINERD" predict --help >"$work/help" 2>&1
check "predict --help describes image folders" grep -q "images    a folder" "$work/help"

# 4. a model trained with resize and center_crop records them; predict
#    and eval apply them to images of any size
sed -e 's/"inputs": \[1, 8, 8\]/"inputs": [1, 6, 6]/' \
	-e 's/"labels": "folders"}/"labels": "folders", "resize": [12, 12], "center_crop": [6, 6]}/' \
	"$work/cnn.json" >"$work/crop.json"
"$TRAINERD" run "$work/crop.json" --devices 2 --out "$work/crop" --quiet 2>"$work/run.err"
check "training with resize and center_crop exits 0" test $? -eq 0
cm=$work/crop/model.safetensors
"$TRAINERD" predict "$cm" "$work/test" --out "$work/ct.csv"
check "predict applies the recorded resize and crop" test $? -eq 0
"$TRAINERD" predict "$cm" "$work/big" --out "$work/cb.csv"
check "predict on images of two sizes with the recorded resize exits 0" test $? -eq 0
"$TRAINERD" eval "$cm" "{\"format\": \"images\", \"path\": \"$work/test\", \"labels\": \"folders\"}" --json \
	>"$work/ce.json"
check "eval applies the recorded resize and crop" test $? -eq 0
"$py" - "$work" <<'PY'
import csv, json, struct, sys
import numpy as np
w = sys.argv[1]
raw = open(f"{w}/crop/model.safetensors", "rb").read()
meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
pre = json.loads(meta["preprocessing"])
assert pre["images"] == {"resize": [12, 12], "center_crop": 6}, pre  # as a job spec writes them
assert json.loads(meta["labels"])["class_names"] == ["across", "down", "spot"], meta["labels"]
rows = list(csv.reader(open(f"{w}/ct.csv")))[1:]
cls = np.array([int(r[1]) for r in rows])
y = np.repeat(np.arange(3), 15)
e = json.load(open(f"{w}/ce.json"))
assert abs(e["accuracy"] - (cls == y).mean()) < 1e-12, (e, (cls == y).mean())
assert [r[0] for r in list(csv.reader(open(f"{w}/cb.csv")))[1:]] == ["a.png", "b.png"]
PY
check "recorded resize and crop: metadata, predict and eval agree" test $? -eq 0
"$TRAINERD" eval "$cm" "{\"format\": \"images\", \"path\": \"$work/test\", \"labels\": \"folders\", \"center_crop\": 7}" \
	2>"$work/err"
check "a data spec's own crop unlike the model's input exits 2" test $? -eq 2
check "the crop and the model's shape are named" grep -q "center_crop \[7, 7\] does not give the model's \[1, 6, 6\]" "$work/err"

finish
