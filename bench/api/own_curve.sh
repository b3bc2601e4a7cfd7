#!/bin/sh
# bench/api/own_curve.sh BUILD_DIR [BUILD_DIR...]: the running job's own
# curve at 1,000 requests/s (bench/api/own_curve.py), one command, several
# builds side by side in alternating order (e.g. a build of the previous
# commit and one of this tree).  Results: bench/results/own-<timestamp>/
# (summary.md, own_curve.json, raw/ with every loadgen log); about
# 1 minute per build and round plus the push of --points per build.
# Extra arguments: OWN_CURVE_ARGS, e.g. "--rounds 5 --points 200000".
# Bounded: killed after 15 minutes.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [BUILD_DIR...]" >&2; exit 2; }
RUN=$ROOT/bench/results/own-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN/raw"
cc -O2 -std=c11 -Wall -Wextra -o "$RUN/loadgen" "$ROOT/bench/api/loadgen.c"
BUILDS=""
for b in "$@"; do
	case $b in /*) ;; *) b=$(pwd)/$b ;; esac
	[ -x "$b/daemon/trainerd" ] || { echo "bench/api: $b/daemon/trainerd not found" >&2; exit 1; }
	BUILDS="$BUILDS --build $(basename "$b")=$b/daemon/trainerd"
done
# shellcheck disable=SC2086  # lists of arguments
timeout 900 /usr/bin/python3 "$ROOT/bench/api/own_curve.py" $BUILDS --loadgen "$RUN/loadgen" --out "$RUN" \
	${OWN_CURVE_ARGS:-}
echo "bench/api: results in $RUN (summary.md)" >&2
