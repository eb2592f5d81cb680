# The two commands of the README: `make demo` and `make test`. Each installs
# the Debian packages it needs (skipped when present), then builds.
MAKEFLAGS += --no-print-directory
BUILD  ?= build
JOBS   ?= $(shell nproc)
PYTHON := /usr/bin/python3

# Build needs: compiler, CMake, Highway (SIMD with runtime dispatch), CLI11.
BUILD_DEBS := g++ cmake make libhwy-dev libcli11-dev
# Test needs on top: GoogleTest.
TEST_DEBS  := libgtest-dev

.PHONY: all build configure demo test deps test-deps clean

all: build

deps:
	@tools/install-deps.sh $(BUILD_DEBS)

test-deps:
	@tools/install-deps.sh $(BUILD_DEBS) $(TEST_DEBS)

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

clean:
	rm -rf $(BUILD)
