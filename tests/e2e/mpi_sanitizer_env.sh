# Sourced by the test scripts that start Open MPI ranks (processes_bits.sh,
# tests/cluster/slurm.sh, tests/k8s/manifest.sh).  Under AddressSanitizer
# (make test-asan): Open MPI's allocations that outlive MPI_Finalize are
# suppressed by library (tests/lsan.supp), which needs its components kept
# loaded and full stacks.  No effect otherwise.
export OMPI_MCA_mca_base_component_disable_dlclose=1 PMIX_MCA_mca_base_component_disable_dlclose=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}fast_unwind_on_malloc=0"
