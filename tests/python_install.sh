#!/bin/bash
# The Python module as Python users install it, in virtual environments that
# see Debian's packages (NumPy, PyTorch, pytest): `pip install .` from a copy
# of the source tree (offline: --no-build-isolation), checked to be the files
# the Python suite tests and to import from where it was installed; and a
# wheel (python3 -m build) installed in a fresh environment. Both reuse
# BUILD_DIR's CMake build (ATTN_CMAKE_BUILD_DIR).
# Where that build has attn._dist (Open MPI and mpi4py), both hold it.
#   tests/python_install.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export ATTN_CMAKE_BUILD_DIR=$build PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
version=$($python -c "import re; h=open('$src/include/attn/version.h').read(); \
print('.'.join(re.search(r'#define ATTN_VERSION_%s (\d+)' % p, h).group(1) for p in ('MAJOR','MINOR','PATCH')))")
# A copy without build folders: pip and build write into the tree they build.
mkdir "$work/src"
(cd "$src" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/src")

echo "== pip install --no-build-isolation ."
$python -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install -q --no-build-isolation "$work/src"
site=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cd "$work"  # away from the sources: the installed module, nothing else
"$work/venv/bin/python" -c "import attn, sys; v = attn.__version__; assert v == '$version', v; \
assert attn.__file__.startswith('$work/venv'), attn.__file__; print('attn', v, 'from', attn.__file__)"
# The installed package is the one the suite tests (ctest's pytest, on the
# build's python/ folder): every file of it, byte for byte (the package finds
# nothing by its own path, so where it lies changes nothing), and each of its
# modules imports from the installed place.
for f in "$build"/python/attn/*.py "$build"/python/attn/_*.so; do
  cmp -s "$f" "$site/attn/$(basename "$f")" || { echo "the installed attn/$(basename "$f") is not $f"; exit 1; }
done
modules=$(cd "$build/python" && ls attn/*.py attn/_*.so | sed 's/\.py$//; s/\..*\.so$//; s#/#.#' | grep -v '__init__$')
"$work/venv/bin/python" -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]; \
assert all(sys.modules[m].__file__.startswith('$work/venv') for m in sys.argv[1:]); \
print('installed:', ' '.join(sys.argv[1:]))" $modules

echo "== python3 -m build --wheel --no-isolation"
(cd "$work/src" && $python -m build --wheel --no-isolation --outdir "$work/dist" >"$work/build.log" 2>&1) ||
  { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/attn-"$version"-*.whl)
# attn.dist's extension travels in the wheel where the build has it.
if ls "$build"/python/attn/_dist*.so >/dev/null 2>&1; then
  $python -c "import sys, zipfile; names = zipfile.ZipFile(sys.argv[1]).namelist(); \
assert any(n.startswith('attn/_dist') for n in names), names" "$wheel"
fi
$python -m venv --system-site-packages "$work/venv2"
"$work/venv2/bin/pip" install -q "$wheel"
"$work/venv2/bin/python" -c "import attn, numpy as np; assert attn.__version__ == '$version'; \
assert attn.__file__.startswith('$work/venv2'), attn.__file__; \
y = attn.attention(np.array([[1, 0]], np.float32), np.eye(2, dtype=np.float32), np.eye(2, dtype=np.float32)); \
w = 1 / (1 + np.exp(-1 / np.sqrt(2))); assert np.allclose(y, [[w, 1 - w]], atol=1e-6), y; \
print('wheel', '$(basename "$wheel")', 'installs; attention matches its closed form')"
