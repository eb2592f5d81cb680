"""attn.dist under mpirun at 1, 2 and 4 ranks (tests/python/dist_ranks.py):
each rank's output and log-sum-exp against attn.attention on the whole
problem. Skipped where attn.dist is not built (no Open MPI or mpi4py)."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

import attn

HERE = os.path.dirname(os.path.abspath(__file__))
# Found, not imported: importing it would start MPI in this process.
BUILT = importlib.util.find_spec("attn._dist") is not None
needs_dist = pytest.mark.skipif(not BUILT or shutil.which("mpirun") is None,
                                reason="attn.dist not built (make test installs Open MPI and mpi4py)")


def run_ranks(ranks):
    """dist_ranks.py under mpirun; `python -m mpi4py` aborts every rank when
    one raises, so a failure ends the job instead of leaving it waiting."""
    env = dict(os.environ, ATTN_NUM_THREADS="1",
               ATTN_PYTHONPATH=os.path.dirname(os.path.dirname(attn.__file__)))
    r = subprocess.run(["mpirun", "-np", str(ranks), "--oversubscribe", "--allow-run-as-root", sys.executable,
                        "-m", "mpi4py", os.path.join(HERE, "dist_ranks.py")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # mpirun interleaves the ranks' output, not always at line ends: found
    # by pattern, not by line.
    assert len(re.findall(r"rank \d+ of \d+: attn\.dist matches attn\.attention", r.stdout)) == ranks, r.stdout
    digests = sorted(re.findall(r"rank \d+ digest [0-9a-f]{64}", r.stdout))
    assert len(digests) == ranks, r.stdout
    return digests


@needs_dist
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_dist_matches_one_process(ranks):
    run_ranks(ranks)


@needs_dist
def test_two_runs_give_the_same_bits():
    assert run_ranks(2) == run_ranks(2)


CLI = os.environ.get("ATTN_CLI", os.path.join(HERE, "..", "..", "build", "bin", "attn"))


@needs_dist
@pytest.mark.parametrize("causal", [False, True])
def test_bench_ring_reports_each_rank(causal):
    import json
    n, heads, d = 512, 2, 32
    command = ["mpirun", "-np", "2", "--oversubscribe", "--allow-run-as-root", CLI, "bench",
               "ring", "--n", str(n), "--heads", str(heads), "--head-dim", str(d), "--repeats", "2", "--json"]
    r = subprocess.run(command + (["--causal"] if causal else []), env=dict(os.environ, ATTN_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["world"] == 2 and len(report["ranks"]) == 2
    # Each figure is rounded to 4 decimals: the speedup is off by up to 5e-5,
    # the times (over 0.1 ms here) by under 5e-4 relative.
    assert report["speedup"] == pytest.approx(report["one_process_ms"] / report["median_ms"], rel=1e-3, abs=1e-4)
    block = 2 * heads * (n // 2) * d * 4  # one rank's K and V in float32
    assert report["block_bytes"] == block
    # Non-causal, each rank passes its block on once; causal (contiguous),
    # rank 1's block is needed by no other rank.
    assert [x["bytes_sent"] for x in report["ranks"]] == ([block, 0] if causal else [block, block])
    assert [x["blocks_computed"] for x in report["ranks"]] == ([1, 2] if causal else [2, 2])
    for x in report["ranks"]:
        assert x["compute_ms"] > 0 and x["comm_ms"] >= 0
