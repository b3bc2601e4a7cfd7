# Shared by the whole-program test scripts (sourced, not run): one check
# counter and the closing line tests/run_tests.py reads.
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
