#!/usr/bin/env bash
# An image-to-image model used on images (docs/design.md, "Image-to-image
# models"): a small fully convolutional net trained by `trainerd run` on
# patches of x2-degraded images records its pixels (scale, channels,
# degradation, residual response) and free H and W; `trainerd predict
# --degrade --out DIR/` on held-back images of another size gives, per
# input, the degraded image plus the net's residual, equal to a direct
# computation (imresize in numpy, the convolutions in PyTorch), as float
# .npy and as 8-bit PNGs of the same name and size; a run in small tiles
# equals the whole-image run; `trainerd degrade` makes the same degraded
# image; validation reports val_psnr and val_ssim, every eval_every_steps
# too, equal to numpy's on the final model.  A model file without the
# pixels record, a classifier, an image
# below the receptive field or of another channel count, and eval data
# degraded otherwise are refused naming what is wrong.  Skipped (77)
# without python3-torch.
# Usage: image_to_image.sh PATH/TO/trainerd   (run from the repository root)
set -u
TRAINERD=${1:?usage: image_to_image.sh TRAINERD}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
skip_without image_to_image numpy torch
make_work
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Grey images with edges: discs and bars on a gradient; eight 40x40 to
# train on, three 37x45 held back, and some bad inputs.
"$py" - "$work" <<'PY'
import os, sys
import numpy as np
from imagelib import png_write
w = sys.argv[1]
rng = np.random.default_rng(3)
def image(h, wd, ch=1):
    yy, xx = np.mgrid[0:h, 0:wd]
    a = 60 + 80 * (xx / wd) + 40 * np.sin(yy / 5.0)
    for _ in range(4):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, wd), rng.uniform(3, 9)
        a[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255)
    for _ in range(3):
        x0 = int(rng.uniform(0, wd - 3))
        a[:, x0:x0 + 2] = rng.uniform(0, 255)
    a = np.clip(a, 0, 255)
    return a if ch == 1 else np.stack([a] * ch, -1)
for d, n, (h, wd) in (("train", 8, (40, 40)), ("test", 3, (37, 45)), ("val", 3, (16, 16))):
    os.makedirs(f"{w}/{d}")
    for i in range(n):
        png_write(f"{w}/{d}/{i:02d}.png", image(h, wd))
os.makedirs(f"{w}/tiny")
png_write(f"{w}/tiny/a.png", image(5, 30))
os.makedirs(f"{w}/rgb")
png_write(f"{w}/rgb/a.png", image(20, 20, 3))
PY

cat >"$work/sr.json" <<JSON
{"name": "sr", "seed": 1,
 "model": {"inputs": [1, 16, 16],
   "layers": [{"type": "conv2d", "filters": 8, "kernel": 3, "padding": "same"}, {"type": "relu"},
              {"type": "conv2d", "filters": 8, "kernel": 3, "padding": "same"}, {"type": "relu"},
              {"type": "conv2d", "filters": 1, "kernel": 3, "padding": "same"}],
   "loss": "mse"},
 "data": {"train": {"format": "patches", "path": "$work/train", "patch_size": 16, "patches_per_image": 32,
                    "degrade": {"type": "downscale", "factor": 2}, "response": "residual"},
          "validation": {"format": "patches", "path": "$work/val", "patch_size": 16, "patches_per_image": 1,
                         "degrade": {"type": "downscale", "factor": 2}, "response": "residual"}},
 "batch_size": 16, "epochs": 4, "eval_every_steps": 5, "optimizer": {"type": "adam", "lr": 0.003}}
JSON
"$TRAINERD" run "$work/sr.json" --devices 2 --out "$work/sr" --quiet 2>"$work/run.err"
check "training on patches exits 0" test $? -eq 0
model=$work/sr/model.safetensors

"$TRAINERD" predict "$model" "$work/test" --degrade --out "$work/png/" --devices 2 2>"$work/err"
check "predict --degrade --out DIR/ exits 0" test $? -eq 0
"$TRAINERD" predict "$model" "$work/test" --degrade --out "$work/npy/" --format npy --devices 2 2>"$work/err"
check "predict --format npy exits 0" test $? -eq 0
"$TRAINERD" predict "$model" "$work/test" --degrade --out "$work/tiles/" --format npy --tile 16 --batch 3 \
	2>"$work/err"
