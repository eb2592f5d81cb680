# The two commands of the README: `make demo` and `make test`. Each installs
# the Debian packages it needs (skipped when present), then builds.
MAKEFLAGS += --no-print-directory
BUILD  ?= build
JOBS   ?= $(shell nproc)
PYTHON := /usr/bin/python3

# Build needs: compiler, CMake, Highway (SIMD with runtime dispatch), CLI11,
# nlohmann-json (safetensors headers), stb (PNG pictures; found with pkg-config),
# and WenQuanYi Micro Hei, the font of PNG text (it covers Chinese; 5 MB, where
# fonts-noto-cjk takes 90 MB), read at run time.
BUILD_DEBS := g++ cmake make ninja-build pkg-config libhwy-dev libcli11-dev nlohmann-json3-dev libstb-dev \
              fonts-wqy-microhei
# Python module: pybind11 and NumPy under Debian's /usr/bin/python3; pip,
# venv, setuptools, wheel and build for installing it as a package.
PY_DEBS    := python3-dev python3-pybind11 python3-numpy python3-pip python3-venv \
              python3-setuptools python3-wheel python3-build
# Context parallelism (attn::dist, attn.dist): Open MPI and mpi4py.
MPI_DEBS   := libopenmpi-dev openmpi-bin python3-mpi4py
# Test needs on top: GoogleTest, pytest, PyTorch as a test-only reference,
# clang with its sanitizer and libFuzzer runtimes for the checked build, and
# dpkg-dev (dpkg-shlibdeps) for the Debian packages.
TEST_DEBS  := libgtest-dev python3-pytest python3-torch clang-14 libclang-rt-14-dev dpkg-dev \
              $(MPI_DEBS)
# Benchmarks: Google Benchmark for the kernel microbenchmarks; OpenBLAS so
# that the NumPy and PyTorch baselines run on a fast BLAS.
BENCH_DEBS := libbenchmark-dev libopenblas0-pthread

# The checked build: library and C++ tests under AddressSanitizer and
# UndefinedBehaviorSanitizer (any report fails), plus the libFuzzer targets.
ASAN_BUILD   ?= build-asan
TSAN_BUILD   ?= build-tsan
FUZZ_SECONDS ?= 60
# make test fuzzes each target this long (the issue asks for at least 20 s).
TEST_FUZZ_SECONDS ?= 20
# The Highway targets make test compiles, each once where another build does
# not: the Release build compiles and tests every x86 target (AVX3, AVX2,
# SSE4, SSSE3, EMU128: the kernel tests force each in turn). The ASan build
# keeps two (the TSan build, its baseline alone: TSAN_OPT_FLAGS). SSE4:
# partial vectors through a buffer, as SSSE3's, AVX2's and EMU128's
# (HWY_MEM_OPS_MIGHT_FAULT). And the widest target this CPU runs: AVX3
# (masked loads and stores, the bf16 and int8 units' AVX-512 code), or on a
# CPU without AVX-512 (Highway's AVX3 asks its F, VL, DQ and BW), where AVX3
# would never run, AVX2 (its own decode paths: q8_0 and q4_0 blocks of four
# vectors, one row's keys four at a time). SSE4 is
# their baseline (-msse4.2 -mpclmul -maes,
# what Highway's SSE4 target asks), so that they leave out EMU128, the
# portable fallback compiled below the baseline: under ASan and UBSan its
# emulated lanes took 70 s of decode.cc's 101 s to compile, against 50 s
# for AVX3 and SSE4 together. make test's Arm build keeps NEON, the target
# its emulated CPUs run; make test-arm builds and runs SVE too.
CPU_RUNS_AVX3 := $(shell grep -m1 '^flags' /proc/cpuinfo | grep -w avx512f | grep -w avx512vl | grep -w avx512dq | grep -qw avx512bw && echo yes)
SANITIZER_HWY_DISABLED := HWY_SSSE3|$(if $(CPU_RUNS_AVX3),HWY_AVX2,HWY_AVX3)
# Reports need files and lines, not variables: line tables only, quicker to
# build than full debug info for every Highway target (both sanitizer builds).
SANITIZER_OPT_FLAGS := -O2 -gline-tables-only -DNDEBUG -msse4.2 -mpclmul -maes
# ThreadSanitizer's tests force no target: the threads of the dispatcher's
# choice run, so the TSan build compiles one, the baseline (SSE4).
TSAN_OPT_FLAGS := $(SANITIZER_OPT_FLAGS) -DHWY_COMPILE_ONLY_STATIC
ARM_TEST_HWY_DISABLED  := HWY_SVE|HWY_SVE2|HWY_SVE_256|HWY_SVE2_128
SANITIZER_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
# The attn::dist tests under mpirun: the same, with the allocations of Open
# MPI's threads suppressed (tests/dist/lsan.supp). Their stacks pass through
# its libraries, built without frame pointers, so they are unwound from
# debug info, and only 8 frames deep, which reach them (tests/dist/main.cc):
# all 30 frames took 4 ranks 19.8 s against 13.2 (AMD EPYC Zen 4).
MPI_SANITIZER_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0:malloc_context_size=8 \
                     LSAN_OPTIONS=suppressions=$(CURDIR)/tests/dist/lsan.supp UBSAN_OPTIONS=print_stacktrace=1

