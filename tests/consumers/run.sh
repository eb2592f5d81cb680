#!/bin/bash
# attn as its users get it, from an installed tree in a temporary prefix,
# never from the source tree: a CMake project with find_package (the shared
# library, then the static one), a C++ and a C program built with pkg-config
# (shared, then --static). Each runs and checks a result against its closed
# form. (A project that adds attn's source with add_subdirectory builds the
# whole library again: add_subdirectory/run.sh, make test-add-subdirectory.)
# Where the build has attn::dist (MPI found): a CMake project with
# find_package(attn COMPONENTS dist) and a C++ program built with
# pkg-config attn-dist, each run under mpirun on 2 ranks.
#   tests/consumers/run.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
here=$src/tests/consumers
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
# Relocatable: the tree works from wherever it is unpacked.
mv "$prefix" "$work/moved" && prefix=$work/moved

step() { echo "== $*"; }
cxx=${CXX:-c++}

step "find_package(attn 0.2), attn::attn = libattn.so"
cmake -S "$here/find_package" -B "$work/fp" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/fp" >/dev/null
"$work/fp/consumer"
readelf -d "$work/fp/consumer" | grep -q 'NEEDED.*libattn.so.0' || { echo "consumer does not load libattn.so.0"; exit 1; }

step "find_package(attn 0.2) with ATTN_STATIC=ON, attn::attn = libattn.a"
cmake -S "$here/find_package" -B "$work/fps" -DCMAKE_PREFIX_PATH="$prefix" -DATTN_STATIC=ON >/dev/null
cmake --build "$work/fps" >/dev/null
"$work/fps/consumer"
if readelf -d "$work/fps/consumer" | grep -q 'libattn'; then echo "static consumer loads libattn"; exit 1; fi

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
step "pkg-config --cflags --libs attn"
# shellcheck disable=SC2046
$cxx -std=c++20 "$here/consumer.cc" -o "$work/pc" $(pkg-config --cflags --libs attn) -Wl,-rpath,"$prefix/lib"
"$work/pc"
step "pkg-config --static"
# shellcheck disable=SC2046
$cxx -std=c++20 "$here/consumer.cc" -o "$work/pcs" \
  $(pkg-config --cflags --static --libs attn | sed 's/-lattn/-l:libattn.a/')
if readelf -d "$work/pcs" | grep -q 'libattn'; then echo "static consumer loads libattn"; exit 1; fi
"$work/pcs"

cc=${CC:-cc}
step "C: pkg-config --cflags --libs attn"
# shellcheck disable=SC2046
$cc -std=c99 -pedantic -Wall -Werror "$here/consumer.c" -o "$work/c" $(pkg-config --cflags --libs attn) -lm \
  -Wl,-rpath,"$prefix/lib"
"$work/c"
step "C: pkg-config --static"
# shellcheck disable=SC2046
$cc -std=c99 -pedantic -Wall -Werror "$here/consumer.c" -o "$work/cs" \
  $(pkg-config --cflags --static --libs attn | sed 's/-lattn/-l:libattn.a/')
if readelf -d "$work/cs" | grep -q 'libattn'; then echo "static consumer loads libattn"; exit 1; fi
"$work/cs"

if [ -f "$build/libattn_dist.a" ]; then
  mpirun=(mpirun -np 2 --oversubscribe --allow-run-as-root)
  step "find_package(attn 0.2 COMPONENTS dist), attn::dist = libattn_dist.a"
  cmake -S "$here/dist" -B "$work/dist" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$work/dist" >/dev/null
  ATTN_NUM_THREADS=1 "${mpirun[@]}" "$work/dist/consumer_dist"
  step "pkg-config --cflags --libs attn-dist"
  # shellcheck disable=SC2046
  $cxx -std=c++20 "$here/consumer_dist.cc" -o "$work/pc_dist" $(pkg-config --cflags --libs attn-dist) \
    -Wl,-rpath,"$prefix/lib"
  ATTN_NUM_THREADS=1 "${mpirun[@]}" "$work/pc_dist"
fi
