#!/usr/bin/env bash
# Training across processes (docs/design.md, "Processes and the
# communicator"): `trainerd run --processes P --devices D` through mpirun
# gives model.safetensors the same SHA-256, and the same reported losses
# and validation figures, as one process on one device, for processes x
# devices in {2x1, 2x2, 3x1, 4x1}, on an MLP and on a conv net with
# batchnorm2d (whose statistics cross processes too), each with a short
# last batch; a run resumed on another process count ends with the same
# bits; bad values are refused naming the field; GPU ranks without a GPU
# fail naming the missing driver.  3x1 is the resumed runs' count (from
# step 4 on: a launch less per job).  The MLP's 2x1 and 3x1 gather in
# buckets beside the backward pass, its 4x1 with "overlap": false after
# it, and comm_ms and comm_wait_ms tell them apart.  Open MPI's settings
# for running as root and for more ranks than cores are this test's alone.
# Usage: processes_bits.sh PATH/TO/trainerd   (run from the repository root)
set -u
TRAINERD=${1:?usage: processes_bits.sh TRAINERD}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if [ ! -e "$(dirname "$TRAINERD")/trainerd-mpi.so" ] || ! command -v mpirun >/dev/null; then
	echo "processes_bits: skipped, needs a build with MPI (libopenmpi-dev) and mpirun (openmpi-bin)"
	exit 77
fi
make_work
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# shared memory between ranks of one machine; no network probing
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
. "$(dirname "${BASH_SOURCE[0]}")/mpi_sanitizer_env.sh"

cat >"$work/mlp.json" <<'JSON'
{"name": "procs-mlp", "seed": 7, "exact": true,
 "model": {"layers": [{"type": "dense", "units": 24}, {"type": "relu"}, {"type": "dense", "units": 4}]},
 "data": {"train": {"format": "synthetic", "samples": 150, "features": 6, "classes": 4}, "validation_split": 0.2},
 "batch_size": 32, "epochs": 2, "optimizer": {"type": "adamw", "lr": 0.01}}