check "predict in 16x16 tiles exits 0" test $? -eq 0
"$TRAINERD" predict "$model" "$work/test/01.png" --degrade --out "$work/one/" 2>"$work/err"
check "predict on one image file exits 0" test $? -eq 0
"$TRAINERD" degrade "$work/test" "$work/deg" --factor 2 2>"$work/err"
check "trainerd degrade on a folder exits 0" test $? -eq 0
"$TRAINERD" degrade "$work/test" "$work/noisy" --noise 0.05 --seed 3 2>"$work/err" &&
	"$TRAINERD" degrade "$work/test/00.png" "$work/noisy-again.png" --noise 0.05 --seed 3 2>"$work/err" &&
	"$TRAINERD" degrade "$work/test/00.png" "$work/noisy-other.png" --noise 0.05 --seed 4 2>"$work/err"
check "trainerd degrade --noise exits 0" test $? -eq 0
"$TRAINERD" degrade "$work/test" "$work/x" --noise 2 2>"$work/err"
check "a sigma out of (0, 1] exits 2" test $? -eq 2
check "and names the range" grep -q -- "--noise needs a sigma in (0, 1]" "$work/err"
"$TRAINERD" predict "$model" "$work/deg" --out "$work/fromdeg/" --format npy 2>"$work/err"
check "predict on trainerd degrade's images exits 0" test $? -eq 0

"$py" - "$work" <<'PY'
import os, sys
import numpy as np
from imagelib import downscale, model_read, png_read, run_convs
w = sys.argv[1]
meta, t = model_read(f"{w}/sr/model.safetensors")
px = meta["preprocessing"]["pixels"]
assert px == {"scale": px["scale"], "channels": 1, "degrade": {"type": "downscale", "factor": 2},
              "response": "residual"}, px
assert abs(px["scale"] - 1 / 255) < 1e-9, px
assert meta["model"]["input_shape"] == [1, None, None], meta["model"]
assert meta["model"]["receptive_field"] == 7, meta["model"]
assert sorted(os.listdir(f"{w}/png")) == ["00.png", "01.png", "02.png"], os.listdir(f"{w}/png")
worst = worst_tile = 0.0
for i in range(3):
    depth, clean = png_read(f"{w}/test/{i:02d}.png")
    x = clean[:, :, 0].astype(np.float64) / 255  # the pixel scale: [0, 1]
    deg = downscale(x, 2)
    want = deg + run_convs(meta, t, deg[None])[0]  # residual added back
    got = np.load(f"{w}/npy/{i:02d}.npy")
    assert got.shape == (1, 37, 45) and got.dtype == np.float32, (got.shape, got.dtype)
    worst = max(worst, np.abs(got[0] - want).max())
    tiles = np.load(f"{w}/tiles/{i:02d}.npy")
    worst_tile = max(worst_tile, np.abs(tiles - got).max())
    d2, img = png_read(f"{w}/png/{i:02d}.png")
    assert d2 == depth == 8 and img.shape == (37, 45, 1), (d2, img.shape)
    exact = np.clip(np.rint(got[0].astype(np.float64) * 255), 0, 255)
    assert (img[:, :, 0] == exact).all(), "the PNG is the npy output rounded and clipped"
    assert abs(img[:, :, 0].astype(float) - np.clip(want * 255, 0, 255)).max() <= 0.5 + 1e-3
assert worst < 2e-5, f"trainerd's output differs from numpy/torch by {worst}"
assert worst_tile < 1e-5, f"tiled and whole-image outputs differ by {worst_tile}"
_, one = png_read(f"{w}/one/01.png")
_, all1 = png_read(f"{w}/png/01.png")
assert (one == all1).all()
# trainerd degrade writes the degradation rounded to 8 bits
for i in range(3):
    _, clean = png_read(f"{w}/test/{i:02d}.png")
    _, deg = png_read(f"{w}/deg/{i:02d}.png")
    want = np.clip(np.rint(downscale(clean[:, :, 0] / 255.0, 2) * 255), 0, 255)
    assert np.abs(deg[:, :, 0] - want).max() <= 1 and (deg[:, :, 0] == want).mean() > 0.99
