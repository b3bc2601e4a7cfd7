#!/bin/bash
# tests/gpu/check.sh REPORT_DIR                      the GPU run
# tests/gpu/check.sh --rehearse [--quick] [REPORT_DIR]  what a machine without a GPU can check
#
# The one prepared check for a machine with an NVIDIA GPU, made to work the
# first time on a bare machine: it checks every prerequisite first and
# names what is missing, builds trainerd, trainerd-cuda.so and the CUDA
# tests before anything else (the rest afterwards with `ninja -k 0`, so a
# build error elsewhere skips nothing), runs the CUDA tests whenever their
# binary exists, fails a stage whose CUDA tests skipped while nvidia-smi
# sees a GPU (the skip reason heads the report), and ends each stage's
# whole process group at its time limit.  The stages share CHECK_BUDGET
# seconds (default 540: about 9 minutes of commands).
#
# --rehearse runs in a clean copy of the tracked files (no node_modules/,
# no build folders) with the network cut where `unshare -rn` works: it
# checks the prerequisites, the carried packages (.debs, or names the ones a
# machine would need), configures, builds (all of trainerd, the module and
# the CUDA tests; with --quick, as `make test` runs it, the CUDA module
# alone), tests the stage runner's time limit and the skip rule, and prints
# the GPU stages it would run.  Without nvcc it says "nvcc not found: CUDA
# compile not rehearsed" and checks the rest.
#
# tests/gpu/README.md describes the stages, the report, carrying packages
# and what each rehearsal covers.
set -u

MODE=run
QUICK=0
REPORT=
for a in "$@"; do
	case $a in
	--rehearse) MODE=rehearse ;;
	--quick) QUICK=1 ;;
	-*)
		echo "usage: tests/gpu/check.sh REPORT_DIR | --rehearse [--quick] [REPORT_DIR]" >&2
		exit 2
		;;
	*) REPORT=$a ;;
	esac
