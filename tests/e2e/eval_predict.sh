#!/usr/bin/env bash
# End-to-end checks of a trained model's use: the self-description in
# model.safetensors and checkpoint.safetensors, `trainerd predict` against
# examples/load_numpy.py (numpy alone, applying the recorded preprocessing),
# `trainerd eval` against a direct numpy computation, data.test in
# `trainerd run`, bad inputs with their messages and exit code 2, and the
# CPU fallback with `trainerd run`'s warning.
# Usage: eval_predict.sh PATH/TO/trainerd   (run from the repository root)
set -u
TRAINERD=${1:?usage: eval_predict.sh TRAINERD}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
make_work
need_numpy eval_predict

# Data: 3 classes, 6 features on very different scales (standardize
# matters), and a 2-output regression set.
"$py" - "$work" <<'PY'
import sys
import numpy as np
w = sys.argv[1]
rng = np.random.default_rng(7)
def clf(n):
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 6)) + y[:, None] * np.array([1.0, -0.5, 0.8, 0.0, 0.3, -1.0])
    x *= np.array([1000.0, 0.01, 1.0, 50.0, 1.0, 3.0])
    x += np.array([5000.0, 0.0, -2.0, 0.0, 10.0, 0.0])
    return x.astype(np.float32), y
x, y = clf(600)
np.savetxt(f"{w}/train.csv", np.column_stack([x, y]), delimiter=",", fmt="%.9g")
x, y = clf(257)
np.savetxt(f"{w}/test.csv", np.column_stack([x, y]), delimiter=",", fmt="%.9g")
np.savetxt(f"{w}/test_x.csv", x, delimiter=",", fmt="%.9g")
np.save(f"{w}/test_x.npy", x)
np.save(f"{w}/test_y.npy", y.astype(np.int64))
np.savetxt(f"{w}/wide.csv", np.column_stack([x, x[:, :1]]), delimiter=",", fmt="%.9g")
# regression: y = A x + noise, 4 features, 2 outputs
a = rng.normal(size=(2, 4))
xr = (rng.normal(size=(400, 4)) * 20 + 100).astype(np.float32)
yr = xr @ a.T / 20 + rng.normal(size=(400, 2)) * 0.1
np.savetxt(f"{w}/reg.csv", np.column_stack([xr, yr]), delimiter=",", fmt="%.9g")
PY

cat >"$work/clf.json" <<JSON
{"name": "clf", "seed": 3,
 "model": {"layers": [{"type": "dense", "units": 32}, {"type": "relu"}, {"type": "dropout", "rate": 0.1},
                      {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "csv", "path": "$work/train.csv"},
          "test": {"format": "csv", "path": "$work/test.csv"},
          "transforms": [{"type": "scale", "factor": 0.5}, {"type": "standardize"},
                         {"type": "gaussian_noise", "std": 0.05}]},
 "batch_size": 32, "epochs": 4, "optimizer": {"type": "adam", "lr": 0.01},
 "checkpoint": {"every_steps": 30}}
JSON
cat >"$work/reg.json" <<JSON
{"name": "reg", "seed": 3,
 "model": {"layers": [{"type": "dense", "units": 16}, {"type": "tanh"}, {"type": "dense", "units": 2}],
           "loss": "mse"},
 "data": {"train": {"format": "csv", "path": "$work/reg.csv", "label": [-2, -1]},
          "transforms": [{"type": "standardize"}]},
 "batch_size": 32, "epochs": 3, "optimizer": {"type": "adam", "lr": 0.01}}
JSON

# 1. training writes the description into the model and the checkpoint;
#    data.test's figures land in summary.json and metrics.jsonl
"$TRAINERD" run "$work/clf.json" --devices 2 --out "$work/clf" --quiet 2>"$work/run.err"
check "clf run exits 0" test $? -eq 0
"$TRAINERD" run "$work/reg.json" --devices 2 --out "$work/reg" --quiet 2>>"$work/run.err"
check "reg run exits 0" test $? -eq 0
"$py" - "$work" <<'PY'
import json, struct, sys
w = sys.argv[1]
def meta(p):
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n])["__metadata__"]
m, c = meta(f"{w}/clf/model.safetensors"), meta(f"{w}/clf/checkpoint.safetensors")
for k in ("trainerd_model_format", "trainerd_version", "model", "preprocessing", "labels"):
    assert m[k] == c[k], k
