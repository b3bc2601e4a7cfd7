#!/bin/sh
# bench/gpu/run.sh BUILD OUTDIR [--quick]
#
# GPU benchmarks of a -Dcuda=enabled build (see bench/gpu/bench_gpu.py):
# trainerd --backend cuda on the two MLPs, the PyTorch peer on the same
# GPU, and with 2 or more GPUs the allreduce bandwidth probe, which this
# script builds first (bench/gpu/allreduce_bw.c against BUILD's engine
# libraries).  Needs a GPU; on a machine without one it stops at once.
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

# Plain cc against the engine library, which loads the CUDA module
# (engine/cuda/module.h) named by TRAINERD_CUDA_MODULE: allreduce_bw links
# no CUDA library itself.
export TRAINERD_CUDA_MODULE="$BUILD/daemon/trainerd-cuda.so"
AR_BIN=$OUT/allreduce_bw
if ! cc -O2 -std=c11 -D_GNU_SOURCE -o "$AR_BIN" -I"$ROOT" "$ROOT/bench/gpu/allreduce_bw.c" \
	"$BUILD/engine/libtrengine.a" -ldl -lpthread -lm 2>"$OUT/allreduce_build.log"; then
	echo "bench-gpu: allreduce_bw did not build (see $OUT/allreduce_build.log); skipping it" >&2
	AR_BIN=
fi

# shellcheck disable=SC2086  # QUICK is empty or one flag
exec python3 "$ROOT/bench/gpu/bench_gpu.py" --trainerd "$BUILD/daemon/trainerd" --out "$OUT" \
	${AR_BIN:+--allreduce "$AR_BIN"} $QUICK
