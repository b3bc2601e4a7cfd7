#!/usr/bin/env bash
# End-to-end checks of `trainerd run`: outputs, exit codes, error messages,
# Ctrl-C, and that the exported weights load with numpy alone.
# Usage: run_cli.sh PATH/TO/trainerd   (run from the repository root)
set -u
TRAINERD=${1:?usage: run_cli.sh TRAINERD}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
make_work
find_python

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
check "missing file exits 2" test $? -eq 2
check "missing file names pointer, file and directory" grep -qxF \
	"trainerd run: $work/missing.json: /data/train/path: 'no-such-file.csv': No such file or directory (relative paths resolve against the working directory, $(pwd -P))" \
	"$work/missing.err"

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

# 9. labels are checked when the data is opened, before any step
printf 'a,b,y\n1,2,0\n\n3,4,1\n5,6,16\n' >"$work/labels.csv"
cat >"$work/labels.json" <<JSON
{"model": {"layers": [{"type": "dense", "units": 10}]},
 "data": {"train": {"format": "csv", "path": "$work/labels.csv", "header": true}},
 "batch_size": 2, "epochs": 1, "optimizer": {"type": "sgd", "lr": 0.1}}
JSON
"$TRAINERD" run "$work/labels.json" --backend cpu --out "$work/f" 2>"$work/labels.err"
check "bad label exits 2" test $? -eq 2
check "bad label names pointer, file and line" grep -qxF \
	"trainerd run: $work/labels.json: /data/train: $work/labels.csv:5: label 16 is out of range: the model has 10 classes, 0 to 9" \
	"$work/labels.err"
printf '1,2,1\n3,4,1\n5,6,1\n' >"$work/one.csv"
"$TRAINERD" run "$work/labels.json" --backend cpu --set /data/train/path="$work/one.csv" --set /data/train/header=false \
	--out "$work/f" 2>"$work/one.err"
check "single-valued labels still train" test $? -eq 0
check "single-valued labels warn" grep -qxF \
	"trainerd: /data/train: all 3 labels are 1: a label column with a single value teaches nothing; is it the right column?" \
	"$work/one.err"

# 10. --help, and --set overrides spec fields by JSON pointer
"$TRAINERD" run --help >"$work/help.out" 2>&1
check "--help exits 0" test $? -eq 0
check "--help documents --set" grep -q -- "--set /POINTER=VALUE" "$work/help.out"
"$TRAINERD" run "$work/job.json" --backend cpu --devices 1 --quiet --out "$work/g" \
	--set /epochs=1 --set /optimizer/lr=3e-4 --set /name='"set-name"' 2>/dev/null
check "--set run exits 0" test $? -eq 0
check "--set /epochs=1 runs one epoch" grep -q '"epochs": 1,' "$work/g/summary.json"
check "--set /epochs=1 gives 8 steps" test "$(grep -c '"name":"loss"' "$work/g/metrics.jsonl")" -eq 8
check "--set /optimizer/lr=3e-4 sets the lr" grep -q '"name":"lr","value":0.000300000014' "$work/g/metrics.jsonl"
"$TRAINERD" run "$work/job.json" --set /epochs/x=3 --out "$work/g" 2>"$work/set.err"
check "--set through a number exits 2" test $? -eq 2
check "--set through a number names it" grep -qxF \
	"trainerd run: --set /epochs/x=3: /epochs is a number, not an object or array" "$work/set.err"
"$TRAINERD" run "$work/job.json" --set /model/layers/9/units=3 --out "$work/g" 2>"$work/set.err"
check "--set past an array's end exits 2" test $? -eq 2
check "--set past an array's end names it" grep -qxF \
	"trainerd run: --set /model/layers/9/units=3: /model/layers/9: no such element (the array has 4)" "$work/set.err"