.PHONY: all build configure demo web test-web web-screenshot test test-add-subdirectory bench bench-ort bench-report arm-build test-arm test-arm-kernels package-arm deps test-deps clean asan fuzz fuzz-build tsan package

all: build

# Each build folder is configured for Ninja: one graph for every target asked,
# where CMake's Makefiles built the targets of one `cmake --build --target A B`
# one after another (each fuzzer's link left a core idle). A folder configured
# before keeps its generator.
generator = $(if $(wildcard $(1)/CMakeCache.txt),,-G Ninja)

deps:
	@tools/install-deps.sh $(BUILD_DEBS) $(PY_DEBS)

test-deps:
	@tools/install-deps.sh $(BUILD_DEBS) $(PY_DEBS) $(TEST_DEBS)

# Configuring again each time is cheap and picks up packages installed since.
configure:
	cmake $(call generator,$(BUILD)) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=$(PYTHON) >/dev/null

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/bin/attn demo

# The article as a page (web/), computed by attn compiled to WebAssembly with
# Debian's Emscripten, in $(BUILD)/web/: open it from any static server, e.g.
# python3 -m http.server -d build/web. Its build folder is $(WEB_BUILD)/,
# with Highway's source (tools/highway-source.sh). Emscripten's tools run
# under the machine's node, which finds Debian's node packages (acorn) on
# NODE_PATH. Its Debian packages: Emscripten; dpkg-dev, which unpacks
# Highway's source; the headers it takes from the host (nlohmann-json, stb)
# and libhwy-dev, whose version names the source.
WEB_BUILD ?= build-web
WEB_DEBS  := emscripten dpkg-dev cmake make ninja-build libhwy-dev nlohmann-json3-dev libstb-dev
WEB_ENV   := NODE_PATH=/usr/share/nodejs
web:
	@tools/install-deps.sh $(WEB_DEBS)
	tools/highway-source.sh $(WEB_BUILD)/deps
	@# Release (-O3): with -Os (MinSizeRel) the module took 0.74 MB against 1.27
	@# and built in 58 s against 69, but the page's experiment took 3.5 s
	@# against 1.6 (AMD EPYC Zen 4, Chromium 156).
	$(WEB_ENV) emcmake cmake $(call generator,$(WEB_BUILD)) -S . -B $(WEB_BUILD) -DCMAKE_BUILD_TYPE=Release \
	    -DATTN_HWY_SOURCE_DIR=$(CURDIR)/$(WEB_BUILD)/deps/highway -DATTN_WEB_OUTPUT=$(CURDIR)/$(BUILD)/web >/dev/null
	$(WEB_ENV) cmake --build $(WEB_BUILD) -j $(JOBS) --target attn_web_page

# The page in a real browser (tests/web/page_test.mjs): Debian's Chromium,
# headless, driven by npm's puppeteer-core (which downloads no browser; 24.x,
# the last line that supports the machine's Node.js 20), the numbers checked
# against the Python module of $(BUILD) (built first).
WEB_TEST_DEBS := chromium nodejs
PUPPETEER_CORE_VERSION := 24.43.1
test-web: build web
	@tools/install-deps.sh $(WEB_TEST_DEBS)
	@command -v npm >/dev/null || tools/install-deps.sh npm
	npm install --prefix $(BUILD)/web-test --no-audit --no-fund --ignore-scripts \
	    puppeteer-core@$(PUPPETEER_CORE_VERSION) >/dev/null
	ATTN_PYTHONPATH=$(CURDIR)/$(BUILD)/python node tests/web/page_test.mjs --page $(BUILD)/web \
	    --puppeteer $(BUILD)/web-test --out $(BUILD)/web-test

# The README's picture of the page, as the browser test took it.
web-screenshot: test-web
	cp $(BUILD)/web-test/page.png docs/web_page.png

# Debian packages in $(BUILD)/: libattn0, libattn-dev, attn (cmake/packaging.cmake).
package: build
	@tools/install-deps.sh dpkg-dev
	cd $(BUILD) && cpack -G DEB

