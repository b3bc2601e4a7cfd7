#!/usr/bin/env bash
# tests/gpu/nccl_ranks.sh TRAINERD WORK GPUS [cuda|cpu]: GPU ranks
# (engine/comm_group.h, docs/design.md "Processes and the communicator")
# on the GPU machine.  An exact-mode MLP with a short last batch must end
# with the SHA-256 of model.safetensors of one GPU in the process's own
# way (no NCCL) when it goes through NCCL's cross-process path:
#   - one rank: TRAINERD_COMM_GROUP=1 makes a one-process job use the group
#     communicator (ncclGetUniqueId, ncclCommInitRankConfig of 1 rank, the
#     shard slots through ncclAllReduce, then the fold in shard order);
#   - with 2+ GPUs: the same on 2 devices of one process, 2 devices without
#     it (the in-process communicator), and 2 processes x 1 GPU through
#     mpirun where mpirun and the MPI module are there.
# `cpu` (the rehearsal, tests/gpu/skips.sh) runs the same comparisons on CPU
# devices, which have no group communicator: it checks the script.  Every
# run is bounded (60 s).  Prints PASS/FAIL/NOT RUN lines and a RESULT
# line; exits 1 on any FAIL.
set -u
TD=${1:?usage: nccl_ranks.sh TRAINERD WORK GPUS [cuda|cpu]}
WORK=${2:?}
GPUS=${3:?}
BACKEND=${4:-cuda}
mkdir -p "$WORK"
cat >"$WORK/job.json" <<'JSON'
{"name": "nccl-ranks", "seed": 11, "exact": {"shards": 8},
 "model": {"layers": [{"type": "dense", "units": 32}, {"type": "relu"}, {"type": "dropout", "rate": 0.1},
    {"type": "dense", "units": 5}]},
 "data": {"train": {"format": "synthetic", "samples": 230, "features": 12, "classes": 5}},
 "batch_size": 32, "epochs": 3, "optimizer": {"type": "adamw", "lr": 0.01}}
JSON
fails=0 passes=0

# run NAME ARGS...: one bounded run into $WORK/NAME; its SHA-256 on stdout
run() {
	local name=$1
	shift
	timeout 60 "$TD" run "$WORK/job.json" --backend "$BACKEND" --quiet --out "$WORK/$name" "$@" \
		>"$WORK/$name.log" 2>&1 && sha256sum "$WORK/$name/model.safetensors" | cut -d' ' -f1
}

# compare WHAT NAME ARGS...: the run's SHA-256 against the reference's
compare() {
	local what=$1 name=$2 got
	shift 2
	got=$(run "$name" "$@")
	if [ -z "$got" ]; then
		echo "FAIL $what: exit status not 0 ($(tail -1 "$WORK/$name.log"))"
		fails=$((fails + 1))
	elif [ "$got" != "$REF" ]; then
		echo "FAIL $what: SHA-256 $got, one device gives $REF"
		fails=$((fails + 1))
	else
		echo "PASS $what: the SHA-256 of one device"
		passes=$((passes + 1))
	fi
}

REF=$(run ref --devices 1)
if [ -z "$REF" ]; then
	echo "FAIL one device ($BACKEND): $(tail -1 "$WORK/ref.log")"
	echo "RESULT 0 passed, 1 failed"
	exit 1
fi
echo "reference: one $BACKEND device, SHA-256 $REF"
export TRAINERD_COMM_GROUP=1
compare "one rank through the group communicator" group1 --devices 1
if [ "$GPUS" -ge 2 ]; then
	compare "two devices of one process through the group communicator" group2 --devices 2
	unset TRAINERD_COMM_GROUP
	compare "two devices of one process" dev2 --devices 2
	if command -v mpirun >/dev/null && [ -e "$(dirname "$TD")/trainerd-mpi.so" ]; then
		OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
			compare "two processes x one device (mpirun, NCCL across processes)" procs2 --processes 2 --devices 1
	else
		echo "NOT RUN two processes x one device: no mpirun or no trainerd-mpi.so (a build without libopenmpi-dev)"
	fi
else
	echo "NOT RUN two devices, two processes: one GPU"
fi
echo "RESULT $passes passed, $fails failed"
[ "$fails" -eq 0 ]
