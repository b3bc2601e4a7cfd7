#!/usr/bin/env bash
# init.from with a PyTorch state_dict as safetensors.torch.save_file writes
# it: batchnorm's num_batches_tracked is I64 there (trainerd keeps a
# float), and a state_dict saved without it starts the counter at 0.  The
# file is written as save_file does (tests/torch/common.py, st_write with
# as_save_file: sorted names, dtype I64/F32), since Debian has no
# python3-safetensors.  With a learning rate of 1e-9 the trained weights
# must still be the loaded ones, and the counter must go on from 7.
# Usage: init_from_torch.sh PATH/TO/trainerd   (run from the repository root)
set -u
TRAINERD=${1:?usage: init_from_torch.sh TRAINERD}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
find_python
if ! "$py" -c 'import torch, numpy, sklearn' 2>/dev/null; then
	echo "init_from_torch: skipped, needs python3-torch, python3-numpy and python3-sklearn (scripts/install-deps.sh installs them)"
	exit 77
fi
make_work

"$py" - "$work" <<'PY'
import sys
sys.path.insert(0, "tests/torch")
import torch
from common import st_write
w = sys.argv[1]
torch.manual_seed(5)
net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, padding=1), torch.nn.BatchNorm2d(2), torch.nn.ReLU(),
                          torch.nn.Flatten(), torch.nn.Linear(32, 3))
with torch.no_grad():
    net[1].running_mean.fill_(0.25)
    net[1].running_var.fill_(2.0)
    net[1].num_batches_tracked.fill_(7)
sd = net.state_dict()
assert sd["1.num_batches_tracked"].dtype == torch.int64
st_write(f"{w}/torch.safetensors", sd, as_save_file=True)
st_write(f"{w}/old.safetensors", {k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")},
         as_save_file=True)
PY
for init in torch old; do
	cat >"$work/$init.json" <<SPEC
{"name": "from-torch", "seed": 1,
 "model": {"inputs": [1, 4, 4], "loss": "softmax_cross_entropy", "layers": [
   {"type": "conv2d", "filters": 2, "kernel": 3, "padding": 1}, {"type": "batchnorm2d"}, {"type": "relu"},
   {"type": "flatten"}, {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "synthetic", "samples": 64, "shape": [1, 4, 4], "classes": 3}},
 "init": {"from": "$work/$init.safetensors"},
 "batch_size": 32, "epochs": 1, "optimizer": {"type": "sgd", "lr": 1e-9}}
SPEC
	"$TRAINERD" run "$work/$init.json" --out "$work/out-$init" --quiet 2>"$work/$init.err"
	check "trainerd run loads the $init state_dict" test $? -eq 0
	cat "$work/$init.err" >&2
done

"$py" - "$work" <<'PY'
import sys
sys.path.insert(0, "tests/torch")
import numpy as np
from common import st_read
w = sys.argv[1]
ok = True
init = st_read(f"{w}/torch.safetensors")
for case, counter in (("torch", 7 + 2), ("old", 0 + 2)):
    got = st_read(f"{w}/out-{case}/model.safetensors")
    for name, v in init.items():
        if name.endswith("num_batches_tracked") or name.startswith("1.running"):
            continue
        if not np.allclose(got[name].numpy(), v.numpy(), atol=1e-6):
            print(f"{case}: {name} is not the loaded tensor"); ok = False
    c = float(got["1.num_batches_tracked"])
    if c != counter:
        print(f"{case}: num_batches_tracked is {c}, want {counter}"); ok = False
print("init_from_torch:", "weights and counters as loaded" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
check "weights loaded, the counter goes on from the file's (0 when missing)" test $? -eq 0
finish
