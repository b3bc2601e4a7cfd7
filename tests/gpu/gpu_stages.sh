# shellcheck shell=bash disable=SC2034  # sourced by check.sh, whose variables it sets
# tests/gpu/gpu_stages.sh: sourced by tests/gpu/check.sh.  The stages that
# need a GPU, in the order of what they teach per second: the CUDA tests,
# NCCL (one rank, then GPU ranks), compute-sanitizer's memcheck and synccheck, the benchmarks.  In a
# rehearsal (PLAN_ONLY=1) `stage` prints them instead.
#
# Needs: BUILD, ROOT, REPORT, WORK, CUDA_TESTS, SANITIZER (may be empty).

# Every CUDA test's own limit (Criterion --timeout, and the .timeout of the
# tests in tests/unit/engine/test_cuda_backend.c): well inside any stage's.
PER_TEST_S=60

# cuda_tests_stage NAME LIMIT_S LOG GPUS CRITERION_ARGS...: the CUDA test
# binary through `stage`, then the skip rule (tests/gpu/skips.sh).
cuda_tests_stage() {
	local name=$1 limit=$2 logf=$3 gpus=$4
	shift 4
	stage "$name" "$limit" "$logf" "$CUDA_TESTS" --verbose --timeout "$PER_TEST_S" "$@"
	[ "$PLAN_ONLY" = 1 ] || skip_rule "$name" "$logf" "$gpus"
}

gpu_stages() {
	local gpus=$1
	if [ "$PLAN_ONLY" != 1 ] && [ ! -x "$CUDA_TESTS" ]; then
		row "CUDA backend tests" "FAILED: $CUDA_TESTS was not built (build.log)"
		headline "the CUDA test binary was not built: see build.log"
		FAILED=1
	else
		# Single-device tests in parallel, but for the two suites that get a
		# stage of their own below; the NCCL ones (2+ GPUs) one at a time,
		# so that no two processes' communicators compete for the same GPUs
		# and the abort test's timing is its own.
		cuda_tests_stage "CUDA backend tests" 150 "$REPORT/cuda_tests.log" "$gpus" \
			--filter='!(cuda_multi|cuda_alone|cuda_large)/*'
		# NCCL through a real one-rank communicator: 20 create/allreduce/
		# destroy and 20 create/abort rounds against free device memory,
		# which is the whole GPU's, so nothing else runs meanwhile.
		cuda_tests_stage "NCCL one rank, memory figures (alone)" 60 "$REPORT/cuda_alone.log" "$gpus" --jobs 1 --filter='cuda_alone/*'
		# GPU ranks (engine/comm_group.h): NCCL's cross-process path on one
		# GPU, and on 2+ GPUs two devices and two processes (mpirun), each
		# against one GPU's SHA-256 of model.safetensors (every run 60 s at
		# most).
		if [ "$PLAN_ONLY" = 1 ] || [ -x "$BUILD/daemon/trainerd" ]; then
			stage "NCCL ranks: SHA-256 against one GPU" 90 "$REPORT/nccl_ranks.log" \
				bash "$ROOT/tests/gpu/nccl_ranks.sh" "$BUILD/daemon/trainerd" "$WORK/nccl-ranks" "$gpus" cuda
			[ "$PLAN_ONLY" = 1 ] ||
				row "NCCL ranks, runs" "$(grep -hE '^(RESULT|NOT RUN)' "$REPORT/nccl_ranks.log" | tr '\n' ' ')"
		fi
		# More than 2^31 elements (26 GiB of device memory) and softmax over
		# 100,003 rows, against the CPU.
		cuda_tests_stage "large sizes" 90 "$REPORT/cuda_large.log" "$gpus" --jobs 2 --filter='cuda_large/*'
		if [ "$gpus" -ge 2 ]; then
			cuda_tests_stage "CUDA multi-GPU tests (serial)" 90 "$REPORT/cuda_multi.log" "$gpus" \
				--jobs 1 --filter='cuda_multi/*'
		else
			if [ "$PLAN_ONLY" = 1 ]; then
				echo "  (multi-GPU tests: not run with one GPU)"
			else
				row "CUDA multi-GPU tests" "not run: one GPU"
			fi
		fi
		# compute-sanitizer follows Criterion's worker processes; the kernel
		# tests (suite cuda) only: whole jobs under memcheck take minutes.
		if [ -n "$SANITIZER" ] || [ "$PLAN_ONLY" = 1 ]; then
			stage "compute-sanitizer memcheck (suite cuda)" 100 "$REPORT/sanitizer.log" \
				"${SANITIZER:-compute-sanitizer}" --tool memcheck --error-exitcode 1 --print-limit 20 \
				"$CUDA_TESTS" --timeout "$PER_TEST_S" --jobs 4 --filter='cuda/*'
			stage "compute-sanitizer synccheck (suite cuda)" 70 "$REPORT/sanitizer.log" \
				"${SANITIZER:-compute-sanitizer}" --tool synccheck --error-exitcode 1 --print-limit 20 \
				"$CUDA_TESTS" --timeout "$PER_TEST_S" --jobs 4 --filter='cuda/*'
		else
			row "compute-sanitizer" "FAILED: not found beside nvcc or on PATH"
			headline "compute-sanitizer not found: memcheck and synccheck did not run"
			FAILED=1
		fi
	fi
	if [ "$PLAN_ONLY" = 1 ] || [ -x "$BUILD/daemon/trainerd" ]; then
		# 20 jobs through a real daemon (an out-of-memory job, a bad label,
		# a mid-step cancel among them): no drift in free device memory.
		stage "daemon: 20 jobs, device memory drift" 90 "$REPORT/daemon_jobs.log" \
			python3 "$ROOT/tests/gpu/daemon_jobs.py" "$BUILD/daemon/trainerd" "$WORK/daemon-jobs" --backend cuda
		stage "GPU benchmarks (quick)" 120 "$WORK/logs/bench.log" \
			sh "$ROOT/bench/gpu/run.sh" "$BUILD" "$WORK/bench" --quick
	else
		row "GPU benchmarks" "FAILED: trainerd was not built (build.log)"
		FAILED=1
	fi
}
