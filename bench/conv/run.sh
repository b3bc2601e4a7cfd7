#!/bin/sh
# bench/conv/run.sh BUILD_DIR: the four target workloads (LeNet-style,
# VDSR-style, the 24x24 patch net, the 784-1024-1024-10 MLP) against
# PyTorch, every CPU convolution route, and exact mode against the float
# path on LeNet, VDSR and the MLP (the "exact" arm), under the benchmark
# protocol (bench/README.md, "Figures of record"; bench/conv/RESULTS.md).
#
# Compiles bench/conv/conv_rate.c (OpenBLAS, oneDNN, OpenMP; needs
# libdnnl-dev) and bench/sgemm_rate.c, and runs bench/conv/bench_conv.py
# with Debian's python3 (python3-torch for the peer).  Results:
# bench/results/conv-<timestamp>/ (results.md, results.json, runs/ with each
# trainerd run's outputs); bench/results/conv-latest points at the newest.
# Extra driver arguments: BENCH_CONV_ARGS, e.g. "--rounds 3 --only lenet".
# Killed after 40 min (5 rounds take an estimated 9 minutes on a quiet 2-core
# machine; waiting for a quiet machine takes up to --wait-s per round).
set -eu

BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
case $BUILD in /*) ;; *) BUILD=$(pwd)/$BUILD ;; esac
TRAINERD=$BUILD/daemon/trainerd
PYTHON=${PYTHON:-/usr/bin/python3}
if [ ! -x "$TRAINERD" ]; then
	echo "bench/conv: $TRAINERD not found; build first (meson setup $BUILD -Dbuildtype=release -Dcuda=disabled && ninja -C $BUILD)" >&2
	exit 1
fi
if ! "$TRAINERD" version | grep -q onednn; then
	echo "bench/conv: $TRAINERD has no oneDNN route; install libdnnl-dev (scripts/install-deps.sh) and rebuild" >&2
	exit 1
fi
RESULTS=$ROOT/bench/results
RUN=$RESULTS/conv-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
ln -sfn "$(basename "$RUN")" "$RESULTS/conv-latest"
# shellcheck disable=SC2046  # pkg-config output is meant to be split
cc -O2 -std=c11 -Wall -Wextra -fopenmp -o "$RUN/conv_rate" "$ROOT/bench/conv/conv_rate.c" \
	$(pkg-config --cflags --libs openblas) -ldnnl
# shellcheck disable=SC2046
cc -O2 -std=c11 -Wall -Wextra -o "$RUN/sgemm_rate" "$ROOT/bench/sgemm_rate.c" $(pkg-config --cflags --libs openblas)
# shellcheck disable=SC2086  # BENCH_CONV_ARGS is a list of arguments
timeout 2400 "$PYTHON" "$ROOT/bench/conv/bench_conv.py" --trainerd "$TRAINERD" --conv-rate "$RUN/conv_rate" \
	--sgemm "$RUN/sgemm_rate" --out "$RUN" ${BENCH_CONV_ARGS:-}
echo "bench/conv: results in $RUN" >&2
