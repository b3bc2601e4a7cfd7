# Thin wrapper over meson: `make run`, `make test`, `make bench`.
BUILD ?= build
MESON_FLAGS ?=
TRAINERD = $(BUILD)/daemon/trainerd

.PHONY: all deps build run train test test-asan test-tsan test-reliability fuzz bench format format-check clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	meson setup $(BUILD) $(MESON_FLAGS)

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

# Starts the daemon in the foreground (state in ./var, CPU devices when no
# GPU); on first start it submits the quickstart job.  Ctrl-C stops it.
run: build
	$(TRAINERD) serve --state-dir var --submit-if-empty examples/quickstart.json

# One job in the foreground without the daemon, with a live progress bar.
train: build
	$(TRAINERD) run examples/quickstart.json --out out/quickstart

test: build
	python3 tests/run_tests.py $(BUILD)

# The full reliability suite (tests/reliability/README.md): 20 SIGKILLs
# with restarts, two 30 s load rounds, every fault, the memory attacks under
# a 4 GiB limit; first the fuzz targets
# (`make fuzz`) when tests/fuzz/run.sh exists.  `make test` runs a bounded part of it.
test-reliability: build
	[ ! -x tests/fuzz/run.sh ] || $(MAKE) fuzz
	tests/reliability/run.sh $(TRAINERD) --full

# The suite under AddressSanitizer+UBSan and under ThreadSanitizer, CPU only.
test-asan: deps
	[ -f build-asan/build.ninja ] || meson setup build-asan -Dcuda=disabled -Db_sanitize=address,undefined -Db_lundef=false
	ninja -C build-asan
	python3 tests/run_tests.py build-asan

test-tsan: deps
	[ -f build-tsan/build.ninja ] || meson setup build-tsan -Dcuda=disabled -Db_sanitize=thread
	ninja -C build-tsan
	python3 tests/run_tests.py build-tsan

# libFuzzer (clang) with ASan+UBSan: each target runs FUZZ_SECONDS and the
# executions per target are printed (tests/fuzz/README.md).
FUZZ_SECONDS ?= 60
fuzz: deps
	[ -f build-fuzz/build.ninja ] || CC=clang meson setup build-fuzz -Dcuda=disabled -Dfuzz=true \
		-Db_sanitize=address,undefined -Db_lundef=false -Dwerror=false
	ninja -C build-fuzz tests/fuzz/fuzz_spec tests/fuzz/fuzz_safetensors tests/fuzz/fuzz_config tests/fuzz/fuzz_route \
		tests/fuzz/fuzz_data
	tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

bench: build
	bench/run.sh $(BUILD)

# clang-format 14 with .clang-format over the C and CUDA sources
# (docs/design.md, "Code style"): `format` rewrites the files that differ,
# `format-check` names them and fails (`make test` runs it too).
format:
	scripts/format.sh

format-check:
	scripts/format.sh --check

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
