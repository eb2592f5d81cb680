#!/bin/bash
# A CMake project that adds attn's source with add_subdirectory, built in a
# temporary folder (the whole library again, Release), run, its result
# checked against its closed form.
#   tests/consumers/add_subdirectory/run.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== add_subdirectory(attn)"
cmake -S "$src/tests/consumers/add_subdirectory" -B "$work" -DATTN_SOURCE="$src" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work" --target consumer -j "${JOBS:-2}" >/dev/null
"$work/consumer"
