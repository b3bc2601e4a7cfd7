#!/bin/sh
# bench/prometheus/run.sh BUILD_DIR: what GET /metrics costs
# (bench/prometheus/RESULTS.md): its latency with 20 running jobs, and
# whether a scrape every second slows training.  Starts its own
# `trainerd serve` on loopback and stops it by pid.  About 4 minutes on
# the 2-core machine.  Results: bench/results/prometheus-<timestamp>/
# (summary.md, results.json, the daemon's state and log).
# Extra driver arguments: BENCH_PROM_ARGS, e.g. "--rounds 2".
set -eu
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
case $BUILD in /*) ;; *) BUILD=$(pwd)/$BUILD ;; esac
TRAINERD=$BUILD/daemon/trainerd
if [ ! -x "$TRAINERD" ]; then
	echo "bench/prometheus: $TRAINERD not found; build first" >&2
	exit 1
fi
OUT=$ROOT/bench/results/prometheus-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
ln -sfn "$OUT" "$ROOT/bench/results/prometheus-latest"
# shellcheck disable=SC2086
timeout 600 python3 "$ROOT/bench/prometheus/bench_prom.py" "$TRAINERD" "$OUT" ${BENCH_PROM_ARGS:-}