"$TRAINERD" run "$work/job.json" --set /epoch=3 --out "$work/g" 2>"$work/set.err"
check "--set of an unknown field exits 2" test $? -eq 2
check "--set of an unknown field names it" grep -q "/epoch: unknown key 'epoch'" "$work/set.err"
"$TRAINERD" run "$work/job.json" --set epochs=3 --out "$work/g" 2>"$work/set.err"
check "--set without a pointer exits 2" test $? -eq 2

# 11. the progress display keeps one line per epoch, with validation figures
"$TRAINERD" run "$work/job.json" --backend cpu --devices 1 --out "$work/h" 2>"$work/progress.err"
check "progress run exits 0" test $? -eq 0
check "one summary line per epoch" test "$(grep -cE '^epoch [123]/3: loss [0-9.]+ val_loss [0-9.]+ val_acc [0-9.]+ elapsed [0-9]+:[0-9]{2} \(step (8|16|24)/24, [0-9]+ samples/s\)$' "$work/progress.err")" -eq 3
if command -v script >/dev/null; then
	# On a terminal the bar is redrawn in place, and the epoch lines stay.
	script -q -c "'$TRAINERD' run '$work/job.json' --backend cpu --devices 1 --out '$work/i'" /dev/null \
		>"$work/tty.out" 2>&1 </dev/null
	check "terminal run exits 0" test $? -eq 0
	check "terminal keeps one line per epoch" test "$(tr '\r' '\n' <"$work/tty.out" | grep -cE '^(.\[K)?epoch [123]/3: loss')" -eq 3
fi

# 12. --resume: a run stopped by SIGINT and resumed ends with the same
# weights, bit for bit, as one that was never interrupted
cat >"$work/resume.json" <<'JSON'
{"name": "resume", "seed": 7,
 "model": {"layers": [{"type": "dense", "units": 16}, {"type": "relu"}, {"type": "dropout", "rate": 0.1},
                      {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "synthetic", "samples": 4000, "features": 6, "classes": 3, "load_cost_us": 150},
          "validation_split": 0.1},
 "batch_size": 32, "epochs": 3, "optimizer": {"type": "adamw", "lr": 0.01}, "checkpoint": {"every_steps": 50}}
JSON
"$TRAINERD" run "$work/resume.json" --backend cpu --devices 2 --out "$work/full" --quiet 2>/dev/null
check "uninterrupted run exits 0" test $? -eq 0
"$TRAINERD" run "$work/resume.json" --backend cpu --devices 2 --out "$work/part" --quiet 2>/dev/null &
pid=$!
for _ in $(seq 300); do # until SIGINT is caught (see 7) and a few steps are done
	cgt=$(awk '/^SigCgt:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
	[ -n "$cgt" ] && (((16#$cgt >> 1) & 1)) && [ -s "$work/part/metrics.jsonl" ] && break
	sleep 0.05
done
sleep 0.3
kill -INT "$pid"
wait "$pid"
check "interrupted run exits 0" test $? -eq 0
check "interrupted run is stopped" grep -q '"state": "stopped"' "$work/part/summary.json"
check "interrupted run kept a checkpoint" test -s "$work/part/checkpoint.safetensors"
"$TRAINERD" run --resume "$work/part" --backend cpu --devices 2 --quiet 2>"$work/resume.err"
check "resumed run exits 0" test $? -eq 0
check "resumed run completes" grep -q '"state": "completed"' "$work/part/summary.json"
check "resumed weights are bit-identical" cmp -s "$work/full/model.safetensors" "$work/part/model.safetensors"
check "resumed losses are identical" test "$(grep '"name":"loss"' "$work/full/metrics.jsonl" | md5sum)" = \
	"$(grep '"name":"loss"' "$work/part/metrics.jsonl" | md5sum)"
"$TRAINERD" run --resume "$work/nowhere" --quiet 2>"$work/resume.err"
check "--resume of a missing directory exits 2" test $? -eq 2
check "--resume of a missing directory names its spec" grep -q "$work/nowhere/spec.json" "$work/resume.err"

# 8. version
"$TRAINERD" version | grep -q "^trainerd "
check "version prints" test $? -eq 0

finish
