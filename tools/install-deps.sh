#!/usr/bin/env bash
# Installs the Debian packages given as arguments that are not installed yet.
# A second run with everything present returns at once without touching apt.
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# A package of another architecture (libhwy-dev:arm64) needs that
# architecture added to dpkg (multiarch) before apt-get update.
for pkg in "${missing[@]}"; do
  case "$pkg" in
    *:*) arch=${pkg##*:}
         dpkg --print-foreign-architectures | grep -qx "$arch" || $sudo dpkg --add-architecture "$arch" ;;
  esac
done
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
