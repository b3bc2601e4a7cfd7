#!/bin/sh
# bench/startup/run.sh BUILD_DIR [BASELINE_TRAINERD]
#
# Start-to-ready time and idle memory of `trainerd serve`
# (bench/startup/RESULTS.md): bench_startup.py twice, on a fresh state
# directory per start and on one existing state directory (a restart), 15
# starts each; with BASELINE_TRAINERD (another build's trainerd, e.g. one
# built from an older commit) the same runs for it too, alternating.
# About 10 s per series on an idle machine; every daemon is stopped by pid.
# Results: bench/results/startup-<timestamp>/{*.txt,*.json}, newest as
# bench/results/startup-latest.
set -eu

BUILD=${1:?usage: bench/startup/run.sh BUILD_DIR [BASELINE_TRAINERD]}
BASE=${2:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
case $BUILD in /*) ;; *) BUILD=$(pwd)/$BUILD ;; esac
TRAINERD=$BUILD/daemon/trainerd
PYTHON=${PYTHON:-python3}
[ -x "$TRAINERD" ] || { echo "bench/startup: $TRAINERD not found; build first" >&2; exit 1; }

RESULTS=$ROOT/bench/results
RUN=$RESULTS/startup-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
ln -sfn "$(basename "$RUN")" "$RESULTS/startup-latest"

series() { # NAME TRAINERD [--reuse-state]
	name=$1
	exe=$2
	shift 2
	timeout 300 "$PYTHON" "$ROOT/bench/startup/bench_startup.py" --trainerd "$exe" --rounds 15 --label "$name" \
		--json "$RUN/$name.json" "$@" | tee "$RUN/$name.txt"
}

for state in fresh existing; do
	flag=
	[ $state = existing ] && flag=--reuse-state
	[ -n "$BASE" ] && series "baseline-$state" "$BASE" $flag
	series "build-$state" "$TRAINERD" $flag
done
echo "results in $RUN"
