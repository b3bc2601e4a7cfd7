#!/usr/bin/env bash
# The Python examples run with Debian's /usr/bin/python3 (a python3 of a
# virtual environment first on PATH lacks the Debian packages): each
# script's first line names it, the README's table lists it, and its
# imports resolve under it.  Skipped (exit 77) without /usr/bin/python3.
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
	# Only its import statements run: a script may write files.
	/usr/bin/python3 - "$f" >/dev/null 2>"$work/err" <<'PY'
import ast
import os
import sys
path = sys.argv[1]
sys.path.insert(0, os.path.dirname(path))
for node in ast.parse(open(path).read()).body:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        exec(compile(ast.Module([node], []), path, "exec"))
PY
	check "$f: its imports resolve under /usr/bin/python3" test $? -eq 0
done
finish