test: test-deps configure
	cmake --build $(BUILD) -j $(JOBS)
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -LE source_build
	$(MAKE) test-web
	$(MAKE) asan
	tools/run-fuzzers.sh $(ASAN_BUILD) $(TEST_FUZZ_SECONDS) 1 $(JOBS)
	$(MAKE) tsan
	$(MAKE) test-arm-kernels

# A project that builds attn from source with add_subdirectory: the whole
# library compiled again, so make test leaves it out (it kept make test past
# 30 minutes on 2 cores).
test-add-subdirectory: test-deps configure
	ctest --test-dir $(BUILD) --output-on-failure -L source_build

# The C++ tests (not pytest, not the CLI) in the checked build, but one: under
# ASan an impossible operator new (64 TiB) aborts with a report instead of
# throwing std::bad_alloc, so the ValueError that test expects cannot happen.
# Then the attn::dist tests under mpirun at 1 to 4 ranks.
asan: fuzz-build
	$(SANITIZER_ENV) ctest --test-dir $(ASAN_BUILD) -L gtest -E '^Tensor\.UnallocatableSizeIsAClearError$$' \
	    --output-on-failure -j $(JOBS)
	$(MPI_SANITIZER_ENV) ctest --test-dir $(ASAN_BUILD) -L mpi --output-on-failure -j $(JOBS)

fuzz-build: test-deps
	cmake $(call generator,$(ASAN_BUILD)) -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14 \
	    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SANITIZER_OPT_FLAGS)" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$(SANITIZER_OPT_FLAGS)" \
	    -DATTN_SANITIZE=address,undefined -DATTN_FUZZ=ON -DATTN_HWY_DISABLED_TARGETS="$(SANITIZER_HWY_DISABLED)" >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target attn_tests attn_dist_tests fuzz_npy fuzz_safetensors fuzz_attention \
	    fuzz_rope fuzz_capi fuzz_pages

# Each fuzzer FUZZ_SECONDS (default 60): make fuzz FUZZ_SECONDS=600
fuzz: fuzz-build
	tools/run-fuzzers.sh $(ASAN_BUILD) $(FUZZ_SECONDS) 0 $(JOBS)

# ThreadSanitizer over the tests that run attn from many threads: the thread
# pool (determinism at every thread count, callers that contend for it), the
# caches (one per thread, and one shared by four), concurrent state-dict
# loads. Its own build of the library, about 2 minutes in all on 2 cores.
# (Not the fork tests: ThreadSanitizer does not follow a multi-threaded
# process across fork; ASan runs them.)
tsan: test-deps
	cmake $(call generator,$(TSAN_BUILD)) -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14 \
	    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(TSAN_OPT_FLAGS)" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$(TSAN_OPT_FLAGS)" \
	    -DATTN_SANITIZE=thread >/dev/null
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target attn_kernel_tests
	TSAN_OPTIONS=halt_on_error=1 $(TSAN_BUILD)/bin/attn_kernel_tests --gtest_filter='Concurrency.*:Determinism.*:Kernels.BitwiseIdenticalForAnyThreadCount'

# Performance against peers (bench/compare.py). PyTorch at its best: AVX-512
# kernels and OpenBLAS's own CPU detection, for this command only.
bench: test-deps
	@tools/install-deps.sh $(BENCH_DEBS)
	$(MAKE) build
	$(BUILD)/bin/attn_micro
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ATEN_CPU_CAPABILITY=avx512 \
	    $(PYTHON) bench/compare.py

# attn against ONNX Runtime's CPU provider (bench/ort_compare.mjs), in turns:
# npm's onnxruntime-node, whose package holds the CPU library (its install
# script, skipped, would fetch CUDA's from NuGet). Not part of make test.
ORT_NODE_VERSION := 1.31.1
bench-ort: build
	@tools/install-deps.sh nodejs
	@command -v npm >/dev/null || tools/install-deps.sh npm
	npm install --prefix $(BUILD)/ort --no-audit --no-fund --ignore-scripts onnxruntime-node@$(ORT_NODE_VERSION) >/dev/null
	node bench/ort_compare.mjs --attn $(BUILD)/bin/attn --ort $(BUILD)/ort/node_modules/onnxruntime-node

# The figures of the README and docs/performance.md, measured again and
# written between their markers (bench/report.py), peers as for `make bench`;
# ONLY=summary,head-dims,peers,serving (some of them): those blocks alone.
bench-report: test-deps
	$(MAKE) build
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ATEN_CPU_CAPABILITY=avx512 \
	    $(PYTHON) bench/report.py --build $(BUILD) --write $(if $(ONLY),--only $(ONLY))

