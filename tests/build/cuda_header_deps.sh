#!/bin/bash
# tests/build/cuda_header_deps.sh NINJA SOURCE_ROOT BUILD_DIR OBJECT...
#
# Every object of the CUDA module must depend on the project headers its
# .cu includes (engine/cuda/meson.build compiles each with nvcc's own
# dependency file).  Before that, meson's CUDA support asked nvcc for no
# dependency file, ninja recorded none and rebuilt an object only when its
# .cu changed: after a header change the module's files disagreed about
# it.  Reads ninja's dependency log of BUILD_DIR, filled when the objects
# were built; prints `RESULT: N passed, M failed`.
set -u
ninja=$1 src=$2 build=$3
shift 3
pass=0 fail=0
for obj in "$@"; do
	rel=${obj#"$build"/}
	cu=$src/engine/cuda/$(basename "$rel" .o)
	deps=$("$ninja" -C "$build" -t deps "$rel" 2>&1)
	# what it includes itself, and what every one includes through them
	headers=$(sed -n 's/^#include "\(engine\/[^"]*\)".*/\1/p' "$cu")
	if [ -z "$headers" ]; then
		echo "FAIL $rel: $cu includes no project header (wrong source?)"
		fail=$((fail + 1))
		continue
	fi
	missing=
	for h in $headers engine/cuda/cuda_internal.h engine/backend.h; do
		grep -q "/$h\$" <<<"$deps" || missing="$missing $h"
	done
	if [ -n "$missing" ]; then
		echo "FAIL $rel: not rebuilt when these change:$missing"
		echo "$deps" | head -3
		fail=$((fail + 1))
	else
		echo "ok $rel: $(grep -c . <<<"$deps") dependencies recorded"
		pass=$((pass + 1))
	fi
done
echo "RESULT: $pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
