import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# The module under test: ctest sets ATTN_PYTHONPATH; by default the build tree.
PYTHONPATH = os.environ.get("ATTN_PYTHONPATH", os.path.join(HERE, "..", "..", "build", "python"))

# Source for a child interpreter: peak_bytes() is its peak RSS (VmHWM; the
# ru_maxrss of a child starts at its parent's, which fork passes on).
PEAK_BYTES = ("def peak_bytes():\n"
              "    for line in open('/proc/self/status'):\n"
              "        if line.startswith('VmHWM:'): return int(line.split()[1]) * 1024\n")


def run_python(code, env=None, timeout=60):
    """Runs code in a fresh interpreter that imports attn from the build tree."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})})


def rel_err(a, b):
    """Relative Frobenius error ||a - b|| / ||b|| (absolute when b is zero)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    den = np.linalg.norm(b)
    num = np.linalg.norm(a - b)
    return num / den if den > 0 else num