# Arm (aarch64): the library, the CLI and the C++ tests cross-built with
# Debian's toolchain against Debian's arm64 packages (multiarch; tools/
# install-deps.sh adds the architecture), in $(ARM_BUILD)/, and run under
# qemu-aarch64 on emulated CPUs. Each CPU is qemu's -cpu value / the best
# Highway target it must dispatch to; on each, the kernel tests force every
# target the CPU can run, one at a time; / the bf16 unit it must use (none:
# the Highway path) / the int8 unit (none: the Highway path). qemu 7.2's
# max has SVE2 (and BF16, the dot product) at 512 bits;
# sve128/sve256 set its vector length, sve=off leaves NEON with BF16; a64fx
# is SVE without SVE2.
ARM_BUILD     ?= build-arm
ARM_TEST_BUILD ?= build-arm-neon
ARM_DEBS      := g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libgtest-dev:arm64 libstb-dev:arm64
ARM_CPUS      := cortex-a72/NEON max,sve=off/NEON/neon_bf16/neon_dotprod a64fx/SVE \
                 max,sve128=on/SVE2_128/neon_bf16/neon_dotprod max,sve256=on/SVE_256/neon_bf16/neon_dotprod \
                 max/SVE2/neon_bf16/neon_dotprod
# make test runs ARM_KERNEL_TESTS on a NEON CPU without the bf16 and int8
# units, and ARM_UNIT_TESTS, the tests whose code takes BFDOT and SDOT where
# the CPU has them, on a NEON CPU that has them: there the other kernel tests
# would run the very instructions they ran on the first (one Highway target,
# NEON, on both). (SVE under qemu costs minutes per test on some hosts: three
# of these tests took 390 s on one SVE CPU on a Xeon, where a Zen 5 ran all
# of them in under 2 minutes; make test-arm runs SVE.)
ARM_TEST_CPU      := cortex-a72/NEON
ARM_UNIT_TEST_CPU := max,sve=off/NEON/neon_bf16/neon_dotprod
ARM_KERNEL_TESTS  := Kernels.*:EdgeCases.*:KVStorage.*:Q8_0.*:Q4_0.*:Precision.*:SparseAttention.*:LatentAttention.*
ARM_UNIT_TESTS    := Precision.*:Kernels.RisingMaxAcrossKeyTiles:Kernels.SimdTargetsOfThisCpu

# ARM_HWY_DISABLED: the Highway targets to leave out (none: every Arm target);
# ARM_TESTS: the test program (attn_kernel_tests: the kernels' and threads'
# tests alone).
# The packages take the targets built here, no more: without
# CMAKE_SKIP_INSTALL_ALL_DEPENDENCY, cpack first builds every other target
# (the whole test suite), on one core.
ARM_TESTS ?= attn_tests
arm-build:
	@tools/install-deps.sh $(ARM_DEBS)
	cmake $(call generator,$(ARM_BUILD)) -S . -B $(ARM_BUILD) -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
	    -DATTN_HWY_DISABLED_TARGETS="$(ARM_HWY_DISABLED)" -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON >/dev/null
	cmake --build $(ARM_BUILD) -j $(JOBS) --target $(ARM_TESTS) attn_cli attn_shared attn_static

# The whole C++ suite on every CPU of ARM_CPUS, and the arm64 packages
# (built, checked, their C consumer and CLI run under qemu).
test-arm: arm-build
	tools/test-arm.sh $(ARM_BUILD)/bin/attn_tests '*' $(ARM_CPUS)
	tests/packages.sh . $(ARM_BUILD) arm64

# make test's part: the kernel tests and the edge cases on NEON, each CPU's
# best target forced (make test-arm forces all of them, SVE too), in as many
# shards as cores, and the arm64 packages, from a build of the NEON target
# alone (its own folder); the Highway sources compiled for SVE as syntax
# alone (tools/check-sve.sh, seconds), so that code SVE's sizeless vectors
# cannot take fails here, not only in make test-arm.
test-arm-kernels:
	$(MAKE) arm-build ARM_BUILD=$(ARM_TEST_BUILD) ARM_HWY_DISABLED="$(ARM_TEST_HWY_DISABLED)" ARM_TESTS=attn_kernel_tests
	JOBS=$(JOBS) tools/check-sve.sh
	tools/test-arm.sh --best-only --shards $(JOBS) $(ARM_TEST_BUILD)/bin/attn_kernel_tests \
	    '$(ARM_KERNEL_TESTS)' $(ARM_TEST_CPU) -- '$(ARM_UNIT_TESTS)' $(ARM_UNIT_TEST_CPU)
	tests/packages.sh . $(ARM_TEST_BUILD) arm64

# The arm64 Debian packages (libattn0, libattn-dev, attn) in $(ARM_BUILD)/.
package-arm: arm-build
	@tools/install-deps.sh dpkg-dev
	cd $(ARM_BUILD) && DEB_HOST_ARCH=arm64 cpack -G DEB

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(ARM_BUILD) $(ARM_TEST_BUILD) $(WEB_BUILD)
