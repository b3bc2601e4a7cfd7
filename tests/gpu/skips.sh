# shellcheck shell=bash disable=SC2034  # sourced by check.sh, whose variables it sets
# tests/gpu/skips.sh: sourced by tests/gpu/check.sh.  Criterion exits 0
# when every test skipped (no libnccl.so.2 on the library path, and the
# module does not load): with a GPU in sight a skip is a failure, and its
# reason goes to the top of the report.  Also the rehearsal's self-tests
# of that rule and of the stage runner's time limit.

# The skip lines of a Criterion --verbose log, without the tests a
# --filter left out ("Test is disabled").
skip_lines() {
	grep -E '^\[SKIP\] [A-Za-z0-9_]+::[A-Za-z0-9_]+: ' "$1" | grep -v ': Test is disabled$'
}

# skip_rule NAME LOG GPUS: 1 (and a failed row, a headline) when the log
# has skips and GPUS > 0; with no GPU the reason is still a headline.
skip_rule() {
	local name=$1 logf=$2 gpus=$3 n reason
	n=$(skip_lines "$logf" | wc -l)
	[ "$n" -eq 0 ] && return 0
	reason=$(skip_lines "$logf" | head -1 | sed 's/^\[SKIP\] [^:]*::[^:]*: //')
	if [ "$gpus" -gt 0 ]; then
		row "$name: skips" "FAILED: $n skipped while nvidia-smi sees $gpus GPU(s)"
		headline "$name: $n tests SKIPPED although nvidia-smi sees $gpus GPU(s); first reason: $reason"
		FAILED=1
		return 1
	fi
	headline "$name: $n tests skipped (no GPU): $reason"
	return 0
}

# procs_running ARG0 ARG1: the pids whose command line starts with those
# two words (read from /proc: no procps needed).
procs_running() {
	local f a0 a1 pid
	for f in /proc/[0-9]*/cmdline; do
		{ IFS= read -r -d "" a0 && IFS= read -r -d "" a1; } 2>/dev/null <"$f" || continue
		if [ "$a0" != "$1" ] || [ "$a1" != "$2" ]; then continue; fi
		pid=${f#/proc/}
		printf '%s ' "${pid%/cmdline}"
	done
}

# script_selftest TITLE TRAINERD LIMIT LOG CMD...: a GPU stage's script
# run on CPU devices within LIMIT seconds; its RESULT line, or its first
# FAIL line and an excerpt.  Not run without a trainerd.
script_selftest() {
	local title=$1 td=$2 limit=$3 logf=$4
	shift 4
	if [ ! -x "$td" ]; then
		row "self-test: $title" "not run: no trainerd built ($td)"
	elif bounded "$limit" "$@" >"$logf" 2>&1; then
		row "self-test: $title" "ok: $(grep '^RESULT' "$logf")"
	else
		row "self-test: $title" "FAILED: $(grep -m1 '^FAIL' "$logf")"
		failure_excerpt "self-test: $title" "$logf"
		FAILED=1
	fi
}

# What a rehearsal can test of the GPU run's own machinery here.
rehearse_selftests() {
	local bin log t0 left_over rc mark=$RANDOM$RANDOM
	# 1. The time limit ends the stage's whole process group and what left
	#    it (a process in a session of its own), within limit + 6 s.
	log=$WORK/logs/selftest.log
	t0=$SECONDS
	bounded 2 bash -c "setsid sleep 300.$mark & sleep 300.$mark & sleep 300.$mark" >>"$log" 2>&1
	rc=$?
	sleep 0.5
	left_over=$(procs_running "sleep" "300.$mark")
	# shellcheck disable=SC2086  # pids this self-test started
	[ -z "$left_over" ] || kill $left_over
	if [ $rc -eq 124 ] && [ -z "$left_over" ] && [ $((SECONDS - t0)) -le 8 ]; then
		row "self-test: stage time limit" "ok: exit 124, no process left, $((SECONDS - t0)) s"
	else
		row "self-test: stage time limit" "FAILED: exit $rc, left over: ${left_over:-none}, $((SECONDS - t0)) s"
		FAILED=1
	fi
	# 2. The daemon-jobs flow (tests/gpu/daemon_jobs.py) on CPU devices:
	#    the GPU stage's script against this build's API.
	local td=${TR_CHECK_TRAINERD:-$BUILD/daemon/trainerd}
	script_selftest "daemon jobs on CPU devices" "$td" 150 "$WORK/logs/daemon_jobs_cpu.log" \
		python3 "$ROOT/tests/gpu/daemon_jobs.py" "$td" "$WORK/daemon-jobs" --backend cpu
	# 3. The GPU ranks' script (tests/gpu/nccl_ranks.sh) on CPU devices,
	#    which have no group communicator: the script itself, in seconds.
	script_selftest "NCCL ranks script on CPU devices" "$td" 60 "$WORK/logs/nccl_ranks_cpu.log" \
		bash "$ROOT/tests/gpu/nccl_ranks.sh" "$td" "$WORK/nccl-ranks" 1 cpu
	# 4. The skip rule, on the CUDA test binary's real output here (no GPU:
	#    every GPU test skips): passes with no GPU seen, fails with one.
	bin=${TR_CHECK_TEST_BINARY:-$CUDA_TESTS}
	if [ ! -x "$bin" ]; then
		row "self-test: skip rule" "FAILED: no CUDA test binary ($bin)"
		FAILED=1
		return
	fi
	if nvidia-smi -L >/dev/null 2>&1; then
		row "self-test: skip rule" "not run: this machine has a GPU"
		return
	fi
	log=$WORK/logs/skiptest.log
	bounded 60 "$bin" --verbose --timeout "$PER_TEST_S" --filter='cuda/m*' >"$log" 2>&1
	local saved_top saved_table saved_failed=$FAILED ok=1
	saved_top=$(cat "$TOP")
	saved_table=$(cat "$TABLE")
	skip_rule probe "$log" 0 || ok=0
	skip_rule probe "$log" 1 && ok=0
	grep -q 'SKIPPED although nvidia-smi sees 1 GPU' "$TOP" || ok=0
	printf '%s\n' "$saved_top" | grep . >"$TOP"
	printf '%s\n' "$saved_table" | grep . >"$TABLE"
	FAILED=$saved_failed
	if [ $ok = 1 ]; then
		row "self-test: skip rule" "ok: $(skip_lines "$log" | wc -l) skips pass with no GPU, fail with one"
	else
		row "self-test: skip rule" "FAILED (logs/skiptest.log)"
		FAILED=1
	fi
}