done
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ $MODE = rehearse ]; then
	WORK=${TR_GPU_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/trainerd-gpu-rehearsal.XXXXXX")}
	REPORT=${REPORT:-$WORK/report}
else
	[ -n "$REPORT" ] || {
		echo "usage: tests/gpu/check.sh REPORT_DIR | --rehearse [--quick] [REPORT_DIR]" >&2
		exit 2
	}
	WORK=${TR_GPU_WORK:-/tmp/trainerd-gpu-check}
fi
BUDGET=${CHECK_BUDGET:-540}
rm -rf "$WORK/logs" "$WORK/build" "$WORK/deps" "$WORK/src"
mkdir -p "$WORK/logs" "$REPORT"
REPORT=$(cd "$REPORT" && pwd)
# PyTorch (bench/gpu/torch_peer.py) keeps the machine's library path even
# when carried Debian libraries are put in front of it below.
export TR_TORCH_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
BUILD=$WORK/build
DEPS=$WORK/deps
MD=$REPORT/report.md
START=$SECONDS
PLAN_ONLY=0

# shellcheck source=tests/gpu/stage.sh
. "$ROOT/tests/gpu/stage.sh"
# shellcheck source=tests/gpu/deps.sh
. "$ROOT/tests/gpu/deps.sh"
# shellcheck source=tests/gpu/gpu_stages.sh
. "$ROOT/tests/gpu/gpu_stages.sh"
# shellcheck source=tests/gpu/skips.sh
. "$ROOT/tests/gpu/skips.sh"
# shellcheck source=tests/gpu/report.sh
. "$ROOT/tests/gpu/report.sh"
trap write_report EXIT

# ---- the source: the checkout, or for a rehearsal a clean copy ------------

SRC=$ROOT
if [ $MODE = rehearse ]; then
	SRC=$WORK/src
	mkdir -p "$SRC"
	# tracked and untracked-but-not-ignored files as they are now: what a
	# copy of this checkout carries, without node_modules/ and build*/
	if ! git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
		# not a git checkout: everything but what a build or install adds
		tar -C "$ROOT" --exclude=./node_modules --exclude='./build*' --exclude=./.debs -cf - . | tar -xf - -C "$SRC"
	else
		(cd "$ROOT" && git ls-files -z -c -o --exclude-standard | while IFS= read -r -d '' f; do
			case $f in node_modules | node_modules/* | .debs/*) continue ;; esac
			[ -e "$f" ] && printf '%s\0' "$f"
		done | tar --null -T - -cf -) | tar -xf - -C "$SRC"
	fi
fi

# ---- environment --------------------------------------------------------

NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
# TR_CHECK_NO_NVCC=1: behave as on a machine without the toolkit (to
# rehearse that path where nvcc is installed)
[ "${TR_CHECK_NO_NVCC:-0}" = 1 ] && NVCC=
CUDA_HOME=
if [ -n "$NVCC" ]; then
	# nvcc on PATH may be a wrapper script or a link (/usr/local/bin/nvcc
	# that execs the toolkit's): the toolkit's own root is what nvcc
	# reports as TOP, where cuBLAS and NCCL are looked for.
	CUDA_HOME=$("$NVCC" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
	if [ -n "$CUDA_HOME" ] && [ -d "$CUDA_HOME" ]; then
		CUDA_HOME=$(cd "$CUDA_HOME" && pwd -P)
	else
		CUDA_HOME=$(cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd -P)
	fi
	PATH="$(dirname "$NVCC"):$PATH"
	export PATH
fi
GPUS=0
if command -v nvidia-smi >/dev/null; then
	GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
SANITIZER=$(command -v compute-sanitizer || true)
[ -z "$SANITIZER" ] && [ -n "$CUDA_HOME" ] && [ -x "$CUDA_HOME/compute-sanitizer/compute-sanitizer" ] &&
	SANITIZER=$CUDA_HOME/compute-sanitizer/compute-sanitizer
{
	echo '```'
	echo "mode: $MODE$([ $QUICK = 1 ] && echo ' --quick'); budget: ${BUDGET}s; cpus: $(nproc)"
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
	else
		echo "nvidia-smi: not found"
	fi
	echo "GPUs seen by nvidia-smi: $GPUS"
	echo "nvcc: ${NVCC:-not found} $([ -n "$NVCC" ] && "$NVCC" --version | tail -1)"
	[ -n "$CUDA_HOME" ] && echo "toolkit root (nvcc's TOP): $CUDA_HOME"
	echo "compute-sanitizer: ${SANITIZER:-not found}"
	echo "cc: $(cc --version 2>&1 | head -1)"
	echo "meson: $(meson --version 2>&1 | head -1); ninja: $(ninja --version 2>&1 | head -1)"
	echo "python3: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1 | tail -1)"
	echo '```'
} >"$WORK/environment.md"

# ---- prerequisites: all checked first, each missing one named -----------

if [ $MODE = run ] && [ "$GPUS" -eq 0 ]; then
	row "GPU" "FAILED: nvidia-smi sees no GPU"
	headline "nvidia-smi sees no GPU (not found, or no driver): the GPU stages will fail or skip"
	FAILED=1
fi

MISSING=
for t in meson ninja python3 cc setsid tar; do
	command -v $t >/dev/null || MISSING="$MISSING $t"
done
if [ -n "$MISSING" ]; then
	row "tools" "FAILED: missing$MISSING"
	headline "missing tools:$MISSING"
	FAILED=1
	exit 1
fi
row "tools" ok
CUDA_OPT=enabled
if [ -z "$NVCC" ]; then
	if [ $MODE = run ]; then
		row "toolkit" "FAILED: nvcc not found"
		headline "nvcc not found (not on PATH, not in the usual toolkit folder)"
		FAILED=1
		exit 1
	fi
	row "toolkit" "nvcc not found: CUDA compile not rehearsed"
	headline "nvcc not found: CUDA compile not rehearsed"
	CUDA_OPT=disabled
fi
# check_step NAME FUNC: a check that may change the environment, so it
# runs in this shell (not as a stage); its last line is its verdict.
check_step() {
	if "$2" >>"$WORK/logs/deps.log" 2>&1; then
		row "$1" "ok: $(tail -1 "$WORK/logs/deps.log")"
	else
		row "$1" "FAILED: $(tail -1 "$WORK/logs/deps.log")"
		headline "$1: $(tail -1 "$WORK/logs/deps.log")"
		FAILED=1
	fi
}
check_step "pkg-config modules" deps
# TR_CHECK_NO_CUDA_LIBS=1: behave as if cuBLAS and NCCL were missing
if [ $CUDA_OPT = enabled ]; then
	if [ "${TR_CHECK_NO_CUDA_LIBS:-0}" = 1 ]; then
		echo "cublas, nccl: hidden (TR_CHECK_NO_CUDA_LIBS=1)" >>"$WORK/logs/deps.log"
		libs_found=0
	elif cuda_libs >>"$WORK/logs/deps.log" 2>&1; then
		libs_found=1
	else
		libs_found=0
	fi
	if [ $libs_found = 1 ]; then
		row "cuBLAS, NCCL" "ok: $(tail -1 "$WORK/logs/deps.log")"
	elif [ $MODE = rehearse ]; then
		# a toolkit without cuBLAS or NCCL (nvcc alone): the GPU run would
		# fail here; a rehearsal says so and rehearses the rest
		row "cuBLAS, NCCL" "not found beside nvcc ($CUDA_HOME): $(tail -1 "$WORK/logs/deps.log"); CUDA compile not rehearsed"
		headline "cuBLAS or NCCL not found beside nvcc: CUDA compile not rehearsed"
		CUDA_OPT=disabled
	else
		row "cuBLAS, NCCL" "FAILED: $(tail -1 "$WORK/logs/deps.log")"
		headline "cuBLAS, NCCL: $(tail -1 "$WORK/logs/deps.log")"
		FAILED=1
	fi
fi
if [ -n "${PKG_CONFIG_PATH:-}" ]; then
	PKG_CONFIG=$(command -v pkg-config)
	export PKG_CONFIG
fi
DASHBOARD=embed
if [ ! -f "$SRC/node_modules/uplot/dist/uPlot.iife.min.js" ]; then
	DASHBOARD=placeholder
	row "dashboard assets" "absent (node_modules/uplot): built with -Ddashboard=placeholder"
fi
if [ $MODE = rehearse ]; then
	check_step "module lists (meson vs carried)" check_module_lists
	debs=${TR_DEBS:-$ROOT/.debs}
	if ls "$debs"/*.deb >/dev/null 2>&1; then
		# shellcheck disable=SC2317  # called through check_step
		check_carried() { check_carried_debs "$debs"; }
		check_step "carried packages ($debs)" check_carried
	else
		row "carried packages" "none in $debs: a machine without them needs $(sh "$ROOT/tests/gpu/fetch_debs.sh" --list | wc -l) packages (tests/gpu/fetch_debs.sh)"
	fi
fi

# ---- build: trainerd, the module and the CUDA tests first ---------------

# A rehearsal cuts the network where it can (unshare -rn: a user and a
# network namespace of its own), as the GPU machine has none.
NONET=
if [ $MODE = rehearse ]; then
	if unshare -rn true 2>/dev/null; then
		NONET="unshare -rn"
	else
		row "network" "not cut (unshare -rn not permitted here)"
	fi
	# ccache (when meson finds it) reuses one rehearsal's objects in the
	# next: paths relative to the copy, its folder name left out.
	export CCACHE_BASEDIR=$SRC CCACHE_NOHASHDIR=1
fi
FIRST="daemon/trainerd tests/engine_test_cuda_backend"
[ $CUDA_OPT = enabled ] && FIRST="$FIRST daemon/trainerd-cuda.so bench/gpu/allreduce_bw"
if [ $QUICK = 1 ]; then
	# make test's rehearsal: the dashboard's assets as this configuration
	# embeds them, and two of the module's objects (its host side and an
	# elementwise kernel file) through nvcc with the GPU run's flags.  The
	# main build compiles every .cu when it finds nvcc.
	FIRST=api/libtrapi.a.p/meson-generated_.._ui_assets.c.o
	[ $CUDA_OPT = enabled ] && FIRST="$FIRST engine/cuda/cuda_backend.cu.o engine/cuda/kernels_elementwise.cu.o"
fi
# werror off: a newer compiler there must not stop the check over a warning.
# shellcheck disable=SC2086  # NONET and FIRST are word lists
if stage "meson setup -Dcuda=$CUDA_OPT -Ddashboard=$DASHBOARD" 90 "$REPORT/build.log" \
	$NONET meson setup "$BUILD" "$SRC" -Dcuda=$CUDA_OPT -Ddashboard=$DASHBOARD -Dwerror=false; then
	stage "ninja $FIRST" 240 "$REPORT/build.log" $NONET ninja -C "$BUILD" $FIRST
fi

# ---- the GPU stages (printed, not run, in a rehearsal) ------------------

export TRAINERD_CUDA_MODULE="$BUILD/daemon/trainerd-cuda.so"
CUDA_TESTS=$BUILD/tests/engine_test_cuda_backend
if [ $MODE = rehearse ]; then
	rehearse_selftests
	PLAN_ONLY=1
	PLAN_GPUS=${TR_CHECK_PLAN_GPUS:-1}
	echo "The GPU run's stages after the build (for $PLAN_GPUS GPU(s); limits are upper bounds, trimmed to the budget):" >"$WORK/plan.txt"
	exec 3>&1 1>>"$WORK/plan.txt"
	gpu_stages "$PLAN_GPUS"
	stage "ninja -k 0 (everything else)" 90 "$REPORT/build.log" ninja -C "$BUILD" -k 0
	exec 1>&3 3>&-
	echo "total of the limits: ${PLANNED}s after the build, budget ${BUDGET}s for all (stages past it are skipped)" >>"$WORK/plan.txt"
	cat "$WORK/plan.txt"
	exit $FAILED
fi

[ -x "$BUILD/daemon/trainerd" ] &&
	row "trainerd --version" "$("$BUILD/daemon/trainerd" --version 2>&1 | head -1)"
gpu_stages "$GPUS"
stage "ninja -k 0 (everything else)" 90 "$REPORT/build.log" ninja -C "$BUILD" -k 0
exit $FAILED
