# kvgate: the commands a developer runs. `make demo` shows what kvgate does; `make test` is what CI
# runs (.ci/run): install what is missing, build, run every test (unit, integration, conformance,
# and the ASan+UBSan build of unit + integration); CI then runs `make fuzz-smoke`. `make
# check-tsan`: unit + integration under ThreadSanitizer (build-tsan/), where any report fails its
# test, and `make check-asan-gcc`: under ASan+UBSan built by GCC 12 (not in CI: they would leave
# no margin in the 30-minute budget; run them before merging changes to state threads share or to
# coroutine code).
JOBS ?= $(shell nproc)
CTEST_FLAGS ?= --output-on-failure -j $(JOBS)

.PHONY: all setup build build-asan build-debug test test-release test-asan demo bench soak \
        fuzz fuzz-smoke format tidy clean

all: build

setup:
	@scripts/setup

build/build.ninja: CMakeLists.txt CMakePresets.json
	@cmake --preset release >/dev/null

build: build/build.ninja
	@cmake --build build -j $(JOBS)

build-debug:
	@cmake --preset debug >/dev/null
	@cmake --build build-debug -j $(JOBS)

# The asan preset is clang with ASan+UBSan and libFuzzer's coverage instrumentation: the same
# tree links the libFuzzer targets (scripts/fuzz), so CI compiles kvgate_lib once for both.
build-asan:
	@cmake --preset asan >/dev/null
	@cmake --build build-asan -j $(JOBS) --target kvgate_unit_integration

# The same tests under ASan+UBSan built by GCC 12 (build-asan-gcc/): CI's ASan build is clang's,
# and GCC 12 miscompiles some coroutine code (temporaries in co_await expressions, references to
# temporaries as coroutine parameters) in ways clang does not; unit.SourceRules catches the known
# shapes, this catches what it does not. Not in CI (its 12 minutes do not fit the budget): run it
# before merging changes to coroutine code, like check-tsan.
.PHONY: check-asan-gcc
check-asan-gcc: setup
	@cmake --preset asan-gcc >/dev/null
	@cmake --build build-asan-gcc -j $(JOBS) --target kvgate_unit_integration
	@cd build-asan-gcc && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest $(CTEST_FLAGS) -L 'unit|integration'

.PHONY: build-tsan check-tsan
build-tsan:
	@cmake --preset tsan >/dev/null
	@cmake --build build-tsan -j $(JOBS) --target kvgate_unit_integration

test-release: build
	@cd build && ctest $(CTEST_FLAGS) -L 'unit|integration|conformance'

test-asan: build-asan
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest $(CTEST_FLAGS) -L 'unit|integration'

# Every process of a test (the test binary, and the kvgate / kvgate-sim / kvgate-bench it starts,
# which inherit the environment) stops at its first report with exit status 66: the test fails
# on the status (tests/support/cluster.cc checks kvgate's and kvgate-sim's exit).
TSAN_OPTIONS_CHECK = halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp

check-tsan: setup build-tsan
	@cd build-tsan && TSAN_OPTIONS=$(TSAN_OPTIONS_CHECK) ctest $(CTEST_FLAGS) -L 'unit|integration'

test: setup
	@$(MAKE) --no-print-directory test-release
	@$(MAKE) --no-print-directory test-asan
	@echo "make test: all tests passed (release + ASan/UBSan)"

demo: setup build
	@scripts/demo

bench: setup build
	@scripts/bench

# 30 minutes of mixed streaming traffic with a fault every minute (not in CI): out/soak/report.md.
soak: setup build
	@scripts/soak

fuzz:
	@scripts/fuzz

# CI's bounded fuzzing: every libFuzzer target (clang, ASan+UBSan, linked in build-asan/, which
# make test compiled) for FUZZ_SMOKE_SECS seconds from its committed corpus. make test already
# replays each corpus in the release and ASan builds.
FUZZ_SMOKE_SECS ?= 10
fuzz-smoke: setup
	@FUZZ_SECS=$(FUZZ_SMOKE_SECS) scripts/fuzz

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

tidy: build
	@git ls-files 'src/*.cc' 'sim/*.cc' 'bench/*.cc' | xargs -P $(JOBS) -n 4 clang-tidy -p build --quiet --extra-arg=-Wno-unknown-warning-option

clean:
	@rm -rf build build-asan build-asan-gcc build-tsan build-debug build-fuzz
