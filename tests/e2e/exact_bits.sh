#!/usr/bin/env bash
# Exact mode (docs/design.md, "Exact mode"; "exact": true or {"shards": S}):
# model.safetensors has the same SHA-256 on 1, 2, 3, 4 and 8 CPU devices for an MLP, a conv net, a
# batchnorm2d net (one inside a residual block) and a dropout net, each
# with a short last batch (one with fewer rows than shards, so that shards
# and devices are idle); the reported losses and validation figures are
# the same too; a run resumed on another device count ends with the same
# bits; and with "exact": false the device count does change the bits (so
# the comparison can fail), which is also the default.
# Usage: exact_bits.sh PATH/TO/trainerd   (run from the repository root)
set -u
TRAINERD=${1:?usage: exact_bits.sh TRAINERD}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
make_work

cat >"$work/mlp.json" <<'JSON'
{"name": "exact-mlp", "seed": 7, "exact": true,
 "model": {"layers": [{"type": "dense", "units": 24}, {"type": "relu"}, {"type": "dense", "units": 4}]},
 "data": {"train": {"format": "synthetic", "samples": 150, "features": 6, "classes": 4}, "validation_split": 0.2},
 "batch_size": 32, "epochs": 2, "optimizer": {"type": "adamw", "lr": 0.01}}
JSON
cat >"$work/conv.json" <<'JSON'
{"name": "exact-conv", "seed": 3, "exact": {"shards": 8},
 "model": {"inputs": [1, 8, 8], "layers": [{"type": "conv2d", "filters": 4, "kernel": 3, "padding": 1}, {"type": "relu"},
    {"type": "maxpool2d", "kernel": 2}, {"type": "flatten"}, {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "synthetic", "samples": 67, "shape": [1, 8, 8], "classes": 3}},
 "batch_size": 16, "epochs": 2, "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9}}
JSON
cat >"$work/bn.json" <<'JSON'
{"name": "exact-bn", "seed": 5, "exact": {"shards": 8},
 "model": {"inputs": [2, 6, 6], "layers": [{"type": "conv2d", "filters": 4, "kernel": 3, "padding": 1},
    {"type": "batchnorm2d"}, {"type": "relu"},
    {"type": "residual", "layers": [{"type": "conv2d", "filters": 4, "kernel": 3, "padding": 1}, {"type": "batchnorm2d"}]},
    {"type": "global_avg_pool"}, {"type": "flatten"}, {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "synthetic", "samples": 67, "shape": [2, 6, 6], "classes": 3}, "validation_split": 0.1},
 "batch_size": 16, "epochs": 2, "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9}}
JSON
cat >"$work/dropout.json" <<'JSON'
{"name": "exact-dropout", "seed": 11, "exact": {"shards": 6},
 "model": {"layers": [{"type": "dense", "units": 16}, {"type": "gelu"}, {"type": "dropout", "rate": 0.3},
                      {"type": "layernorm"}, {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "synthetic", "samples": 90, "features": 5, "classes": 3}},
 "batch_size": 20, "epochs": 2, "optimizer": {"type": "adam", "lr": 0.01}}
JSON

sha() { sha256sum "$1" | cut -d' ' -f1; }
# the figures a user reads: loss and validation, with their steps
figures() { grep -E '"name":"(loss|val_loss|val_accuracy)"' "$1" | md5sum; }

for job in mlp conv bn dropout; do
	for d in 1 2 3 4 8; do
		"$TRAINERD" run "$work/$job.json" --backend cpu --devices "$d" --out "$work/$job-$d" --quiet 2>"$work/$job-$d.err"
		check "$job on $d devices exits 0" test $? -eq 0
	done
	one=$(sha "$work/$job-1/model.safetensors")
	for d in 2 3 4 8; do
		check "$job: the same SHA-256 on $d devices as on 1" test "$(sha "$work/$job-$d/model.safetensors")" = "$one"
		check "$job: the same losses on $d devices as on 1" test "$(figures "$work/$job-$d/metrics.jsonl")" = \
			"$(figures "$work/$job-1/metrics.jsonl")"
	done
done
check "validation figures are recorded" grep -q '"name":"val_loss"' "$work/bn-1/metrics.jsonl"

# Resume on another device count: 3 devices for 4 steps, then 2 devices
# to the end, gives the uninterrupted 1-device run's bits.
for job in mlp bn; do
	"$TRAINERD" run "$work/$job.json" --backend cpu --devices 3 --out "$work/$job-r" --set /max_steps=4 --quiet 2>/dev/null
	check "$job: first part exits 0" test $? -eq 0
	"$TRAINERD" run --resume "$work/$job-r" --set /max_steps=1000 --backend cpu --devices 2 --quiet 2>"$work/$job-r.err"
	check "$job: resumed part exits 0" test $? -eq 0
	check "$job: resumed on 2 devices, the same SHA-256" test "$(sha "$work/$job-r/model.safetensors")" = \
		"$(sha "$work/$job-1/model.safetensors")"
	check "$job: no warning that the result differs" test ! -s "$work/$job-r.err"
done

# The float path: the device count changes the bits (else this test could
# not tell exact mode from a run that ignores it).
for d in 1 3; do
	"$TRAINERD" run "$work/mlp.json" --set /exact=false --backend cpu --devices "$d" --out "$work/float-$d" --quiet 2>/dev/null
done
check "exact: false differs between 1 and 3 devices" test "$(sha "$work/float-1/model.safetensors")" != \
	"$(sha "$work/float-3/model.safetensors")"
check "the run's spec says exact with 8 shards" grep -q '"shards": 8' "$work/mlp-1/spec.json"
sed 's/"exact": true,//' "$work/mlp.json" >"$work/default.json"
"$TRAINERD" run "$work/default.json" --set /max_steps=1 --backend cpu --devices 1 --out "$work/default" --quiet 2>/dev/null
check "exact is off by default" grep -q '"exact": false' "$work/default/spec.json"

finish
