#!/usr/bin/env bash
# The reliability suite (tests/reliability/README.md): the crash loop, the
# load run, the faults and the memory attacks against the built daemon (`make test-reliability`
# also runs the fuzz targets when tests/fuzz/run.sh exists).  Prints each part's
# checks, the merged figures, and one closing line
# `RESULT: N passed, M failed` (tests/run_tests.py reads it).
# Usage: run.sh TRAINERD [--full]   (run from the repository root)
# Bounded (the default, part of `make test`): about a minute and a half.
# --full (`make test-reliability`): 20 SIGKILLs, two 30 s load rounds, every
# fault, every memory attack.
set -u
TRAINERD=$(realpath "${1:?usage: run.sh TRAINERD [--full]}")
full=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
[ -x "$python" ] || python=python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0
fail=0
parts="crash_loop load faults memory"
# A sanitizer build cannot start under the memory part's address-space
# limit, and its peak RSS is the sanitizer's: that part runs on plain builds.
if [ -n "${TR_RELIABILITY_SANITIZED:-}" ]; then
	parts="crash_loop load faults"
	echo "== memory: skipped (a sanitizer build: it cannot run under an address-space limit)"
fi
for part in $parts; do
	start=$(date +%s)
	"$python" "$here/$part.py" "$TRAINERD" $full --figures "$work/$part.json" >"$work/$part.out" 2>&1
	rc=$?
	# The parts' own closing lines are renamed so that the one below is
	# the only RESULT line.
	sed 's/^RESULT:/'"$part"':/' "$work/$part.out"
	line=$(grep -E '^RESULT: [0-9]+ passed, [0-9]+ failed' "$work/$part.out" | tail -1)
	if [ -n "$line" ]; then
		p=$(echo "$line" | sed -E 's/RESULT: ([0-9]+) passed.*/\1/')
		f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed/\1/')
		pass=$((pass + p))
		fail=$((fail + f))
		[ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && fail=$((fail + 1))
	else
		echo "FAIL: $part ended without its result (exit status $rc)" >&2
		fail=$((fail + 1))
	fi
	echo "== $part: $(($(date +%s) - start)) s"
done
# The figures of all parts, summed where they share a name.
"$python" - "$work" <<'PY'
import json, os, sys
total = {}
for part in ("crash_loop", "load", "faults", "memory"):
    p = os.path.join(sys.argv[1], part + ".json")
    if not os.path.exists(p):
        continue
    for k, v in json.load(open(p)).items():
        if isinstance(v, (int, float)) and k in total and not isinstance(total[k], list):
            total[k] += v
        else:
            total[k] = v
print("FIGURES " + json.dumps(total, sort_keys=True))
PY
echo "RESULT: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
