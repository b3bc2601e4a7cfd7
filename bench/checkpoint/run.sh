#!/bin/sh
# bench/checkpoint/run.sh BUILD_DIR: checkpoint write throughput and the
# step-time overhead of periodic checkpoints (bench/checkpoint/RESULTS.md).
#
# Compiles bench/checkpoint/ckpt_store.c against BUILD_DIR's static
# storage library (libtrstore.a + sqlite3 + jansson + pthread), then runs
# bench/checkpoint/bench_ckpt.py, which starts a fresh `trainerd serve`
# (loopback, port 0) with a fresh state directory for every job and stops
# it by pid.  State directories live under the results directory and are
# deleted as soon as each run is read (a 1 GB checkpoint needs ~1.1 GB of
# disk; the daemon peaks at ~3.5 GB of memory for it).
#
# Results: bench/results/checkpoint-<timestamp>/ (summary.md,
# results.json, raw/ with every job's spec, log lines and step_ms series,
# dd outputs, daemon logs); bench/results/checkpoint-latest points at the
# newest.  Bounded: about 4-6 minutes on the 2-core machine; the driver is
# killed after 12 minutes.  Extra driver arguments: BENCH_CKPT_ARGS, e.g.
# "--rounds 1" or "--only overhead".
set -eu

BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
case $BUILD in /*) ;; *) BUILD=$(pwd)/$BUILD ;; esac
TRAINERD=$BUILD/daemon/trainerd
PYTHON=${PYTHON:-/usr/bin/python3}

if [ ! -x "$TRAINERD" ] || [ ! -f "$BUILD/storage/libtrstore.a" ]; then
	echo "bench/checkpoint: $TRAINERD or $BUILD/storage/libtrstore.a not found; build first (meson setup $BUILD -Dbuildtype=release -Dcuda=disabled && ninja -C $BUILD)" >&2
	exit 1
fi
bt=$(sed -n 's/.*"name": "buildtype", "value": "\([a-z]*\)".*/\1/p' "$BUILD/meson-info/intro-buildoptions.json" 2>/dev/null || true)
if [ -n "$bt" ] && [ "$bt" != release ]; then
	echo "bench/checkpoint: note: $BUILD is a '$bt' build; RESULTS.md's figures come from -Dbuildtype=release" >&2
fi

RESULTS=$ROOT/bench/results
RUN=$RESULTS/checkpoint-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN/raw"
ln -sfn "$(basename "$RUN")" "$RESULTS/checkpoint-latest"
{
	echo "build $BUILD ($bt), trainerd built $(date -r "$TRAINERD" '+%Y-%m-%d %H:%M:%S %Z')"
	echo "tree now: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')"
} >"$RUN/build.txt"

# -O2 like a release build of the library's callers; the library itself
# comes from BUILD_DIR as built.
# shellcheck disable=SC2046  # pkg-config output is meant to be split
cc -O2 -std=c11 -Wall -Wextra -I"$ROOT" -o "$RUN/ckpt_store" "$ROOT/bench/checkpoint/ckpt_store.c" \
	"$BUILD/storage/libtrstore.a" $(pkg-config --libs sqlite3 jansson nettle) -lpthread

# shellcheck disable=SC2086  # BENCH_CKPT_ARGS is a list of arguments
timeout 720 "$PYTHON" "$ROOT/bench/checkpoint/bench_ckpt.py" --trainerd "$TRAINERD" --ckpt-store "$RUN/ckpt_store" \
	--out "$RUN" ${BENCH_CKPT_ARGS:-}
echo "bench/checkpoint: results in $RUN (summary.md, results.json, raw/)" >&2
