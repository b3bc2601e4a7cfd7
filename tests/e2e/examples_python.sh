#!/usr/bin/env bash
# The Python examples run with Debian's /usr/bin/python3 (a python3 of a
# virtual environment first on PATH lacks the Debian packages): each
# script's first line names it, the README's table lists it, and it starts
# under it (its imports resolve: a usage error is fine, a missing module
# is not).  Skipped (exit 77) without /usr/bin/python3.
# Usage: examples_python.sh   (run from the repository root)
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if ! [ -x /usr/bin/python3 ]; then
	echo "examples_python: skipped, no /usr/bin/python3"
	exit 77
fi
make_work
for f in examples/*.py; do
	check "$f: its first line is #!/usr/bin/python3" test "$(head -n1 "$f")" = "#!/usr/bin/python3"
	check "$f: executable" test -x "$f"
	check "$f: the README lists what it needs" grep -q "^| \`$f\` | " README.md
	(cd examples && /usr/bin/python3 "$(basename "$f")" --no-such-option) >/dev/null 2>"$work/err"
	check "$f: its imports resolve under /usr/bin/python3" test -z "$(grep -E 'ModuleNotFoundError|ImportError' "$work/err")"
done
finish
