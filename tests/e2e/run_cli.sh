#!/usr/bin/env bash
# End-to-end checks of `trainerd run`: outputs, exit codes, error messages,
# Ctrl-C, and that the exported weights load with numpy alone.
# Usage: run_cli.sh PATH/TO/trainerd   (run from the repository root)
set -u
TRAINERD=${1:?usage: run_cli.sh TRAINERD}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0
fail=0
check() { # check NAME CONDITION...
	local name=$1
	shift
	if "$@"; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "FAIL: $name" >&2
	fi
}

py=/usr/bin/python3
[ -x "$py" ] || py=python3

cat >"$work/job.json" <<'JSON'
{"name": "e2e", "seed": 4,
 "model": {"layers": [{"type": "dense", "units": 16}, {"type": "relu"}, {"type": "dropout", "rate": 0.1},
                      {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "synthetic", "samples": 300, "features": 5, "classes": 3},
          "validation_split": 0.2},
 "batch_size": 32, "epochs": 3, "optimizer": {"type": "adamw", "lr": 0.01},
 "monitors": [{"metric": "grad_norm", "every_steps": 2}]}
JSON

# 1. a normal run writes the three outputs
"$TRAINERD" run "$work/job.json" --backend cpu --devices 3 --out "$work/a" --quiet 2>"$work/a.err"
check "run exits 0" test $? -eq 0
check "model.safetensors written" test -s "$work/a/model.safetensors"
check "summary says completed" grep -q '"state": "completed"' "$work/a/summary.json"
check "metrics have loss per step" test "$(grep -c '"name":"loss"' "$work/a/metrics.jsonl")" -eq 24
check "grad_norm monitor recorded" test "$(grep -c '"name":"grad_norm"' "$work/a/metrics.jsonl")" -eq 12
check "val_accuracy recorded" grep -q '"name":"val_accuracy"' "$work/a/metrics.jsonl"

# 2. the weights load with numpy alone and equal the file's declared shapes
if "$py" -c 'import numpy' 2>/dev/null; then
	"$py" - "$work/a/model.safetensors" <<'PY'
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
meta = header.pop("__metadata__")
assert meta["format"] == "pt", meta
names = sorted(header)
assert names == ["0.bias", "0.weight", "3.bias", "3.weight"], names
for name, e in header.items():
    b, end = e["data_offsets"]
    a = np.frombuffer(raw[8 + n + b:8 + n + end], dtype="<f4").reshape(e["shape"])
    assert np.all(np.isfinite(a)), name
assert header["0.weight"]["shape"] == [16, 5]
assert header["3.weight"]["shape"] == [3, 16]
PY
	check "safetensors loads with numpy" test $? -eq 0
fi

# 3. device count does not change the result (1 vs 3 devices)
"$TRAINERD" run "$work/job.json" --backend cpu --devices 1 --out "$work/b" --quiet 2>/dev/null
"$py" - "$work/a/metrics.jsonl" "$work/b/metrics.jsonl" <<'PY'
import json, sys
def losses(p):
    return [json.loads(l)["value"] for l in open(p) if '"name":"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) > 0
for x, y in zip(a, b):
    assert abs(x - y) <= 1e-4 * max(abs(x), abs(y), 1e-3), (x, y)
PY
check "1 and 3 devices give the same losses" test $? -eq 0

# 4. a bad spec exits 2 and names the JSON pointer
sed 's/"lr": 0.01/"lr": -1/' "$work/job.json" >"$work/bad.json"
"$TRAINERD" run "$work/bad.json" --out "$work/c" 2>"$work/bad.err"
check "bad spec exits 2" test $? -eq 2
check "bad spec names /optimizer/lr" grep -q "/optimizer/lr" "$work/bad.err"

# 5. a missing data file fails with its name
cat >"$work/missing.json" <<'JSON'
{"model": {"layers": [{"type": "dense", "units": 2}]},
 "data": {"train": {"format": "csv", "path": "no-such-file.csv"}},
 "batch_size": 4, "epochs": 1, "optimizer": {"type": "sgd", "lr": 0.1}}
JSON
"$TRAINERD" run "$work/missing.json" --out "$work/d" 2>"$work/missing.err"
check "missing file exits non-zero" test $? -ne 0
check "missing file is named" grep -q "no-such-file.csv" "$work/missing.err"

# 6. malformed JSON names line and column
printf '{\n  "seed": 1,\n  "model": }\n' >"$work/syntax.json"
"$TRAINERD" run "$work/syntax.json" 2>"$work/syntax.err"
check "syntax error exits 2" test $? -eq 2
check "syntax error names line 3" grep -q "syntax.json:3:" "$work/syntax.err"

# 7. SIGINT stops after the current step and still writes the outputs
cat >"$work/long.json" <<'JSON'
{"name": "long", "model": {"layers": [{"type": "dense", "units": 8}, {"type": "relu"}, {"type": "dense", "units": 2}]},
 "data": {"train": {"format": "synthetic", "samples": 100000, "features": 4, "classes": 2, "load_cost_us": 200}},
 "batch_size": 64, "epochs": 5, "optimizer": {"type": "sgd", "lr": 0.1}, "prefetch": {"workers": 2, "depth": 2}}
JSON
"$TRAINERD" run "$work/long.json" --out "$work/e" --quiet 2>/dev/null &
pid=$!
# A background job of a non-interactive shell starts with SIGINT ignored
# until trainerd installs its handler: wait (bounded) until the process
# catches SIGINT (bit 1 of SigCgt), then give it time to be training.
for _ in $(seq 300); do
	cgt=$(awk '/^SigCgt:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
	[ -n "$cgt" ] && (((16#$cgt >> 1) & 1)) && break
	sleep 0.1
done
sleep 1.5
kill -INT "$pid"
start=$(date +%s%N)
wait "$pid"
rc=$?
took_ms=$((($(date +%s%N) - start) / 1000000))
check "SIGINT exits 0" test "$rc" -eq 0
check "SIGINT writes summary stopped" grep -q '"state": "stopped"' "$work/e/summary.json"
check "SIGINT writes weights" test -s "$work/e/model.safetensors"
check "SIGINT exits within a second" test "$took_ms" -lt 1000

# 8. version
"$TRAINERD" version | grep -q "^trainerd "
check "version prints" test $? -eq 0

echo "RESULT: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