# noise of sigma 0.05 on the 0..1 scale: 12.75 grey levels; the same seed
# gives the same noise, another seed other noise
_, a = png_read(f"{w}/noisy/00.png")
_, again = png_read(f"{w}/noisy-again.png")
_, other = png_read(f"{w}/noisy-other.png")
_, clean = png_read(f"{w}/test/00.png")
inside = (clean > 40) & (clean < 215)  # far from clipping
n = (a.astype(float) - clean)[inside]
assert abs(n.mean()) < 1.0 and abs(n.std() - 12.75) < 1.2, (n.mean(), n.std())
assert (a == again).all() and (a != other).mean() > 0.5
# the model on degrade's images: the same outputs up to the 8-bit rounding
a, b = np.load(f"{w}/fromdeg/00.npy"), np.load(f"{w}/npy/00.npy")
assert np.abs(a - b).max() < 0.02, np.abs(a - b).max()
# validation figures: every 5 steps and at each epoch's end (16 steps
# an epoch), psnr from the mse on [0, 1], ssim of the restored 16x16
# validation images (the whole image is the patch) as Wang et al. define it
import json
pts = [json.loads(l) for l in open(f"{w}/sr/metrics.jsonl")]
steps = {n: [p["step"] for p in pts if p["name"] == n] for n in ("val_loss", "val_psnr", "val_ssim")}
want_steps = sorted(set(range(5, 65, 5)) | {16, 32, 48, 64})
assert steps["val_loss"] == steps["val_psnr"] == steps["val_ssim"] == want_steps, steps
last = {p["name"]: p["value"] for p in pts if p["step"] == 64}
assert abs(last["val_psnr"] - 10 * np.log10(1 / last["val_loss"])) < 1e-4, last
def ssim(a, b, L=1.0):
    g = np.exp(-((np.arange(11) - 5.0) ** 2) / (2 * 1.5 ** 2))
    g = np.outer(g, g) / g.sum() ** 2
    def filt(z):
        h, wd = z.shape
        return np.array([[(g * z[y:y + 11, x:x + 11]).sum() for x in range(wd - 10)] for y in range(h - 10)])
    c1, c2 = (0.01 * L) ** 2, (0.03 * L) ** 2
    ma, mb = filt(a), filt(b)
    va, vb, cab = filt(a * a) - ma ** 2, filt(b * b) - mb ** 2, filt(a * b) - ma * mb
    return (((2 * ma * mb + c1) * (2 * cab + c2)) / ((ma ** 2 + mb ** 2 + c1) * (va + vb + c2))).mean()
vals, mse = [], []
for i in range(3):
    _, clean = png_read(f"{w}/val/{i:02d}.png")
    x = clean[:, :, 0] / 255.0
    deg = downscale(x, 2)
    out = deg + run_convs(meta, t, deg[None])[0]
    vals.append(ssim(out, x))
    mse.append(np.mean((out - x) ** 2))