model, pre, labels = (json.loads(m[k]) for k in ("model", "preprocessing", "labels"))
assert model["inputs"] == 6 and model["loss"] == "softmax_cross_entropy", model
assert [t["type"] for t in pre["transforms"]] == ["scale", "standardize", "gaussian_noise"], pre
assert len(pre["transforms"][1]["fitted"]["mean"]) == 6 and pre["transforms"][2]["train_only"] is True
assert labels == {"task": "classification", "classes": 3, "class_names": None}, labels
s = json.load(open(f"{w}/clf/summary.json"))
assert 0 < s["test_loss"] and 0.5 < s["test_accuracy"] <= 1, s
pts = [json.loads(l) for l in open(f"{w}/clf/metrics.jsonl")]
assert [p["name"] for p in pts if p["name"].startswith("test_")] == ["test_loss", "test_accuracy"]
assert json.loads(meta(f"{w}/reg/model.safetensors")["labels"]) == {"task": "regression", "outputs": 2}
PY
check "model and checkpoint describe themselves; data.test in summary and metrics" test $? -eq 0

# 2. trainerd predict and the numpy example agree
"$TRAINERD" predict "$work/clf/model.safetensors" "$work/test_x.csv" --out "$work/p.csv" --devices 3 --batch 20
check "predict csv exits 0" test $? -eq 0
"$TRAINERD" predict "$work/clf/model.safetensors" "$work/test_x.npy" --out "$work/p.npy" --devices 1
check "predict npy exits 0" test $? -eq 0
"$py" examples/load_numpy.py "$work/clf/model.safetensors" "$work/test_x.csv" --out "$work/q.csv"
check "numpy example exits 0" test $? -eq 0
"$py" - "$work" <<'PY'
import sys
import numpy as np
w = sys.argv[1]
head = open(f"{w}/p.csv").readline().strip()
assert head == "class,prob_0,prob_1,prob_2", head
assert open(f"{w}/q.csv").readline().strip() == head
p = np.loadtxt(f"{w}/p.csv", delimiter=",", skiprows=1)
q = np.loadtxt(f"{w}/q.csv", delimiter=",", skiprows=1)
n = np.load(f"{w}/p.npy")
assert p.shape == q.shape == n.shape == (257, 4), (p.shape, q.shape, n.shape)
assert (p[:, 0] == q[:, 0]).all(), "classes differ"
assert np.abs(p[:, 1:] - q[:, 1:]).max() < 1e-5, np.abs(p[:, 1:] - q[:, 1:]).max()
assert np.abs(p - n).max() < 1e-6 and n.dtype == np.float32
assert np.allclose(p[:, 1:].sum(axis=1), 1, atol=1e-5)
PY
check "predict matches examples/load_numpy.py (classes equal, probabilities within 1e-5)" test $? -eq 0

# 3. eval against a direct computation: the numpy example's forward pass
"$TRAINERD" eval "$work/clf/model.safetensors" "{\"format\": \"csv\", \"path\": \"$work/test.csv\"}" --json \
	>"$work/e.json" --devices 2 --batch 50
check "eval --json exits 0" test $? -eq 0
echo "{\"format\": \"npy\", \"x\": \"$work/test_x.npy\", \"y\": \"$work/test_y.npy\"}" >"$work/npy-spec.json"
"$TRAINERD" eval "$work/clf/checkpoint.safetensors" "$work/npy-spec.json" >"$work/e.txt"
check "eval of the checkpoint, spec in a file, exits 0" test $? -eq 0
check "eval text shows accuracy" has "$work/e.txt" "^accuracy "
check "eval text shows the confusion matrix" has "$work/e.txt" "confusion matrix"
"$TRAINERD" eval "$work/reg/model.safetensors" "{\"format\": \"csv\", \"path\": \"$work/reg.csv\", \"label\": [-2, -1]}" \
	--json >"$work/r.json"
