"""attn.dist under mpirun at 1, 2 and 4 ranks (tests/python/dist_ranks.py):
each rank's output and log-sum-exp against attn.attention on the whole
problem. Skipped where attn.dist is not built (no Open MPI or mpi4py)."""
import os
import shutil
import subprocess
import sys

import pytest

import attn

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    from attn import _dist  # noqa: F401
except ImportError:
    _dist = None


@pytest.mark.skipif(_dist is None or shutil.which("mpirun") is None,
                    reason="attn.dist not built (make test installs Open MPI and mpi4py)")
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_dist_matches_one_process(ranks):
    env = dict(os.environ, ATTN_NUM_THREADS="1",
               ATTN_PYTHONPATH=os.path.dirname(os.path.dirname(attn.__file__)))
    r = subprocess.run(["mpirun", "-np", str(ranks), "--oversubscribe", "--allow-run-as-root", sys.executable,
                        os.path.join(HERE, "dist_ranks.py")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("matches attn.attention") == ranks, r.stdout
