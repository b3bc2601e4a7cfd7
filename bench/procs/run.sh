#!/bin/sh
# bench/procs/run.sh BUILD_DIR: step time of 2 processes x 1 device against
# 1 process x 2 devices and 1 x 1, on the bench MLP and LeNet, with the
# gather between processes overlapped and not, under the benchmark
# protocol (bench/README.md, "Figures of record"; bench/procs/README.md).
#
# Needs a build with MPI (trainerd-mpi.so beside the executable) and
# Open MPI's mpirun (openmpi-bin).  Results:
# bench/results/procs-<timestamp>/ (results.md, results.json, runs/ with
# each trainerd run's outputs); bench/results/procs-latest points at the
# newest.  Extra driver arguments: BENCH_PROCS_ARGS, e.g.
# "--rounds 1 --steps 8" for a quick check.  Killed after 40 min (3 rounds
# take a few minutes on a quiet 2-core machine; waiting for a quiet
# machine takes up to --wait-s per round).
set -eu

BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
case $BUILD in /*) ;; *) BUILD=$(pwd)/$BUILD ;; esac
TRAINERD=$BUILD/daemon/trainerd
PYTHON=${PYTHON:-/usr/bin/python3}
if [ ! -x "$TRAINERD" ] || [ ! -e "$BUILD/daemon/trainerd-mpi.so" ]; then
	echo "bench/procs: $TRAINERD or its trainerd-mpi.so not found; build with libopenmpi-dev (meson setup $BUILD -Dbuildtype=release -Dcuda=disabled && ninja -C $BUILD)" >&2
	exit 1
fi
if ! command -v mpirun >/dev/null; then
	echo "bench/procs: mpirun not found; install openmpi-bin (scripts/install-deps.sh)" >&2
	exit 1
fi
# Open MPI refuses to start as root without these; ranks of one machine
# talk through shared memory.
if [ "$(id -u)" = 0 ]; then
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
RESULTS=$ROOT/bench/results
RUN=$RESULTS/procs-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
ln -sfn "$(basename "$RUN")" "$RESULTS/procs-latest"
# shellcheck disable=SC2086  # BENCH_PROCS_ARGS is a list of arguments
timeout 2400 "$PYTHON" "$ROOT/bench/procs/bench_procs.py" --trainerd "$TRAINERD" --out "$RUN" ${BENCH_PROCS_ARGS:-}
echo "bench/procs: results in $RUN" >&2