check "eval regression exits 0" test $? -eq 0
"$py" - "$work" <<'PY'
import json, sys
import numpy as np
sys.path.insert(0, "examples")
from load_numpy import load_model, forward, preprocess
w = sys.argv[1]
desc, t = load_model(f"{w}/clf/model.safetensors")
d = np.loadtxt(f"{w}/test.csv", delimiter=",")
z = forward(desc, t, preprocess(desc, d[:, :6])).astype(np.float64)
y = d[:, 6].astype(int)
lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
loss, acc = (lse - z[np.arange(len(y)), y]).mean(), (z.argmax(1) == y).mean()
e = json.load(open(f"{w}/e.json"))
assert e["samples"] == 257
assert abs(e["loss"] - loss) < 1e-5 * loss, (e["loss"], loss)
assert abs(e["accuracy"] - acc) < 1e-12, (e["accuracy"], acc)
cm = np.zeros((3, 3), int)
np.add.at(cm, (y, z.argmax(1)), 1)
assert e["confusion_matrix"] == cm.tolist(), (e["confusion_matrix"], cm)
s = json.load(open(f"{w}/clf/summary.json"))
assert abs(s["test_loss"] - loss) < 1e-5 * loss and abs(s["test_accuracy"] - acc) < 1e-12, s
desc, t = load_model(f"{w}/reg/model.safetensors")
d = np.loadtxt(f"{w}/reg.csv", delimiter=",")
p = forward(desc, t, preprocess(desc, d[:, :4])).astype(np.float64)
yt = d[:, 4:]
r = json.load(open(f"{w}/r.json"))
mse, mae = ((p - yt) ** 2).mean(), np.abs(p - yt).mean()
r2 = np.mean(1 - ((p - yt) ** 2).sum(0) / ((yt - yt.mean(0)) ** 2).sum(0))
assert abs(r["mse"] - mse) < 1e-4 * mse and abs(r["loss"] - mse) < 1e-4 * mse, (r, mse)
assert abs(r["mae"] - mae) < 1e-4 * mae, (r, mae)
assert abs(r["r2"] - r2) < 1e-5, (r, r2)
assert "accuracy" not in r
PY
check "eval figures equal a direct numpy computation (classification and regression)" test $? -eq 0

# 4. bad inputs: clear messages, exit 2
"$TRAINERD" predict "$work/clf/model.safetensors" "$work/wide.csv" --out "$work/w.csv" 2>"$work/err"
check "wrong feature count exits 2" test $? -eq 2
check "wrong feature count is named" grep -q "wide.csv: 7 features per sample, the model takes 6" "$work/err"
check "no half-written output" test ! -e "$work/w.csv" -a ! -e "$work/w.csv.tmp"
"$TRAINERD" eval "$work/clf/model.safetensors" "{\"format\": \"csv\", \"path\": \"$work/nope.csv\"}" 2>"$work/err"
check "missing data file exits 2" test $? -eq 2
check "missing data file is named" grep -q "nope.csv" "$work/err"
"$TRAINERD" predict "$work/missing.safetensors" "$work/test_x.csv" --out "$work/m.csv" 2>"$work/err"
check "missing model exits 2" test $? -eq 2
check "missing model is named" grep -q "missing.safetensors" "$work/err"
"$TRAINERD" eval "$work/clf/model.safetensors" '{"format": "csv"}' 2>"$work/err"
check "data spec without a path exits 2" test $? -eq 2
check "data spec error names its pointer" grep -q "DATA_SPEC: /path" "$work/err"
"$TRAINERD" predict "$work/clf/model.safetensors" "$work/test_x.csv" 2>"$work/err"
check "predict without --out exits 2" test $? -eq 2
"$TRAINERD" eval "$work/clf/model.safetensors" "{\"format\": \"csv\", \"path\": \"$work/test.csv\", \"label\": 0}" 2>"$work/err"
check "labels that are no class exit 2" test $? -eq 2
check "a bad label names its sample" grep -q "is not a class of this model (0 to 2)" "$work/err"
"$TRAINERD" eval --help >"$work/help" 2>&1
check "eval --help exits 0" test $? -eq 0
check "eval --help explains DATA_SPEC" grep -q "DATA_SPEC is a" "$work/help"
"$TRAINERD" predict --help >"$work/help" 2>&1
check "predict --help exits 0" test $? -eq 0

# 5. eval and predict open their devices as `trainerd run` and the daemon
#    do (tr_daemon_backend_open): a GPU that cannot be used (here a CUDA
#    module that does not exist, or no GPU at all) falls back to the CPU
#    devices asked for, with the same warning; --quiet drops it
TRAINERD_CUDA_MODULE=$work/no-such-module.so "$TRAINERD" predict "$work/clf/model.safetensors" "$work/test_x.csv" \
	--out "$work/f.csv" --devices 3 2>"$work/err"
check "predict without a usable GPU exits 0" test $? -eq 0
check "predict says it falls back, as trainerd run does" grep -q "no usable GPU: .*; using 3 CPU devices" "$work/err"
TRAINERD_CUDA_MODULE=$work/no-such-module.so "$TRAINERD" eval "$work/clf/model.safetensors" "$work/npy-spec.json" \
	--quiet >/dev/null 2>"$work/err"
check "eval --quiet without a usable GPU exits 0" test $? -eq 0
check "eval --quiet gives no fallback warning" test ! -s "$work/err"

finish
