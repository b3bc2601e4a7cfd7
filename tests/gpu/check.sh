#!/bin/bash
# tests/gpu/check.sh REPORT_DIR
#
# The one prepared check for a machine with an NVIDIA GPU: builds trainerd
# with -Dcuda=enabled in a fresh build directory, runs the CUDA backend's
# tests (tests/unit/engine/test_cuda_backend.c: every kernel against the
# CPU backend, whole jobs CUDA vs CPU, NCCL with 2+ GPUs), the GPU
# benchmarks (bench/gpu/, quick mode) and then the rest of the test suite
# (its daemon and CLI tests ask for CPU devices, so that they behave the
# same on every machine; the daemon's fallback test notices the GPU and
# skips).  Every stage runs under
# `timeout` and the stages share a budget of CHECK_BUDGET seconds (default
# 450), so the script ends within 8 minutes; a stage that would not fit is
# reported as skipped.  Exit status: 0 when everything that ran passed.
#
# Report (REPORT_DIR, 7 files, few enough to collect as they are):
#   report.md      verdict per stage, environment, failures, benchmark table
#   build.log      meson and ninja output
#   cuda_tests.log the CUDA test binary's verbose output
#   suite.log      tests/run_tests.py over the CUDA build
#   bench.md, bench.json   bench/gpu/bench_gpu.py results
#   logs.tar.gz    everything else (benchmark runs, dependency notes)
#
# Missing packages.  The GPU machine may lack the Debian development
# packages trainerd builds against (jansson, sqlite3, libmicrohttpd,
# libcurl, OpenBLAS, Criterion, pkg-config) and cannot download them.
# Carry them as .deb files:
#   1. on a developer machine (Debian 12, as CI), in the repository root:
#          echo /.debs/ >> .git/info/exclude
#          tests/gpu/fetch_debs.sh .debs           # about 22 MB
#   2. copy the checkout with .debs to the GPU machine and run
#          bash tests/gpu/check.sh REPORT_DIR
# Only when pkg-config cannot find a needed module, every .deb in .debs
# (or in $TR_DEBS) is unpacked with `dpkg -x` into a private prefix
# ($WORK/deps), never into /; its .pc files are rewritten to point there,
# stub .pc files stand in for Requires.private modules nobody carried, and
# a library the machine already has (same soname in `ldconfig -p`) is
# dropped from the prefix so that the system's copy is used.  The prefix
# then goes on PATH, PKG_CONFIG_PATH, CPATH, LIBRARY_PATH and
# LD_LIBRARY_PATH.  Without dpkg, `ar x` and `tar` unpack the same way.
# cuBLAS and NCCL: when the CUDA toolkit beside nvcc lacks them, the pip
# wheels of a PyTorch installation (nvidia-cublas, nvidia-nccl-cu13) are
# used through the same variables.
set -u

