# The two commands of the README: `make demo` and `make test`. Each installs
# the Debian packages it needs (skipped when present), then builds.
MAKEFLAGS += --no-print-directory
BUILD  ?= build
JOBS   ?= $(shell nproc)
PYTHON := /usr/bin/python3

# Build needs: compiler, CMake, Highway (SIMD with runtime dispatch), CLI11,
# nlohmann-json (safetensors headers), stb (PNG pictures; found with pkg-config).
BUILD_DEBS := g++ cmake make pkg-config libhwy-dev libcli11-dev nlohmann-json3-dev libstb-dev
# Python module: pybind11 and NumPy under Debian's /usr/bin/python3.
PY_DEBS    := python3-dev python3-pybind11 python3-numpy
# Test needs on top: GoogleTest, pytest, and PyTorch as a test-only reference.
TEST_DEBS  := libgtest-dev python3-pytest python3-torch
# Benchmarks: Google Benchmark for the kernel microbenchmarks; OpenBLAS so
# that the NumPy and PyTorch baselines run on a fast BLAS.
BENCH_DEBS := libbenchmark-dev libopenblas0-pthread

.PHONY: all build configure demo test bench check-arm deps test-deps clean

all: build

deps:
	@tools/install-deps.sh $(BUILD_DEBS) $(PY_DEBS)

test-deps:
	@tools/install-deps.sh $(BUILD_DEBS) $(PY_DEBS) $(TEST_DEBS)

# Configuring again each time is cheap and picks up packages installed since.
configure:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=$(PYTHON) >/dev/null

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/bin/attn demo

test: test-deps configure
	cmake --build $(BUILD) -j $(JOBS)
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Performance against peers (bench/compare.py). PyTorch at its best: AVX-512
# kernels and OpenBLAS's own CPU detection, for this command only.
bench: test-deps
	@tools/install-deps.sh $(BENCH_DEBS)
	$(MAKE) build
	$(BUILD)/bin/attn_micro
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ATEN_CPU_CAPABILITY=avx512 \
	    $(PYTHON) bench/compare.py

# The SIMD kernels compile for Arm too (NEON, SVE, SVE2): build them with
# Debian's aarch64 cross compiler against the same Highway headers.
ARM_CXX := aarch64-linux-gnu-g++
check-arm:
	@tools/install-deps.sh g++-aarch64-linux-gnu libhwy-dev
	@mkdir -p $(BUILD)/arm/include && cp -r /usr/include/hwy $(BUILD)/arm/include/
	@for f in src/kernels/*.cc; do \
	  $(ARM_CXX) -std=c++20 -O2 -c $$f -Iinclude -Isrc -I$(BUILD)/arm/include \
	      -o $(BUILD)/arm/$$(basename $$f .cc).o || exit 1; \
	  echo "$$f: $$(aarch64-linux-gnu-nm -C $(BUILD)/arm/$$(basename $$f .cc).o | \
	      grep -o 'N_[A-Z0-9_]*::' | sort -u | tr '\n' ' ')"; done

clean:
	rm -rf $(BUILD)
