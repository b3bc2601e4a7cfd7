#!/bin/sh
# bench/conv/run.sh BUILD_DIR: conv nets (LeNet-style, VDSR-style) against
# PyTorch, both CPU convolution routes (bench/conv/RESULTS.md).
#
# Compiles bench/conv/conv_rate.c (OpenBLAS, oneDNN, OpenMP; needs
# libdnnl-dev) and runs bench/conv/bench_conv.py with Debian's python3
# (python3-torch for the peer).  Results: bench/results/conv-<timestamp>/
# (results.md, results.json, runs/ with each trainerd run's outputs);
# bench/results/conv-latest points at the newest.  Extra driver arguments:
# BENCH_CONV_ARGS, e.g. "--rounds 1 --only lenet".  Killed after 40 min.
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
# shellcheck disable=SC2086  # BENCH_CONV_ARGS is a list of arguments
timeout 2400 "$PYTHON" "$ROOT/bench/conv/bench_conv.py" --trainerd "$TRAINERD" --conv-rate "$RUN/conv_rate" \
	--out "$RUN" ${BENCH_CONV_ARGS:-}
echo "bench/conv: results in $RUN" >&2
