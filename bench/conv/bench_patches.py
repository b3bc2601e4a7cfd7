#!/usr/bin/env python3
"""bench/conv/bench_patches.py: does background patch extraction hide its
cost?  (bench/conv/RESULTS.md, "Patch extraction")

Writes 16 grey 512x512 PNG images (smooth shapes plus texture, from a fixed
seed; the PNG encoder is zlib and struct, no imaging library needed), then
trains bench/conv/workloads/patches.json (the examples/superres.json net:
41x41 patches cut from random places, bicubic 2x down and up as the
degradation, flips and rotations, 5 conv layers of 16 filters, batch 32)
with 1, 2 and 4 loader threads, `--rounds` times each, round-robin, and
reports the median share of step time spent waiting for data
(summary.json's data_wait_fraction) and samples/s.  --tiny swaps the net
for a single one-filter conv, so that the run is bound by the loaders and
samples/s is their rate.

  bench_patches.py --trainerd BUILD/daemon/trainerd --out DIR [--steps 60] [--rounds 3] [--tiny]
"""
import argparse
import json
import math
import os
import random
import statistics
import struct
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def png_grey(path, w, h, pix):
    raw = b"".join(b"\x00" + bytes(pix[y * w:(y + 1) * w]) for y in range(h))

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def make_images(d, n, side):
    os.makedirs(d, exist_ok=True)
    rnd = random.Random(7)
    for k in range(n):
        fx, fy = rnd.uniform(0.05, 0.3), rnd.uniform(0.05, 0.3)
        sx = [20 * math.sin(fx * x) for x in range(side)]
        rows = [[128 + sx[x] * math.cos(fy * y) for x in range(side)] for y in range(side)]
        for _ in range(12):
            # a disc, row by row as spans
            cx, cy, r, a = rnd.uniform(0, side), rnd.uniform(0, side), rnd.uniform(20, 120), rnd.uniform(-45, 45)
            for y in range(max(0, int(cy - r)), min(side, int(cy + r) + 1)):
                h = r * r - (y - cy) ** 2
                if h <= 0:
                    continue
                h = math.sqrt(h)
                row = rows[y]
                for x in range(max(0, int(cx - h)), min(side, int(cx + h) + 1)):
                    row[x] += a
        pix = [max(0, min(255, int(v + rnd.uniform(-6, 6)))) for row in rows for v in row]
        png_grey(os.path.join(d, f"img{k:02d}.png"), side, side, pix)


def run(args, workers, rnd):
    d = os.path.join(args.out, "runs", f"w{workers}-{rnd}")
    os.makedirs(d, exist_ok=True)
    cmd = [args.trainerd, "run", os.path.join(HERE, "workloads", "patches.json"), "--set",
           f"/data/train/path={os.path.join(args.out, 'images')}", "--set", f"/max_steps={args.steps}",
           "--workers", str(workers), "--devices", "1", "--out", d, "--quiet"]
    if args.tiny:
        # one 3x3 conv of one filter: the step costs almost nothing, so
        # samples/s is the loaders' own rate
        cmd[3:3] = ["--set", '/model/layers=[{"type": "conv2d", "filters": 1, "kernel": 3, "padding": "same"}]']
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"trainerd failed ({workers} workers): {p.stderr.strip()[-1000:]}")
    with open(os.path.join(d, "summary.json")) as f:
        s = json.load(f)
    with open("/proc/loadavg") as f:
        load = float(f.read().split()[0])
    return {"data_wait_fraction": s["data_wait_fraction"], "samples_per_sec": s["samples_per_sec"], "load": load}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainerd", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--tiny", action="store_true", help="a one-filter model: measures the loaders alone")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.out, "images", "img15.png")):
        make_images(os.path.join(args.out, "images"), 16, 512)
    res = {w: [] for w in args.workers}
    for rnd in range(args.rounds):
        for w in args.workers:
            res[w].append(run(args, w, rnd))
            r = res[w][-1]
            print(f"[bench/patches] round {rnd} workers {w}: data wait {100 * r['data_wait_fraction']:.1f}%, "
                  f"{r['samples_per_sec']:.1f} samples/s, load {r['load']:.1f}", file=sys.stderr, flush=True)
    lines = ["| loader threads | data wait (median) | data wait (each round) | samples/s (median) |",
             "|---:|---:|---|---:|"]
    for w in args.workers:
        fr = [r["data_wait_fraction"] for r in res[w]]
        lines.append(f"| {w} | {100 * statistics.median(fr):.1f}% | "
                     f"{', '.join(f'{100 * x:.1f}%' for x in fr)} | "
                     f"{statistics.median(r['samples_per_sec'] for r in res[w]):.1f} |")
    out = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(out)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "steps": args.steps,
                   "runs": {str(k): v for k, v in res.items()}}, f, indent=1)
    print(out)


if __name__ == "__main__":
    main()
