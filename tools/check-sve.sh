#!/usr/bin/env bash
# Compiles every Highway source (the files that include hwy/foreach_target.h)
# for SVE as syntax alone: GCC's -fsyntax-only still instantiates the
# templates, so code that SVE's sizeless vectors cannot take (an array of
# vectors, a vector in a struct) fails here. make test builds and runs the
# NEON target alone (SVE under qemu costs minutes per test; make test-arm
# builds and runs every SVE target), and this takes seconds where a build of
# the SVE targets takes minutes. Two targets: SVE's sizeless vectors, and
# SVE2 at a fixed 128 bits (Highway's SVE2_128, whose ops differ in places).
#   tools/check-sve.sh [CXX]   (default aarch64-linux-gnu-g++; JOBS processes, default all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
export CXX=${1:-aarch64-linux-gnu-g++}
mapfile -t sources < <(grep -rl --include='*.cc' 'hwy/foreach_target.h' src companion | sort)
[ ${#sources[@]} -gt 0 ] || { echo "check-sve: no Highway sources found" >&2; exit 1; }
compile() {  # SOURCE -march value [options]
  local source=$1
  shift
  "$CXX" -std=c++20 -fsyntax-only -DHWY_COMPILE_ONLY_STATIC=1 -march="$@" \
      -Iinclude -Isrc -Isrc/core -Icompanion/include "$source" ||
    { echo "check-sve: $source does not compile for -march=$*" >&2; return 1; }
}
export -f compile
for source in "${sources[@]}"; do
  printf '%s\0%s\0' "$source" "armv8.2-a+sve" "$source" "armv9-a+sve2 -msve-vector-bits=128"
done | xargs -0 -n 2 -P "${JOBS:-$(nproc)}" bash -c 'compile "$0" $1'
echo "check-sve: ${#sources[@]} Highway sources compile for SVE and SVE2_128"
