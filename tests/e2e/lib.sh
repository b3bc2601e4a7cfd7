# Shared by the whole-program test scripts (sourced, not run): one check
# counter and the closing line tests/run_tests.py reads, the temporary
# folder and the python3 the scripts use.
pass=0
fail=0
check() { # check NAME COMMAND...: counts COMMAND's success under NAME
	local name=$1
	shift
	if "$@"; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "FAIL: $name" >&2
	fi
}
has() { grep -q -- "$2" "$1"; } # has FILE PATTERN
# Prints the closing line; the script's status is whether nothing failed.
finish() {
	echo "RESULT: $pass passed, $fail failed"
	[ "$fail" -eq 0 ]
}
# Makes $work, a temporary folder removed when the script exits (kept when
# KEEP is set, to look into after a failure).
make_work() {
	work=$(mktemp -d)
	trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
}
# Sets $py to Debian's python3 (it has the Debian packages the checks
# import), else the one on PATH.
find_python() {
	py=/usr/bin/python3
	[ -x "$py" ] || py=python3
}
# need_numpy SCRIPT: find_python, and without numpy, ends the script as one
# failed check that says what to install.
need_numpy() {
	find_python
	"$py" -c 'import numpy' 2>/dev/null && return 0
	echo "$1: needs python3-numpy (scripts/install-deps.sh installs it)" >&2
	echo "RESULT: 0 passed, 1 failed"
	exit 1
}
# skip_without SCRIPT MODULE...: find_python, and without one of the
# Python modules, ends the script as skipped (exit 77) naming the Debian
# packages (python3-MODULE) to install.
skip_without() {
	local name=$1
	shift
	find_python
	local m
	for m in "$@"; do
		"$py" -c "import $m" 2>/dev/null && continue
		echo "$name: skipped, needs python3-$m (scripts/install-deps.sh installs it)"
		exit 77
	done
}
