#!/bin/sh
# bench/api/run.sh BUILD_DIR: the metrics API benchmark (bench/api/RESULTS.md).
#
# Installs wrk and nginx from Debian when missing (apt-get, through sudo
# when not root; nothing is installed when both are there), compiles
# bench/api/loadgen.c, then runs bench/api/bench_api.py, which starts its
# own `trainerd serve` (loopback, port 0, a state dir under the results)
# and its own nginx (loopback, a free port, a prefix under the results),
# and stops both by pid at the end.  Results: bench/results/api-<timestamp>/
# (summary.md, results.json, raw/ with every wrk and loadgen output, the
# daemon log); bench/results/api-latest points at the newest.
#
# Bounded: about 5 minutes on the 2-core machine; the Python driver is
# killed after 9 minutes.  Extra driver arguments: BENCH_API_ARGS, e.g.
# "--rounds 1 --only a" or "--perf" (adds a 5 s flat profile of trainerd
# at saturation under raw/).
set -eu

BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
case $BUILD in /*) ;; *) BUILD=$(pwd)/$BUILD ;; esac
TRAINERD=$BUILD/daemon/trainerd
PYTHON=${PYTHON:-/usr/bin/python3}

if [ ! -x "$TRAINERD" ]; then
	echo "bench/api: $TRAINERD not found; build first (meson setup $BUILD -Dbuildtype=release -Dcuda=disabled && ninja -C $BUILD)" >&2
	exit 1
fi

need=""
command -v wrk >/dev/null 2>&1 || need="$need wrk"
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need="$need nginx-light"
if [ -n "$need" ]; then
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	echo "bench/api: installing$need" >&2
	# nginx-light is the small flavour; on releases without it, nginx.
	alt=$(echo "$need" | sed 's/nginx-light/nginx/')
	# shellcheck disable=SC2086  # $need and $alt are lists of packages
	$SUDO apt-get install -y $need >/dev/null 2>&1 ||
		{ $SUDO apt-get update >/dev/null && $SUDO apt-get install -y $need >/dev/null 2>&1; } ||
		$SUDO apt-get install -y $alt >/dev/null
fi
PATH=$PATH:/usr/sbin
export PATH

bt=$(sed -n 's/.*"name": "buildtype", "value": "\([a-z]*\)".*/\1/p' "$BUILD/meson-info/intro-buildoptions.json" 2>/dev/null || true)
if [ -n "$bt" ] && [ "$bt" != release ]; then
	echo "bench/api: note: $BUILD is a '$bt' build; RESULTS.md's figures come from -Dbuildtype=release" >&2
fi

RESULTS=$ROOT/bench/results
RUN=$RESULTS/api-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN/raw"
ln -sfn "$(basename "$RUN")" "$RESULTS/api-latest"
{
	echo "build $BUILD ($bt), trainerd built $(date -r "$TRAINERD" '+%Y-%m-%d %H:%M:%S %Z')"
	echo "tree now: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')"
} >"$RUN/build.txt"

cc -O2 -std=c11 -Wall -Wextra -o "$RUN/loadgen" "$ROOT/bench/api/loadgen.c"

# shellcheck disable=SC2086  # BENCH_API_ARGS is a list of arguments
timeout 540 "$PYTHON" "$ROOT/bench/api/bench_api.py" --trainerd "$TRAINERD" --loadgen "$RUN/loadgen" \
	--out "$RUN" ${BENCH_API_ARGS:-}
echo "bench/api: results in $RUN (summary.md, results.json, raw/)" >&2
