#!/usr/bin/env bash
# The README's super-resolution walk-through, small: examples/superres.json
# trained (fewer, smaller patches and epochs) on generated grey images,
# `trainerd predict --degrade` on held-back whole images and `trainerd
# degrade` for bicubic's inputs; examples/psnr.py must find the net's
# outputs better than bicubic's against the originals, and val_psnr in the
# run's metrics.  Skipped (77) without python3-numpy.
# Usage: superres.sh PATH/TO/trainerd   (run from the repository root)
set -u
TRAINERD=$(realpath "${1:?usage: superres.sh TRAINERD}")
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
skip_without superres numpy
make_work
examples="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../examples" && pwd)"
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Grey images of discs and bars with sharp edges on smooth backgrounds:
# ten 48x48 to train on, two to validate, three 60x76 held back.
"$py" - "$work" <<'PY'
import os, sys
import numpy as np
from imagelib import png_write
w = sys.argv[1]
rng = np.random.default_rng(11)
def image(h, wd):
    yy, xx = np.mgrid[0:h, 0:wd]
    a = 90 + 60 * np.sin(xx / rng.uniform(4, 9)) * np.cos(yy / rng.uniform(4, 9))
    for _ in range(6):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, wd), rng.uniform(2, 8)
        a[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255)
    for _ in range(4):
        x0 = int(rng.uniform(0, wd - 3))
        a[:, x0:x0 + int(rng.uniform(1, 3))] = rng.uniform(0, 255)
    return np.clip(a, 0, 255)
for d, n, (h, wd) in (("train", 10, (48, 48)), ("val", 2, (48, 48)), ("test", 3, (60, 76))):
    os.makedirs(f"{w}/superres/{d}")
    for i in range(n):
        png_write(f"{w}/superres/{d}/{i:02d}.png", image(h, wd))
PY

cd "$work" || exit 1
"$TRAINERD" run "$examples/superres.json" --out out --quiet --devices 2 --set /epochs=6 \
	--set /model/inputs='[1, 24, 24]' --set /data/train/patch_size=24 --set /data/train/patches_per_image=24 \
	--set /data/validation/patch_size=24 --set /data/validation/patches_per_image=8 --set /batch_size=16 \
	--set /prefetch/workers=2 2>run.err
check "examples/superres.json trains" test $? -eq 0
check "validation PSNR is recorded" grep -q '"name":"val_psnr"' out/metrics.jsonl
"$TRAINERD" predict out/model.safetensors superres/test --degrade --out pred/ 2>err
check "predict --degrade on the held-back images exits 0" test $? -eq 0
"$TRAINERD" degrade superres/test bicubic --factor 2 2>err
check "trainerd degrade makes bicubic's images" test $? -eq 0
"$py" "$examples/psnr.py" superres/test pred bicubic >psnr.txt
check "examples/psnr.py exits 0" test $? -eq 0
cat psnr.txt
"$py" - <<'PY'
import re
m = dict(re.findall(r"^(\w+): mean ([\d.]+) dB", open("psnr.txt").read(), re.M))
net, bic = float(m["pred"]), float(m["bicubic"])
assert net > bic + 0.3, f"the net's {net} dB does not beat bicubic's {bic} dB"
PY
check "the net beats bicubic in PSNR on held-back images" test $? -eq 0

finish