assert abs(np.mean(vals) - last["val_ssim"]) < 1e-4, (np.mean(vals), last["val_ssim"])
assert abs(np.mean(mse) - last["val_loss"]) < 1e-6, (np.mean(mse), last["val_loss"])
# a model file written before pixels were recorded
import json, struct
raw = open(f"{w}/sr/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
pre = json.loads(h["__metadata__"]["preprocessing"])
del pre["pixels"]
h["__metadata__"]["preprocessing"] = json.dumps(pre)
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
open(f"{w}/old.safetensors", "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
PY
check "outputs equal numpy/torch's; tiles equal the whole image; PNGs are the outputs rounded" test $? -eq 0

# A patches model that is not fully convolutional (flatten, dense) gives
# vectors: CSV as before, on pixels scaled to [0, 1] as in training (an
# image folder's 0..255 fed as they are gave outputs 255x off)
sed -e 's/"layers": \[{"type": "conv2d", "filters": 8, "kernel": 3, "padding": "same"}, {"type": "relu"},/"layers": [{"type": "flatten"}, {"type": "dense", "units": 256}],/' \
	-e '/"filters": 8, "kernel": 3, "padding": "same"}, {"type": "relu"},$/d' \
	-e '/"filters": 1, "kernel": 3, "padding": "same"}\],$/d' \
	-e 's/"eval_every_steps": 5, //' "$work/sr.json" >"$work/dense.json"
"$TRAINERD" run "$work/dense.json" --devices 2 --out "$work/dense" --quiet 2>"$work/run.err"
check "a flatten + dense patches model trains" test $? -eq 0
"$TRAINERD" predict "$work/dense/model.safetensors" "$work/val" --out "$work/dense.csv" 2>"$work/err"
check "its predictions on an image folder go to CSV" test $? -eq 0
"$py" - "$work" <<'PY'
import csv, sys
import numpy as np
from imagelib import model_read, png_read
w = sys.argv[1]
meta, t = model_read(f"{w}/dense/model.safetensors")
assert [l["type"] for l in meta["model"]["layers"]] == ["flatten", "dense"], meta["model"]["layers"]
assert "input_shape" not in meta["model"], meta["model"]
rows = list(csv.reader(open(f"{w}/dense.csv")))
assert rows[0][0] == "file" and len(rows) == 4, rows[0][:3]
for i, r in enumerate(rows[1:]):
    _, img = png_read(f"{w}/val/{i:02d}.png")
    want = t["1.weight"].astype(np.float64) @ (img[:, :, 0].ravel() / 255.0) + t["1.bias"]
    got = np.array([float(v) for v in r[1:]])
    assert np.abs(got - want).max() < 1e-4, np.abs(got - want).max()
PY
check "CSV outputs are the model on pixels scaled to [0, 1]" test $? -eq 0

# Refusals, exit 2, naming what is wrong
"$TRAINERD" predict "$work/old.safetensors" "$work/test" --out "$work/o/" 2>"$work/err"
check "a model file without pixels exits 2" test $? -eq 2
check "what is missing is named" grep -q "no preprocessing.pixels (the pixel scale, channel count" "$work/err"
check "nothing is written for it" test ! -e "$work/o"
"$TRAINERD" predict "$work/old.safetensors" "$work/test" --out "$work/o.csv" 2>"$work/err"
check "without pixels, CSV output is refused too" test $? -eq 2
"$TRAINERD" predict "$model" "$work/test" --out "$work/o.csv" 2>"$work/err"
check "image outputs to CSV exit 2" test $? -eq 2
check "and say to use --out DIR/" grep -q "write them with --out DIR/" "$work/err"
"$TRAINERD" predict "$model" "$work/tiny" --out "$work/o2/" 2>"$work/err"
check "an image below the receptive field exits 2" test $? -eq 2
check "the image and the field are named" grep -q "tiny/a.png: 30x5 is smaller than the model's receptive field 7x7" "$work/err"
"$TRAINERD" predict "$model" "$work/rgb" --out "$work/o3/" 2>"$work/err"
check "an RGB image for a grey model exits 2" test $? -eq 2
check "the channels are named" grep -q "rgb/a.png: 3 channels, the model takes 1" "$work/err"
"$TRAINERD" predict "$model" "$work/test" --out "$work/test/" 2>"$work/err"
check "writing into the input folder exits 2" test $? -eq 2
"$TRAINERD" eval "$model" "{\"format\": \"patches\", \"path\": \"$work/test\", \"patch_size\": 16, \"degrade\": {\"type\": \"downscale\", \"factor\": 3}, \"response\": \"residual\"}" 2>"$work/err"
check "eval on patches degraded otherwise exits 2" test $? -eq 2
check "both degradations are named" grep -q '/degrade: {"type":"downscale","factor":3}, the model was trained with {"type":"downscale","factor":2}' "$work/err"
"$TRAINERD" eval "$model" "{\"format\": \"patches\", \"path\": \"$work/test\", \"patch_size\": 16, \"response\": \"residual\"}" --json >"$work/e.json" 2>"$work/err"
check "eval on patches degraded as in training exits 0" test $? -eq 0

finish
