#!/usr/bin/env bash
# examples/load_torch.py against `trainerd predict` on an image model: a
# conv net with batchnorm2d, a residual block, pooling, groupnorm and the
# recorded standardisation, trained by `trainerd run`, must predict the
# same classes in PyTorch (Debian's python3-torch) as in trainerd, and give
# probabilities within 1e-4.  Skipped (exit 77) without torch.
# Usage: load_torch.sh PATH/TO/trainerd   (run from the repository root)
set -u
TRAINERD=${1:?usage: load_torch.sh TRAINERD}
py=/usr/bin/python3
if ! [ -x "$py" ] || ! "$py" -c 'import torch, numpy' 2>/dev/null; then
	echo "load_torch: skipped, needs python3-torch and python3-numpy (scripts/install-deps.sh installs them)"
	exit 77
fi
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
make_work

"$py" - "$work" <<'PY'
import sys
import numpy as np
w = sys.argv[1]
rng = np.random.default_rng(3)
x = rng.normal(size=(400, 64)).astype(np.float32) * 40 + 100
y = (x[:, :32].sum(1) > 3200).astype(np.int64) + (x[:, 5] > 140)
np.save(f"{w}/x.npy", x)
np.save(f"{w}/y.npy", y.astype(np.float32))
PY
cat >"$work/spec.json" <<SPEC
{"name": "torch-load", "seed": 1,
 "model": {"inputs": [1, 8, 8], "loss": "softmax_cross_entropy", "layers": [
   {"type": "conv2d", "filters": 4, "kernel": 3, "padding": "same"}, {"type": "batchnorm2d"}, {"type": "relu"},
   {"type": "residual", "layers": [{"type": "conv2d", "filters": 4, "kernel": 3, "padding": 1}, {"type": "tanh"}]},
   {"type": "maxpool2d", "kernel": 2}, {"type": "groupnorm", "groups": 2}, {"type": "avgpool2d", "kernel": 2},
   {"type": "flatten"}, {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "npy", "x": "$work/x.npy", "y": "$work/y.npy"},
          "transforms": [{"type": "standardize"}]},
 "batch_size": 32, "epochs": 2, "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9}}
SPEC
"$TRAINERD" run "$work/spec.json" --out "$work/out" --quiet
check "trainerd run trains the conv net" test $? -eq 0
"$TRAINERD" predict "$work/out/model.safetensors" "$work/x.npy" --out "$work/pred.csv"
check "trainerd predict runs" test $? -eq 0
"$py" - "$work" <<'PY'
import csv
import sys
import numpy as np
import torch
sys.path.insert(0, "examples")
from load_torch import load
w = sys.argv[1]
model, prep, labels = load(f"{w}/out/model.safetensors")
with torch.no_grad():
    prob = torch.softmax(model(prep(torch.from_numpy(np.load(f"{w}/x.npy")))), dim=1).numpy()
rows = list(csv.DictReader(open(f"{w}/pred.csv")))
ours = np.array([[float(r[f"prob_{k}"]) for k in range(3)] for r in rows])
cls = np.array([int(r["class"]) for r in rows])
same = (cls == prob.argmax(1)).mean()
diff = np.abs(ours - prob).max()
print(f"load_torch: classes equal for {same:.4f} of the samples, probabilities within {diff:.2e}")
sys.exit(0 if same == 1.0 and diff < 1e-4 else 1)
PY
check "examples/load_torch.py predicts as trainerd predict (classes equal, probabilities within 1e-4)" test $? -eq 0
finish
