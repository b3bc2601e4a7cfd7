# shellcheck shell=bash disable=SC2034  # sourced by check.sh, whose variables it sets
# tests/gpu/stage.sh: sourced by tests/gpu/check.sh.  Runs the check's
# stages under a time limit that ends every process a stage started, and
# keeps the report's table, its headline lines and the failures' excerpts.
#
# Needs: WORK (scratch folder), BUDGET (seconds for all stages), START
# ($SECONDS at the start), PLAN_ONLY (1: print what would run, run nothing).

FAILED=0
TABLE=$WORK/table.md
TOP=$WORK/top.md
FAILURES=$WORK/failures.md
: >"$TABLE"
: >"$TOP"

log() { echo "[check] $*" >&2; }
row() { echo "| $1 | $2 | ${3:-} |" >>"$TABLE"; }
# A line for the top of the report: what a reader must see first.
headline() { echo "- $*" >>"$TOP"; }
left() { echo $((BUDGET - (SECONDS - START))); }

# Every descendant of pid $1 (children first found, then theirs), read
# from /proc, so that a process that left the stage's process group (a
# setsid of its own) is found while its parent lives.
descendants() {
	local p
	# shellcheck disable=SC2013  # the file holds pids separated by spaces
	for p in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
		echo "$p"
		descendants "$p"
	done
	return 0
}

# Ends a stage's processes: its session (the stage leader is a session
# and process group leader through setsid) and every descendant found
# through /proc, TERM first, then KILL for whatever is still alive after
# 5 s (pids gathered in both rounds: a child orphaned by the first is
# still in the list).
kill_stage() {
	local leader=$1 pids i
	pids="$leader $(descendants "$leader")"
	kill -s TERM -- -"$leader" 2>/dev/null
	# shellcheck disable=SC2086  # a list of pids
	kill -s TERM $pids 2>/dev/null
	for i in $(seq 1 25); do
		alive "$leader" "$pids" || return 0
		pids="$pids $(descendants "$leader")"
		sleep 0.2
	done
	kill -s KILL -- -"$leader" 2>/dev/null
	# shellcheck disable=SC2086
	kill -s KILL $pids 2>/dev/null
	return 0
}

# alive LEADER PIDS: true while a process of the session LEADER or of
# PIDS runs (zombies, which wait for their parent's wait, do not count).
# Read from /proc/*/stat without forking: no procps needed on a bare machine.
alive() {
	local leader=$1 list=" $2 " f line pid
	for f in /proc/[0-9]*/stat; do
		read -r line 2>/dev/null <"$f" || continue
		pid=${f#/proc/}
		pid=${pid%/stat}
		# after the command's name, in parentheses: state ppid pgrp session
		line=${line##*) }
		# shellcheck disable=SC2086  # the fields, split on purpose
		set -- $line
		[ "$1" = Z ] && continue
		[ "$4" = "$leader" ] && return 0
		case $list in *" $pid "*) return 0 ;; esac
	done
	return 1
}

# bounded LIMIT_S CMD...: runs CMD in a session of its own (a process
# group whose id is its pid) and waits at most LIMIT_S seconds; then ends
# the whole group and its descendants and returns 124.  A stage that ends
# by itself also has its group ended, so that nothing it left behind (a
# daemon, a hung worker) holds the GPU into the next stage.
bounded() {
	local limit=$1 pid end rc
	shift
	setsid "$@" &
	pid=$!
	# by the clock, not by counting sleeps (which a loaded machine stretches)
	end=$((SECONDS + limit))
	while kill -0 "$pid" 2>/dev/null; do
		if [ $SECONDS -ge $end ]; then
			kill_stage "$pid"
			wait "$pid" 2>/dev/null
			return 124
		fi
		sleep 0.2
	done
	wait "$pid"
	rc=$?
	kill -s KILL -- -"$pid" 2>/dev/null
	return $rc
}

# stage NAME LIMIT_S LOGFILE CMD...: runs CMD through bounded, its limit
# trimmed to the budget left, appending to LOGFILE; records the verdict.
# With PLAN_ONLY=1 it prints the stage and runs nothing.
stage() {
	local name=$1 limit=$2 logf=$3 l t0 rc
	shift 3
	if [ "${PLAN_ONLY:-0}" = 1 ]; then
		printf '  %-44s up to %4s s: %s\n' "$name" "$limit" "$*" | sed "s|$WORK|\$WORK|g; s|$ROOT|\$ROOT|g"
		PLANNED=$((${PLANNED:-0} + limit))
		return 0
	fi
	l=$(left)
	if [ "$l" -lt 20 ]; then
		row "$name" "skipped: budget spent"
		log "$name: skipped (budget spent)"
		FAILED=1
		return 125
	fi
	[ "$limit" -gt "$l" ] && limit=$l
	log "$name (up to ${limit}s)"
	echo "==== $name: $*" >>"$logf"
	t0=$SECONDS
	bounded "$limit" "$@" >>"$logf" 2>&1 </dev/null
	rc=$?
	if [ $rc -eq 0 ]; then
		row "$name" ok "$((SECONDS - t0)) s"
		return 0
	elif [ $rc -eq 124 ]; then
		row "$name" "TIMED OUT after ${limit}s (process group ended)" "$((SECONDS - t0)) s"
	else
		row "$name" "FAILED (exit $rc)" "$((SECONDS - t0)) s"
	fi
	FAILED=1
	failure_excerpt "$name" "$logf"
	return $rc
}

failure_excerpt() {
	{
		echo "### $1: last lines of $(basename "$2")"
		echo '```'
		tail -20 "$2"
		echo '```'
	} >>"$FAILURES"
}
