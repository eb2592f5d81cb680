#!/bin/bash
# The Debian packages (cmake/packaging.cmake), built from a build folder:
# each holds what it should, depends on what it needs, and unpacked into a
# scratch root (dpkg -x, no install) they are enough to build and run the C
# consumer with pkg-config, and the attn command; where the build has
# attn::dist, libattn-dist-dev too, with a C++ consumer of it under mpirun.
# With ARCH arm64 (a cross
# build, make test-arm): the arm64 packages, the consumer built with the
# cross compiler, both run under qemu-aarch64.
#   tests/packages.sh SOURCE_DIR BUILD_DIR [ARCH]
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
arch=${3:-$(dpkg --print-architecture)}
cc=${CC:-cc} run=() pkg_config_dirs=
if [ "$arch" != "$(dpkg --print-architecture)" ]; then
  [ "$arch" = arm64 ] || { echo "packages: no cross setup for $arch"; exit 1; }
  cc=aarch64-linux-gnu-gcc run=(qemu-aarch64) pkg_config_dirs=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
version=$(sed -n 's/^#define ATTN_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$src/include/attn/version.h" | paste -sd.)
major=${version%%.*}
(cd "$build" && DEB_HOST_ARCH=$arch cpack -G DEB -B "$work/debs" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log"; exit 1; }
runtime=$work/debs/libattn${major}_${version}_$arch.deb
dev=$work/debs/libattn-dev_${version}_$arch.deb
cli=$work/debs/attn_${version}_$arch.deb
dist=$work/debs/libattn-dist-dev_${version}_$arch.deb
debs=("$runtime" "$dev" "$cli")
has_dist=false
if [ -f "$build/libattn_dist.a" ]; then has_dist=true; debs+=("$dist"); fi

fail() { echo "packages: $*"; exit 1; }
# has DEB PATH...: each path is in the package
has() {
  local deb=$1; shift
  local listing
  listing=$(dpkg-deb -c "$deb" | awk '{print $6}')
  for path in "$@"; do grep -qx "./usr/$path" <<<"$listing" || fail "$(basename "$deb") lacks /usr/$path"; done
}
has "$runtime" lib/libattn.so.$major lib/libattn.so.$version
has "$dev" include/attn/attn.h include/attn/attn.hpp include/attn/version.h lib/libattn.so lib/libattn.a \
    lib/cmake/attn/attnConfig.cmake lib/cmake/attn/attnConfigVersion.cmake lib/cmake/attn/attnTargets.cmake \
    lib/pkgconfig/attn.pc
has "$cli" bin/attn
if $has_dist; then
  has "$dist" include/attn/dist.hpp lib/libattn_dist.a lib/cmake/attn/attnDistTargets.cmake lib/pkgconfig/attn-dist.pc
  dpkg-deb -f "$dist" Depends | grep -q "libattn-dev (= $version)" || fail "libattn-dist-dev does not depend on libattn-dev"
  dpkg-deb -f "$dist" Depends | grep -q "libopenmpi-dev" || fail "libattn-dist-dev does not depend on libopenmpi-dev"
  if dpkg-deb -c "$dev" | grep -q 'dist\.hpp\|attn_dist\|attn-dist\|DistTargets'; then fail "libattn-dev holds attn::dist's files"; fi
fi
if dpkg-deb -c "$runtime" | grep -q 'include/\|\.a$'; then fail "the runtime package holds development files"; fi
# The companion (pictures, training, the machine's ceilings) is the command's
# alone: none of its headers in libattn-dev, none of its code in libattn.
if dpkg-deb -c "$dev" | grep -qE 'companion|include/attn/(picture|train|adam|experiments|machine|embedding)\.hpp'; then
  fail "libattn-dev holds the companion's headers"
fi
dpkg-deb -f "$runtime" Depends | grep -q 'libhwy1' || fail "libattn$major does not depend on libhwy1 (dpkg-shlibdeps)"
dpkg-deb -f "$dev" Depends | grep -q "libattn$major (= $version)" || fail "libattn-dev does not depend on libattn$major"
dpkg-deb -f "$cli" Depends | grep -q "libattn$major (= $version)" || fail "attn does not depend on libattn$major"
for deb in "${debs[@]}"; do
  [ "$(dpkg-deb -f "$deb" Architecture)" = "$arch" ] || fail "$(basename "$deb") is not for $arch"
done

root=$work/root
for deb in "${debs[@]}"; do dpkg -x "$deb" "$root"; done
if nm -D --defined-only "$root/usr/lib/libattn.so.$major" | c++filt | grep -qE 'attn::(write_png|viridis|Adam|Classifier|measure_fma_peak_gflops)'; then
  fail "libattn$major exports the companion's code"
fi
export PKG_CONFIG_PATH=$root/usr/lib/pkgconfig
[ -n "$pkg_config_dirs" ] && export PKG_CONFIG_LIBDIR=$pkg_config_dirs
# shellcheck disable=SC2046
$cc -std=c99 -pedantic -Wall -Werror "$src/tests/consumers/consumer.c" -o "$work/consumer" \
  $(pkg-config --cflags --libs attn) -lm -Wl,-rpath,"$root/usr/lib"
"${run[@]}" "$work/consumer"
[ "$("${run[@]}" "$root/usr/bin/attn" --version)" = "attn $version" ] || fail "the packaged attn is not version $version"
if $has_dist; then
  # shellcheck disable=SC2046
  ${CXX:-c++} -std=c++20 "$src/tests/consumers/consumer_dist.cc" -o "$work/consumer_dist" \
    $(pkg-config --cflags --libs attn-dist) -Wl,-rpath,"$root/usr/lib"
  ATTN_NUM_THREADS=1 mpirun -np 2 --oversubscribe --allow-run-as-root "$work/consumer_dist"
fi
echo "packages: ${debs[*]##*/}: contents, dependencies, consumers and the CLI"
