"""The Python package `attn`: python/attn/*.py and the extension attn._core,
built by the project's CMake (target attn_python), and attn._dist (attn.dist,
target attn_python_dist) where CMake finds Open MPI and mpi4py (an optional
extension: skipped, with a warning, elsewhere). Install: `pip install --no-build-isolation .`,
or a wheel with `python3 -m build --wheel --no-isolation`. The version is
include/attn/version.h's. ATTN_CMAKE_BUILD_DIR names a configured build
folder to reuse (built incrementally, with the sources and settings it was
configured with); by default a fresh one in setuptools' build folder,
build-python/."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

ROOT = Path(__file__).resolve().parent


def version():
    header = (ROOT / "include" / "attn" / "version.h").read_text()
    return ".".join(re.search(rf"#define ATTN_VERSION_{part} (\d+)", header).group(1)
                    for part in ("MAJOR", "MINOR", "PATCH"))


# Each extension: the CMake target that builds it.
TARGETS = {"attn._core": "attn_python", "attn._dist": "attn_python_dist"}


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = Path(os.environ.get("ATTN_CMAKE_BUILD_DIR") or Path(self.build_temp).resolve() / "cmake")
        # The interpreter the module is for; in a venv, the one it was made from
        # (the same ABI, and the one whose site-packages hold pybind11).
        python = getattr(sys, "_base_executable", sys.executable)
        if not (build / "CMakeCache.txt").exists():
            subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                                   f"-DPython3_EXECUTABLE={python}"], stdout=subprocess.DEVNULL)
        target, name = TARGETS[ext.name], ext.name.split(".")[-1]
        targets = subprocess.run(["cmake", "--build", str(build), "--target", "help"], check=True,
                                 capture_output=True, text=True).stdout
        if not re.search(rf"\b{target}\b", targets):
            raise CompileError(f"{ext.name}: CMake did not configure {target} (for attn._dist: Open MPI and "
                               "mpi4py not found)")
        subprocess.check_call(["cmake", "--build", str(build), "--target", target, "-j", str(os.cpu_count() or 1)])
        built = list((build / "python" / "attn").glob(f"{name}*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one {name}*.so in {build / 'python' / 'attn'}, found {built}")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], target)


setup(
    name="attn",
    version=version(),
    description="Multi-head attention and positional encodings, fast on the CPU",
    license="see the repository",
    python_requires=">=3.9",
    install_requires=["numpy"],
    packages=["attn"],
    package_dir={"attn": "python/attn"},
    ext_modules=[Extension("attn._core", sources=[]), Extension("attn._dist", sources=[], optional=True)],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own build folder, apart from CMake's build/ (and ignored by git).
    options={"build": {"build_base": "build-python"}},
    zip_safe=False,
)
