#!/bin/sh
# `make bench`: bench/run.sh BUILD_DIR
#
# Builds bench/sgemm_rate.c against OpenBLAS (no meson involvement: the
# benchmarks are not part of the build or of `make test`), then runs
# bench/bench.py, which alternates trainerd and PyTorch runs and writes
# bench/results/<timestamp>/{results.md,results.json,runs/...}; the
# newest run is also reachable as bench/results/latest.  Bounded: the
# whole thing takes ~2.5 minutes on an idle 2-core machine; bench.py stops
# adding rounds after --budget-s (420 s) and the script is killed after 10
# minutes, so a loaded machine gives fewer rounds, not a hang.
#
# Environment: PYTHON (default /usr/bin/python3, Debian's, which has
# torch), BENCH_ARGS (extra bench.py arguments, e.g. "--rounds 3").
set -eu

BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case $BUILD in /*) ;; *) BUILD=$(pwd)/$BUILD ;; esac
TRAINERD=$BUILD/daemon/trainerd
PYTHON=${PYTHON:-/usr/bin/python3}

if [ ! -x "$TRAINERD" ]; then
	echo "bench: $TRAINERD not found; build first (make build, or ninja -C $BUILD)" >&2
	exit 1
fi

RESULTS=$ROOT/bench/results
RUN=$RESULTS/$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
ln -sfn "$(basename "$RUN")" "$RESULTS/latest"

SGEMM=$RESULTS/sgemm_rate
# shellcheck disable=SC2046  # pkg-config output is meant to be split
cc -O2 -std=c11 -Wall -Wextra -o "$SGEMM" "$ROOT/bench/sgemm_rate.c" $(pkg-config --cflags --libs openblas)

bt=$(sed -n 's/.*"name": "buildtype", "value": "\([a-z]*\)".*/\1/p' "$BUILD/meson-info/intro-buildoptions.json" 2>/dev/null || true)
if [ -n "$bt" ] && [ "$bt" != release ]; then
	echo "bench: note: $BUILD is a '$bt' build; the README's figures come from -Dbuildtype=release" >&2
fi

# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
timeout 600 "$PYTHON" "$ROOT/bench/bench.py" --trainerd "$TRAINERD" --sgemm "$SGEMM" --out "$RUN" ${BENCH_ARGS:-}
echo "bench: results in $RUN (results.md, results.json)" >&2
