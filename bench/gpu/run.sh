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

if [ ! -x "$BUILD/daemon/trainerd" ] || [ ! -f "$BUILD/engine/cuda/libtrengine_cuda.a" ]; then
	echo "bench-gpu: $BUILD is not a built -Dcuda=enabled build" >&2
	exit 1
fi
if ! "$BUILD/daemon/trainerd" --version | grep -q cuda; then
	echo "bench-gpu: no usable GPU: $("$BUILD/daemon/trainerd" --version)" >&2
	exit 1
fi

# Plain cc: meson's static libraries are thin archives, which nvcc's
# device linker cannot read.  cudart, cuBLAS and NCCL come from the CUDA
# toolkit next to nvcc, or from LIBRARY_PATH (tests/gpu/check.sh points it
# at pip's NCCL when the toolkit has none).
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_LIB=$(cd "$(dirname "$NVCC")/.." && pwd)/lib64
AR_BIN=$OUT/allreduce_bw
if ! cc -O2 -std=c11 -D_GNU_SOURCE -o "$AR_BIN" -I"$ROOT" "$ROOT/bench/gpu/allreduce_bw.c" \
	"$BUILD/engine/cuda/libtrengine_cuda.a" -L"$CUDA_LIB" -Wl,-rpath,"$CUDA_LIB" -lcudart -lcublas -lnccl \
	-lstdc++ -lpthread -lm 2>"$OUT/allreduce_build.log"; then
	echo "bench-gpu: allreduce_bw did not build (see $OUT/allreduce_build.log); skipping it" >&2
	AR_BIN=
fi

# shellcheck disable=SC2086  # QUICK is empty or one flag
exec python3 "$ROOT/bench/gpu/bench_gpu.py" --trainerd "$BUILD/daemon/trainerd" --out "$OUT" \
	${AR_BIN:+--allreduce "$AR_BIN"} $QUICK
