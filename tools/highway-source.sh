#!/usr/bin/env bash
# Puts the source of the Highway that Debian's libhwy-dev installs (the same
# version: Debian's source package "highway") in DEST/highway, for the web
# build, which compiles Highway's few sources (target detection, the aligned
# allocator) with Emscripten: Debian ships Highway's native binaries only.
# apt fetches it with a state of its own under DEST (its lists, its cache),
# checked against Debian's archive keys, and leaves the machine's apt as it
# was. A second run with the source in place returns at once.
# Usage: tools/highway-source.sh DEST
set -euo pipefail
dest=$(realpath -m "$1")
version=$(dpkg-query -W -f='${Version}' "libhwy-dev:$(dpkg --print-architecture)")
[ -f "$dest/highway/VERSION" ] && [ "$(cat "$dest/highway/VERSION")" = "$version" ] && exit 0
apt_dir=$dest/apt
rm -rf "$apt_dir" "$dest/highway"
mkdir -p "$apt_dir/parts" "$apt_dir/lists/partial" "$apt_dir/cache" "$apt_dir/download"
for suite in "debian bookworm bookworm-updates" "debian-security bookworm-security"; do
  set -- $suite
  archive=$1; shift
  printf 'Types: deb-src\nURIs: http://deb.debian.org/%s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n' \
    "$archive" "$*"
done >"$apt_dir/parts/debian-src.sources"
apt_options=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt_dir/parts"
             -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o APT::Sandbox::User=root)
apt-get "${apt_options[@]}" -q update >/dev/null
(cd "$apt_dir/download" && apt-get "${apt_options[@]}" -q source --download-only "highway=$version" >/dev/null)
# dpkg-source checks the files against the .dsc (whose own hashes apt
# checked against the archive's signed index: --no-check skips only the
# uploader's signature, whose key is in no package here) and applies
# Debian's patches.
dpkg-source -q --no-check -x "$apt_dir"/download/highway_*.dsc "$dest/highway.partial" >/dev/null
rm -f "$dest"/highway_*.orig.tar.*
echo "$version" >"$dest/highway.partial/VERSION"
mv "$dest/highway.partial" "$dest/highway"
rm -rf "$apt_dir"
echo "Highway $version's source: $dest/highway"
