#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time and reports executions.
#   tests/fuzz/run.sh BUILD_DIR SECONDS_PER_TARGET [TARGET...]
# Seeds come from tests/fuzz/corpus/<target>/ and are not modified: new
# inputs go to BUILD_DIR/fuzz-corpus/<target>/, crashes to
# BUILD_DIR/fuzz-artifacts/ (copy a crash into the seed corpus once fixed:
# the replay tests then keep it).
set -uo pipefail
build=$1 seconds=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(spec safetensors config route data)
mkdir -p "$build/fuzz-artifacts"
failed=0
printf '%-12s %12s %10s %8s\n' target executions exec/s crashes
for t in "${targets[@]}"; do
	bin="$build/tests/fuzz/fuzz_$t"
	work="$build/fuzz-corpus/$t"
	mkdir -p "$work"
	log="$build/fuzz-$t.log"
	"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$build/fuzz-artifacts/$t-" "$work" "$here/corpus/$t" >"$log" 2>&1
	rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
	crashes=0
	if [ $rc -ne 0 ]; then
		crashes=1
		failed=$((failed + 1))
		grep -E "ERROR|SUMMARY|Test unit written" "$log" | head -5
	fi
	printf '%-12s %12s %10s %8s\n' "$t" "${execs:-?}" "${rate:-?}" "$crashes"
done
echo "RESULT: $((${#targets[@]} - failed)) passed, $failed failed"
[ $failed -eq 0 ]
