# shellcheck shell=bash disable=SC2034  # sourced by check.sh, whose variables it sets
# tests/gpu/report.sh: sourced by tests/gpu/check.sh.  Writes report.md
# when the check ends, however it ends: the verdict and what must be read
# first (missing prerequisites, skip reasons) above the stage table.
#
# Report (REPORT_DIR; few files, to collect as they are):
#   report.md       verdict, headlines, stages, environment, failures, benchmarks
#   build.log       meson and ninja output
#   cuda_tests.log  the CUDA tests; cuda_alone.log, cuda_large.log their stages of
#                   their own (cuda_multi.log with 2+ GPUs)
#   sanitizer.log   compute-sanitizer memcheck and synccheck
#   daemon_jobs.log tests/gpu/daemon_jobs.py: 20 jobs, device memory drift
#   RESULTS.md      a draft of bench/gpu/RESULTS.md: the figures and benchmarks
#   bench.md, bench.json   bench/gpu/bench_gpu.py results
#   logs.tar.gz     everything else (dependency notes, benchmark runs)

write_report() {
	local f
	{
		echo "# trainerd GPU check ($MODE), $(date -u '+%Y-%m-%d %H:%M UTC')"
		echo ""
		echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo ' (with local changes)')"
		echo ""
		echo "**verdict: $([ "$FAILED" -eq 0 ] && echo PASS || echo FAIL)**, $((SECONDS - START)) s"
		echo ""
		if [ -s "$TOP" ]; then
			cat "$TOP"
			echo ""
		fi
		echo "| stage | result | time |"
		echo "| --- | --- | --- |"
		cat "$TABLE"
		echo ""
		cat "$WORK/environment.md" 2>/dev/null
		for f in cuda_tests cuda_alone cuda_large cuda_multi; do
			[ -f "$REPORT/$f.log" ] || continue
			echo ""
			echo "## $f.log"
			echo '```'
			# Criterion's own lines, without the duplicate "[SKIP]
			# <suite>_<test>_impl" lines and the filtered-out tests
			grep -E '^\[(FAIL|SKIP|====)\]|Assertion|failed' "$REPORT/$f.log" |
				grep -v -e '_impl: ' -e 'Test is disabled' | head -60
			echo '```'
		done
		if cat "$REPORT"/cuda_*.log "$REPORT"/daemon_jobs.log 2>/dev/null | grep -q '^\[FIGURE\]'; then
			echo ""
			echo "## Figures"
			echo '```'
			cat "$REPORT"/cuda_*.log "$REPORT"/daemon_jobs.log 2>/dev/null | grep '^\[FIGURE\]' | sort -u
			echo '```'
		fi
		[ -f "$REPORT/sanitizer.log" ] && {
			echo ""
			echo "## compute-sanitizer"
			echo '```'
			grep -E 'ERROR SUMMARY|^========= (Invalid|Program hit|Race|Barrier)' "$REPORT/sanitizer.log" | head -40
			echo '```'
		}
		[ -f "$FAILURES" ] && [ -s "$FAILURES" ] && {
			echo ""
			echo "## Failures"
			cat "$FAILURES"
		}
		[ -f "$WORK/bench/bench.md" ] && {
			echo ""
			cat "$WORK/bench/bench.md"
		}
		[ -f "$WORK/plan.txt" ] && {
			echo ""
			echo "## Plan"
			echo '```'
			cat "$WORK/plan.txt"
			echo '```'
		}
	} >"$MD"
	[ -f "$WORK/bench/bench.md" ] && cp "$WORK/bench/bench.md" "$WORK/bench/bench.json" "$REPORT/" 2>/dev/null
	[ "$MODE" = run ] && write_results_draft
	local items=(logs)
	[ -d "$WORK/bench/runs" ] && items+=(bench/runs)
	tar -czf "$REPORT/logs.tar.gz" -C "$WORK" "${items[@]}" 2>/dev/null
	# a rehearsal under make test: its log explains itself
	[ "$MODE" = rehearse ] && sed '/^## Plan/,$d' "$MD"
	log "report in $MD: $([ "$FAILED" -eq 0 ] && echo PASS || echo FAIL)"
}

# The run's figures (the tests' [FIGURE] lines, the daemon jobs' memory
# drift, the benchmark table) as a draft of bench/gpu/RESULTS.md, to be
# read and committed by hand: figures of record need a person's look.
write_results_draft() {
	{
		echo "# GPU results"
		echo ""
		echo "From \`tests/gpu/check.sh\` on $(date -u '+%Y-%m-%d'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), verdict $([ "$FAILED" -eq 0 ] && echo PASS || echo FAIL)."
		echo ""
		cat "$WORK/environment.md" 2>/dev/null
		echo ""
		echo "## Figures from the tests"
		echo ""
		cat "$REPORT"/cuda_*.log "$REPORT"/daemon_jobs.log 2>/dev/null | sed -n 's/^\[FIGURE\] /- /p' | sort -u
		echo ""
		echo "## Benchmarks (bench/gpu/run.sh --quick)"
		echo ""
		cat "$WORK/bench/bench.md" 2>/dev/null || echo "not run"
	} >"$REPORT/RESULTS.md"
}