REPORT=${1:?usage: tests/gpu/check.sh REPORT_DIR}
mkdir -p "$REPORT" && REPORT=$(cd "$REPORT" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${TR_GPU_WORK:-/tmp/trainerd-gpu-check}
BUDGET=${CHECK_BUDGET:-450}
rm -rf "$WORK"
mkdir -p "$WORK/logs"
# PyTorch (bench/gpu/torch_peer.py) keeps the machine's library path even
# when carried Debian libraries are put in front of it below.
export TR_TORCH_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
BUILD=$WORK/build
DEPS=$WORK/deps
MD=$REPORT/report.md
START=$SECONDS
FAILED=0

log() { echo "[check] $*" >&2; }
md() { echo "$*" >>"$MD"; }
left() { echo $((BUDGET - (SECONDS - START))); }

# stage NAME LIMIT_S LOGFILE CMD...: runs CMD under timeout, trimmed to the
# budget left, appending to LOGFILE; records the verdict in report.md.
stage() {
	local name=$1 limit=$2 logf=$3 l t0 rc
	shift 3
	l=$(left)
	if [ "$l" -lt 30 ]; then
		md "| $name | skipped: budget spent | |"
		log "$name: skipped (budget spent)"
		return 125
	fi
	[ "$limit" -gt "$l" ] && limit=$l
	log "$name (up to ${limit}s)"
	t0=$SECONDS
	timeout -k 10 "$limit" "$@" >>"$logf" 2>&1
	rc=$?
	if [ $rc -eq 0 ]; then
		md "| $name | ok | $((SECONDS - t0)) s |"
		return 0
	elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
		md "| $name | TIMED OUT after ${limit}s | $((SECONDS - t0)) s |"
	else
		md "| $name | FAILED (exit $rc) | $((SECONDS - t0)) s |"
	fi
	FAILED=1
	{
		echo "### $name: last lines of $(basename "$logf")"
		echo '```'
		tail -15 "$logf"
		echo '```'
	} >>"$WORK/failures.md"
	return $rc
}

: >"$MD"
md "# trainerd GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
md ""
md "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo ' (with local changes)')"
md ""

# ---- environment --------------------------------------------------------

NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
CUDA_HOME=
if [ -n "$NVCC" ]; then
	CUDA_HOME=$(cd "$(dirname "$NVCC")/.." && pwd)
	PATH="$(dirname "$NVCC"):$PATH"
	export PATH
fi
{
	echo '```'
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
	else
		echo "nvidia-smi: not found"
	fi
	echo "nvcc: ${NVCC:-not found} $( [ -n "$NVCC" ] && "$NVCC" --version | tail -1)"
	echo "cc: $(cc --version 2>&1 | head -1)"
	echo "meson: $(meson --version 2>&1 | head -1); ninja: $(ninja --version 2>&1 | head -1)"
	echo "python3: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1 | tail -1)"
	echo "cpus: $(nproc); budget: ${BUDGET}s"
	echo '```'
} >>"$MD"
md ""
md "| stage | result | time |"
md "| --- | --- | --- |"

if [ -z "$NVCC" ]; then
	md "| toolkit | FAILED: nvcc not found | |"
	exit 1
fi

# ---- dependencies -------------------------------------------------------

# Unpacks one .deb into $DEPS, with dpkg or without it.
unpack_deb() {
	if command -v dpkg >/dev/null; then
		dpkg -x "$1" "$DEPS"
	else
		local t
		t=$(mktemp -d)
		(cd "$t" && ar x "$1" && tar -xf data.tar.* -C "$DEPS")
		rm -rf "$t"
	fi
}

# The soname's path on this machine, if ldconfig knows it.
system_lib() {
	ldconfig -p 2>/dev/null | awk -v s="$1" '$1 == s && /x86-64/ { print $NF; exit }'
}

use_debs() {
	local dir=$1 f pc n link soname sys lib
	mkdir -p "$DEPS" "$DEPS/stubpc"
	for f in "$dir"/*.deb; do
		unpack_deb "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" || return 1
	done
	lib=$DEPS/usr/lib/x86_64-linux-gnu
	# Prefer the machine's own copy of every library it already has: drop
	# ours (the soname and the file it names) and point our development
	# link (libfoo.so, which names the versioned file) at the system's.
	while IFS= read -r link; do
		soname=$(basename "$link")
		sys=$(system_lib "$soname")
		[ -n "$sys" ] || continue
		real=$(readlink -f "$link")
		for dev in "$(dirname "$link")"/lib*.so; do
			[ -L "$dev" ] || continue
			case $(basename "$(readlink "$dev")") in
			"$soname" | "$(basename "$real")") ln -sfn "$sys" "$dev" ;;
			esac
		done
		rm -f "$real" "$link"
		echo "using the system's $soname ($sys)"
	done < <(find "$DEPS" -name 'lib*.so.[0-9]*' \( -type l -o -type f \))
	# .pc files name /usr: point them at the prefix
	find "$DEPS" -name '*.pc' -exec sed -i -e "s|=/usr|=$DEPS/usr|g" -e "s| /usr/| $DEPS/usr/|g" {} +
	export PATH="$DEPS/usr/bin:$PATH"
	export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export LIBRARY_PATH="$lib:$lib/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}"
	export CPATH="$DEPS/usr/include:$DEPS/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
	# openblas-pthread's .pc files sit in its own folder (Debian links them
	# into pkgconfig/ through update-alternatives, which dpkg -x skips)
	export PKG_CONFIG_PATH="$lib/pkgconfig:$lib/openblas-pthread/pkgconfig:$DEPS/usr/share/pkgconfig:$DEPS/stubpc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
	hash -r
	# pkg-config wants Requires.private modules to exist even for --cflags
	while IFS= read -r pc; do
		for n in $(sed -n 's/^Requires\(\.private\)\{0,1\}:\(.*\)/\2/p' "$pc" | tr ',' ' '); do
			case $n in [a-zA-Z]*) ;; *) continue ;; esac
			pkg-config --exists "$n" 2>/dev/null && continue
			printf 'Name: %s\nDescription: stub for the trainerd GPU check\nVersion: 999\n' "$n" \
				>"$DEPS/stubpc/$n.pc"
			echo "stub .pc for $n (needed by $(basename "$pc"))"
		done
	done < <(find "$DEPS" -name '*.pc' -not -path "$DEPS/stubpc/*")
}

missing_modules() {
	local m out=""
	if ! command -v pkg-config >/dev/null; then
		echo "pkg-config"
		return
	fi
	for m in jansson sqlite3 libmicrohttpd libcurl nettle criterion; do
		pkg-config --exists "$m" || out="$out $m"
	done
	pkg-config --exists openblas || pkg-config --exists blas || out="$out openblas"
	echo "$out"
}

deps() {
	local missing debs
	missing=$(missing_modules)
	if [ -n "$missing" ]; then
		debs=${TR_DEBS:-$ROOT/.debs}
		echo "missing:$missing"
		if ! ls "$debs"/*.deb >/dev/null 2>&1; then
			echo "no .deb files in $debs: see the header of tests/gpu/check.sh"
			return 1
		fi
		use_debs "$debs" || return 1
		missing=$(missing_modules)
		if [ -n "$missing" ]; then
			echo "still missing after unpacking $debs:$missing"
			return 1
		fi
	fi
	echo "pkg-config: all modules found"
}

# cuBLAS and NCCL beside nvcc, else from pip's nvidia wheels.
cuda_libs() {
	local mod hdr so inc libd sp
	mkdir -p "$WORK/cudaextra/lib" "$WORK/cudaextra/include"
	sp=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
	for mod in cublas nccl; do
		case $mod in cublas) hdr=cublas_v2.h ;; nccl) hdr=nccl.h ;; esac
		if ls "$CUDA_HOME"/lib64/lib$mod.so* "$CUDA_HOME"/targets/*/lib/lib$mod.so* >/dev/null 2>&1 &&
			[ -n "$(find "$CUDA_HOME/include" "$CUDA_HOME"/targets/*/include -maxdepth 1 -name $hdr 2>/dev/null | head -1)" ]; then
			echo "$mod: in the toolkit"
			continue
		fi
		# shellcheck disable=SC2086  # site-packages directories, one or more
		so=$(find $sp -path '*nvidia*' -name "lib$mod.so*" 2>/dev/null | sort | head -1)
		# shellcheck disable=SC2086
		inc=$(find $sp -path '*nvidia*' -name $hdr 2>/dev/null | head -1)
		if [ -z "$so" ] || [ -z "$inc" ]; then
			echo "$mod: not in the toolkit and no pip wheel found"
			return 1
		fi
		libd=$(dirname "$so")
		ln -sfn "$so" "$WORK/cudaextra/lib/lib$mod.so"
		for f in "$(dirname "$inc")"/*.h; do ln -sfn "$f" "$WORK/cudaextra/include/"; done
		export LD_LIBRARY_PATH="$libd${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
		echo "$mod: from $libd"
	done
	export CPATH="${CPATH:+$CPATH:}$WORK/cudaextra/include"
	export LIBRARY_PATH="$WORK/cudaextra/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
}

# These two change the environment, so they run in this shell (not under
# `stage`, which would run them in a child); both are quick.
if deps >>"$WORK/logs/deps.log" 2>&1; then
	md "| dependencies | ok | |"
else
	md "| dependencies | FAILED: $(tail -1 "$WORK/logs/deps.log") | |"
	FAILED=1
fi
if cuda_libs >>"$WORK/logs/deps.log" 2>&1; then
	md "| cuBLAS, NCCL | ok | |"
else
	md "| cuBLAS, NCCL | FAILED: $(tail -1 "$WORK/logs/deps.log") | |"
	FAILED=1
fi
if [ -n "${PKG_CONFIG_PATH:-}" ]; then
	PKG_CONFIG=$(command -v pkg-config)
	export PKG_CONFIG
fi

# ---- build --------------------------------------------------------------

# werror off: a newer compiler here must not stop the check over a warning.
stage "meson setup -Dcuda=enabled" 120 "$REPORT/build.log" \
	meson setup "$BUILD" "$ROOT" -Dcuda=enabled -Dwerror=false &&
	stage "ninja" 240 "$REPORT/build.log" ninja -C "$BUILD"
built=$?

# ---- CUDA tests, benchmarks, suite ---------------------------------------

if [ $built -eq 0 ]; then
	# The CUDA backend is the module trainerd-cuda.so beside trainerd
	# (engine/cuda/module.h); the test executables are elsewhere.
	export TRAINERD_CUDA_MODULE="$BUILD/daemon/trainerd-cuda.so"
	md "| trainerd --version | $("$BUILD/daemon/trainerd" --version 2>&1 | head -1) | |"
	if [ -x "$BUILD/tests/engine_test_cuda_backend" ]; then
		# Single-device tests in parallel; the NCCL ones (2+ GPUs) one at a
		# time, so that no two processes' communicators compete for the
		# same GPUs (NCCL kernels of unrelated communicators can starve each
		# other) and the abort test's timing is its own.
		stage "CUDA backend tests" 160 "$REPORT/cuda_tests.log" \
			"$BUILD/tests/engine_test_cuda_backend" --verbose --filter='!(cuda_multi)/*'
		stage "CUDA multi-GPU tests (serial)" 90 "$REPORT/cuda_tests.log" \
			"$BUILD/tests/engine_test_cuda_backend" --verbose --jobs 1 --filter='cuda_multi/*'
	else
		md "| CUDA backend tests | FAILED: not built (tests/meson.build lacks engine/test_cuda_backend?) | |"
		FAILED=1
	fi
	stage "GPU benchmarks (quick)" 170 "$WORK/logs/bench.log" \
		sh "$ROOT/bench/gpu/run.sh" "$BUILD" "$WORK/bench" --quick
	# The CUDA tests have had their own stage: the suite runs the rest, so
	# that its share of the budget is not spent on them a second time.
	rest=$(meson introspect --tests "$BUILD" | python3 -c 'import json, sys
print(" ".join(t["name"] for t in json.load(sys.stdin) if t["name"] != "engine_test_cuda_backend"))')
	# shellcheck disable=SC2086  # test names, one word each
	stage "test suite (all but the CUDA tests)" 150 "$REPORT/suite.log" \
		python3 "$ROOT/tests/run_tests.py" "$BUILD" $rest
fi

# ---- report -------------------------------------------------------------

if [ -f "$REPORT/cuda_tests.log" ]; then
	md ""
	md "## CUDA tests"
	md '```'
	# Criterion's own lines, without the tests' duplicate "[SKIP]
	# <suite>_<test>_impl" lines and the tests a stage's filter left out
	grep -E '^\[(FAIL|SKIP|====)\]|Assertion|failed' "$REPORT/cuda_tests.log" | grep -v -e '_impl: ' -e 'Test is disabled' | head -60 >>"$MD"
	md '```'
fi
if [ -f "$REPORT/suite.log" ]; then
	md ""
	md "## Test suite"
	md '```'
	grep -E '^(FAIL|ok|tests:)|\bFAIL' "$REPORT/suite.log" | tail -40 >>"$MD"
	md '```'
fi
if [ -f "$WORK/failures.md" ]; then
	md ""
	md "## Failures"
	cat "$WORK/failures.md" >>"$MD"
fi
if [ -f "$WORK/bench/bench.md" ]; then
	cp "$WORK/bench/bench.md" "$WORK/bench/bench.json" "$REPORT/" 2>/dev/null
	md ""
	cat "$WORK/bench/bench.md" >>"$MD"
fi
tar_items=(logs)
[ -d "$WORK/bench/runs" ] && tar_items+=(bench/runs)
tar -czf "$REPORT/logs.tar.gz" -C "$WORK" "${tar_items[@]}" 2>/dev/null
md ""
md "total: $((SECONDS - START)) s; verdict: $([ $FAILED -eq 0 ] && echo PASS || echo FAIL)"
log "report in $MD"
exit $FAILED
