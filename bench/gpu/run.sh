#!/bin/sh
# bench/gpu/run.sh BUILD OUTDIR [--quick]
#
# GPU benchmarks of a -Dcuda=enabled build (see bench/gpu/bench_gpu.py):
# trainerd --backend cuda on the two MLPs, the PyTorch peer on the same
# GPU, and with 2 or more GPUs the allreduce bandwidth probe
# (bench/gpu/allreduce_bw.c, built with the module by bench/gpu/meson.build).
# Needs a GPU; on a machine without one it stops at once.
set -eu

BUILD=${1:?usage: bench/gpu/run.sh BUILD OUTDIR [--quick]}
OUT=${2:?usage: bench/gpu/run.sh BUILD OUTDIR [--quick]}
QUICK=${3:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
case $BUILD in /*) ;; *) BUILD=$(pwd)/$BUILD ;; esac
mkdir -p "$OUT"

if [ ! -x "$BUILD/daemon/trainerd" ] || [ ! -f "$BUILD/daemon/trainerd-cuda.so" ]; then
	echo "bench-gpu: $BUILD is not a built -Dcuda=enabled build" >&2
	exit 1
fi
if ! "$BUILD/daemon/trainerd" --version | grep -q cuda; then
	echo "bench-gpu: no usable GPU: $("$BUILD/daemon/trainerd" --version)" >&2
	exit 1
fi

# The allreduce probe is part of the build (bench/gpu/meson.build); it
# loads the CUDA module (engine/cuda/module.h) named by TRAINERD_CUDA_MODULE.
export TRAINERD_CUDA_MODULE="$BUILD/daemon/trainerd-cuda.so"
AR_BIN=$BUILD/bench/gpu/allreduce_bw
if [ ! -x "$AR_BIN" ]; then
	echo "bench-gpu: $AR_BIN was not built (ninja -C $BUILD bench/gpu/allreduce_bw); no allreduce figures" >&2
	AR_BIN=
fi

# shellcheck disable=SC2086  # QUICK is empty or one flag
exec python3 "$ROOT/bench/gpu/bench_gpu.py" --trainerd "$BUILD/daemon/trainerd" --out "$OUT" \
	${AR_BIN:+--allreduce "$AR_BIN"} $QUICK
