#!/usr/bin/env python3
"""Runs every test meson knows about and prints one closing line,
`tests: N passed, M failed`.

Criterion executables report their own counts ("Synthesis: Tested: ..."),
shell tests print "RESULT: N passed, M failed"; anything that exits
non-zero without such a line counts as one failure.  Output of failing
programs is shown so CI logs explain themselves.
"""
import json
import os
import re
import subprocess
import sys
import time

build = sys.argv[1] if len(sys.argv) > 1 else "build"
suites = sys.argv[2:]
tests = json.loads(subprocess.check_output(["meson", "introspect", "--tests", build]))

SYNTH = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")
SANITIZER = re.compile(r"ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:|WARNING: ThreadSanitizer")
RESULT = re.compile(r"^RESULT: (\d+) passed, (\d+) failed", re.M)

passed = failed = 0
for t in tests:
    # meson names suites "project:suite"; accept either form.
    names = set(t.get("suite", [])) | {x.split(":")[-1] for x in t.get("suite", [])}
    if suites and not any(s in names or s == t["name"] for s in suites):
        continue
    env = dict(os.environ)
    env.update(t.get("env") or {})
    # Criterion's own runner leaks under parallel timeouts (tests/lsan.supp).
    env.setdefault("LSAN_OPTIONS", "suppressions=" + os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                  "lsan.supp") + ":print_suppressions=0")
    # Uninstrumented third-party libraries under ThreadSanitizer (tests/tsan.supp).
    env.setdefault("TSAN_OPTIONS", "suppressions=" + os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                  "tsan.supp") + ":print_suppressions=0")
    start = time.time()
    try:
        p = subprocess.run(t["cmd"], cwd=t.get("workdir") or None, env=env, capture_output=True, text=True,
                           timeout=t.get("timeout") or 600)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        out += "\n*** timed out ***"
        rc = -1
    took = time.time() - start
    m = SYNTH.search(out)
    r = RESULT.search(out)
    if m:
        tested, ok = int(m.group(1)), int(m.group(2))
        bad = int(m.group(3)) + int(m.group(4))
        # Criterion counts a crashed test in Tested but not in Passing.
        bad = max(bad, tested - ok)
    elif r:
        ok, bad = int(r.group(1)), int(r.group(2))
    else:
        ok, bad = (1, 0) if rc == 0 else (0, 1)
    if rc != 0 and bad == 0:
        bad = 1  # a non-zero exit is never a pass
    # Criterion reports a test that leaked or raced as passed: the sanitizer
    # report in the output is what counts.
    if SANITIZER.search(out) and bad == 0:
        bad = 1
        ok = max(ok - 1, 0)
    passed += ok
    failed += bad
    status = "ok" if bad == 0 else "FAIL"
    print(f"{status:4} {t['name']:40} {ok} passed, {bad} failed  ({took:.1f} s)", flush=True)
    if bad:
        print("---- output of " + t["name"] + " ----")
        print(out[-20000:])
        print("---- end ----", flush=True)

print(f"tests: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