JSON
cat >"$work/bn.json" <<'JSON'
{"name": "procs-bn", "seed": 5, "exact": {"shards": 8}, "cpu_conv": "im2col",
 "model": {"inputs": [2, 6, 6], "layers": [{"type": "conv2d", "filters": 4, "kernel": 3, "padding": 1},
    {"type": "batchnorm2d"}, {"type": "relu"}, {"type": "maxpool2d", "kernel": 2},
    {"type": "flatten"}, {"type": "dense", "units": 3}]},
 "data": {"train": {"format": "synthetic", "samples": 67, "shape": [2, 6, 6], "classes": 3}, "validation_split": 0.1},
 "batch_size": 16, "epochs": 2, "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9}}
JSON

sha() { sha256sum "$1" | cut -d' ' -f1; }
figures() { grep -E '"name":"(loss|val_loss|val_accuracy)"' "$1" | md5sum; }
run() { timeout 120 "$TRAINERD" run "$@" --backend cpu --quiet; }

for job in mlp bn; do
	run "$work/$job.json" --devices 1 --out "$work/$job-1x1" 2>"$work/$job-1x1.err"
	check "$job: one process exits 0" test $? -eq 0
	one=$(sha "$work/$job-1x1/model.safetensors")
	for pd in 2x1 2x2 4x1; do
		serial=()
		[ "$job$pd" = mlp4x1 ] && serial=(--set '/exact={"shards": 8, "overlap": false}')
		run "$work/$job.json" --processes "${pd%x*}" --devices "${pd#*x}" --out "$work/$job-$pd" "${serial[@]}" \
			2>"$work/$job-$pd.err"
		check "$job: $pd exits 0" test $? -eq 0
		check "$job: $pd gives the SHA-256 of 1x1" test "$(sha "$work/$job-$pd/model.safetensors")" = "$one"
		check "$job: $pd gives the losses of 1x1" test "$(figures "$work/$job-$pd/metrics.jsonl")" = \
			"$(figures "$work/$job-1x1/metrics.jsonl")"
		check "$job: $pd ran ${pd%x*} processes" grep -q "\"processes\": ${pd%x*}" "$work/$job-$pd/summary.json"
	done
done
check "validation figures are recorded" grep -q '"name":"val_loss"' "$work/bn-2x1/metrics.jsonl"

# comm_ms and comm_wait_ms of each logged step: overlapped, the step also
# spent time starting and testing buckets (comm_ms > comm_wait_ms); not
# overlapped, all of it was the wait.
comm() { # comm RUN_DIR: "<comm_ms> <comm_wait_ms>" per logged step
	python3 -c 'import json, sys
m = {}
for line in open(sys.argv[1]):
    p = json.loads(line)
    if p["name"] in ("comm_ms", "comm_wait_ms"):
        m.setdefault(p["step"], {})[p["name"]] = p["value"]
for s in sorted(m):
    print(m[s].get("comm_ms", -1), m[s].get("comm_wait_ms", -1))' "$1/metrics.jsonl"
}
check "mlp 2x1: comm_ms and comm_wait_ms at every logged step" test "$(comm "$work/mlp-2x1" | wc -l)" -ge 8
check "mlp 2x1 (overlapped): comm_ms > comm_wait_ms >= 0 at every step" \
	test -z "$(comm "$work/mlp-2x1" | awk '!($1 > $2 && $2 >= 0)')"
check "mlp 4x1 (\"overlap\": false): comm_ms = comm_wait_ms > 0 at every step" \
	test -z "$(comm "$work/mlp-4x1" | awk '!($1 == $2 && $2 > 0)')"
check "mlp 4x1: the run's totals in summary.json" grep -q '"comm_wait_ms"' "$work/mlp-4x1/summary.json"

# Resume on another process count: 2 processes for 3 steps, then 3
# processes x 1 device to the end, gives the one-process run's bits.
for job in mlp bn; do
	run "$work/$job.json" --processes 2 --out "$work/$job-r" --set /max_steps=3 2>/dev/null
	check "$job: first part exits 0" test $? -eq 0
	check "$job: first part stopped at step 3" grep -q '"steps": 3' "$work/$job-r/summary.json"
	run --resume "$work/$job-r" --set /max_steps=1000 --processes 3 --devices 1 2>"$work/$job-r.err"
	check "$job: resumed on 3 processes exits 0" test $? -eq 0
	check "$job: resumed on 3 processes, the same SHA-256" test "$(sha "$work/$job-r/model.safetensors")" = \
		"$(sha "$work/$job-1x1/model.safetensors")"
done

# SIGTERM to `trainerd run --processes 2` mid-run: every rank stops after
# the same step, process 0 keeps the checkpoint of that step, the exit
# status is 0 and no rank is left; resumed on 3 processes the run ends
# with the uninterrupted one-process bits.  Loading is slowed so that the
# signal lands mid-run.
cat >"$work/slow.json" <<'JSON'
{"name": "procs-slow", "seed": 3, "exact": true,
 "model": {"layers": [{"type": "dense", "units": 16}, {"type": "relu"}, {"type": "dense", "units": 4}]},
 "data": {"train": {"format": "synthetic", "samples": 1600, "features": 8, "classes": 4, "load_cost_us": 1000}},
 "batch_size": 32, "epochs": 1, "optimizer": {"type": "adamw", "lr": 0.01}}
JSON
run "$work/slow.json" --devices 1 --out "$work/slow-1x1" 2>/dev/null
check "slow: one process exits 0" test $? -eq 0
("$TRAINERD" run "$work/slow.json" --processes 2 --out "$work/slow-t" --backend cpu --quiet 2>"$work/slow-t.err") &
pid=$!
(sleep 60 && kill -KILL $pid 2>/dev/null) & # bounds the wait below
watchdog=$!
for _ in $(seq 100); do # at most 10 s
	n=$(grep -c '"name":"loss"' "$work/slow-t/metrics.jsonl" 2>/dev/null)
	[ "${n:-0}" -ge 3 ] && break
	sleep 0.1
done
kill -TERM $pid
wait $pid
check "SIGTERM: exit 0" test $? -eq 0
kill $watchdog 2>/dev/null
check "SIGTERM: the run says stopped" grep -q '"state": "stopped"' "$work/slow-t/summary.json"
steps=$(sed -n 's/.*"steps": \([0-9]*\).*/\1/p' "$work/slow-t/summary.json")
check "SIGTERM: stopped mid-run (step $steps of 50)" test "${steps:-0}" -ge 3 -a "${steps:-50}" -lt 50
check "SIGTERM: a checkpoint" test -s "$work/slow-t/checkpoint.safetensors"
check "SIGTERM: no rank left" test -z "$(pgrep -f -- "--out $work/slow-t")"
run --resume "$work/slow-t" --processes 3 2>/dev/null
check "SIGTERM: resumed on 3 processes exits 0" test $? -eq 0
check "SIGTERM: resumed, the uninterrupted SHA-256" test "$(sha "$work/slow-t/model.safetensors")" = \
	"$(sha "$work/slow-1x1/model.safetensors")"

# A rank that dies or hangs ends the whole group: after SIGKILL of one
# rank, or SIGSTOP of one with collective_timeout_s 2, the run fails
# within bounds and leaves no process behind.
for how in KILL STOP; do
	("$TRAINERD" run "$work/slow.json" --processes 2 --set /collective_timeout_s=2 --out "$work/fail-$how" \
		--backend cpu --quiet 2>"$work/fail-$how.err") &
	pid=$!
	(sleep 60 && kill -KILL $pid 2>/dev/null) &
	watchdog=$!
	for _ in $(seq 100); do
		n=$(grep -c '"name":"loss"' "$work/fail-$how/metrics.jsonl" 2>/dev/null)
		[ "${n:-0}" -ge 3 ] && break
		sleep 0.1
	done
	launcher=$(pgrep -P $pid | head -1)            # mpirun
	rank=$(pgrep -P "${launcher:-0}" | tail -1) # one of its ranks
	t0=$(date +%s)
	[ -n "$rank" ] && kill -"$how" "$rank"
	wait $pid
	rc=$?
	t1=$(date +%s)
	kill $watchdog 2>/dev/null
	check "$how of one rank: found it" test -n "$rank"
	check "$how of one rank: the run fails" test $rc -ne 0
	check "$how of one rank: within 30 s ($((t1 - t0)) s)" test $((t1 - t0)) -le 30
	check "$how of one rank: no process left" test -z "$(pgrep -f -- "--out $work/fail-$how")"
done
check "the timeout is named" grep -q 'no step finished in 2 s (collective_timeout_s)' "$work/fail-STOP.err"
run "$work/mlp.json" --set /collective_timeout_s=0 --out "$work/bad7" 2>"$work/bad7.err"
check "\"collective_timeout_s\": 0: exit 2 naming it" grep -q '/collective_timeout_s' "$work/bad7.err"

# Bad values: refused before any rank starts, naming the field.
run "$work/mlp.json" --set /exact=false --processes 2 --out "$work/bad1" 2>"$work/bad1.err"
check "--processes 2 without exact mode: exit 2" test $? -eq 2
check "... naming /processes and exact mode" grep -q '/processes: more than one process needs exact mode' \
	"$work/bad1.err"
run "$work/mlp.json" --set /exact=false --set /processes=2 --out "$work/bad2" 2>"$work/bad2.err"
check "\"processes\": 2 without exact mode: exit 2" test $? -eq 2
check "... naming /processes" grep -q '/processes' "$work/bad2.err"
run "$work/mlp.json" --set /processes=0 --out "$work/bad3" 2>"$work/bad3.err"
check "\"processes\": 0: exit 2" test $? -eq 2
check "... naming /processes" grep -q '/processes' "$work/bad3.err"
run "$work/mlp.json" --processes 0 --out "$work/bad4" 2>"$work/bad4.err"
check "--processes 0: exit 2" test $? -eq 2
check "... naming --processes" grep -q -- '--processes' "$work/bad4.err"
TRAINERD_MPIRUN=/nonexistent/mpirun run "$work/mlp.json" --processes 2 --out "$work/bad5" 2>"$work/bad5.err"
check "a missing launcher: exit 1" test $? -eq 1
check "... naming it" grep -q '/nonexistent/mpirun' "$work/bad5.err"
TRAINERD_MPI_MODULE=/nonexistent/trainerd-mpi.so run "$work/mlp.json" --processes 2 --out "$work/bad6" \
	2>"$work/bad6.err"
check "no MPI module: exit 1 before any rank starts" test $? -eq 1
check "... naming it" grep -q 'MPI module /nonexistent/trainerd-mpi.so does not exist' "$work/bad6.err"

# GPU ranks on a machine without a GPU: every rank fails at its backend
# naming the cause, and the group ends with no rank left.
if [ ! -e /dev/nvidiactl ]; then
	timeout 120 "$TRAINERD" run "$work/mlp.json" --processes 2 --backend cuda --quiet --out "$work/nogpu" \
		2>"$work/nogpu.err"
	rc=$?
	check "--backend cuda without a GPU: the run fails (exit $rc)" test $rc -ne 0 -a $rc -ne 124
	check "... naming the missing driver" grep -q '/backend: .*no NVIDIA driver' "$work/nogpu.err"
	check "... no rank left" test -z "$(pgrep -f -- "--out $work/nogpu")"
fi

finish
