"""Run by test_dist.py under mpirun: each rank checks attn.dist against
attn.attention on the whole problem (the same seeded inputs on every rank)
and exits non-zero on a failure, which fails mpirun."""
import hashlib
import os
import sys

import numpy as np

sys.path.insert(0, os.environ["ATTN_PYTHONPATH"])
import attn  # noqa: E402
import attn.dist  # noqa: E402
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

comm = MPI.COMM_WORLD
rank, world = comm.rank, comm.size
digest = hashlib.sha256()  # of every result: two runs must give the same bits


def rows(layout, n_local):
    """The global rows this rank holds (docs/semantics.md's layouts)."""
    if layout == "zigzag":
        c = n_local // 2
        return np.r_[rank * c:(rank + 1) * c, (2 * world - 1 - rank) * c:(2 * world - rank) * c]
    return np.arange(rank * n_local, (rank + 1) * n_local)


def check(function, dtype, layout, kv_dtype=None, **options):
    rng = np.random.default_rng(7)
    n_local, hq, hkv = 6, 2 * world, world
    q = rng.standard_normal((2, hq, n_local * world, 8)).astype(dtype)
    k = rng.standard_normal((2, hkv, n_local * world, 8)).astype(kv_dtype or dtype)
    v = rng.standard_normal((2, hkv, n_local * world, 8)).astype(kv_dtype or dtype)
    out, lse = attn.attention(q, k, v, return_lse=True, **options)
    mine = rows(layout, n_local)
    got, got_lse = function(q[..., mine, :], k[..., mine, :], v[..., mine, :], comm, layout=layout,
                            return_lse=True, **options)
    tolerance = 1e-12 if dtype == np.float64 else 1e-5
    digest.update(got.tobytes() + got_lse.tobytes())
    for a, b in ((got, out[..., mine, :]), (got_lse, lse[..., mine])):
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        scale = np.abs(b).max()
        assert np.abs(a - b).max() <= tolerance * scale, (function.__name__, layout, options, np.abs(a - b).max())


for function in (attn.dist.ring_attention, attn.dist.ulysses_attention):
    for layout in ("contiguous", "zigzag"):
        check(function, np.float32, layout)
        check(function, np.float64, layout, causal=True)
        check(function, np.float32, layout, causal="top_left", window=(3, 0), softcap=3.0,
              sinks=np.linspace(-1, 1, 2 * world))
        check(function, np.float32, layout, kv_dtype=np.float16, causal=True)
# Keys and values as attn.QuantizedTensor travel as stored: against
# attention on the whole problem's quantized K and V (q8_0 blocks lie along
# a row, so each rank's rows quantize as the whole's do).
for function in (attn.dist.ring_attention, attn.dist.ulysses_attention):
    for kv_dtype in ("bf16", "q8_0"):
        rng = np.random.default_rng(9)
        q = rng.standard_normal((2 * world, 4 * world, 32)).astype(np.float32)
        k, v = (rng.standard_normal((world, 4 * world, 32)).astype(np.float32) for _ in range(2))
        whole = attn.attention(q, attn.quantize(k, kv_dtype), attn.quantize(v, kv_dtype), causal=True)
        mine = rows("contiguous", 4)
        got = function(q[:, mine], attn.quantize(np.ascontiguousarray(k[:, mine]), kv_dtype),
                       attn.quantize(np.ascontiguousarray(v[:, mine]), kv_dtype), comm, causal=True)
        digest.update(got.tobytes())
        assert np.abs(got - whole[:, mine]).max() <= 1e-5 * np.abs(whole).max(), (function.__name__, kv_dtype)
for function in (attn.dist.ring_attention, attn.dist.ulysses_attention):
    check(function, np.float32, "zigzag", causal=True, alibi_slopes=attn.alibi_slopes(2 * world))
    check(function, np.float64, "contiguous", window=(4, 2), alibi_slopes=attn.alibi_slopes(2 * world))

# The ring's backward against attn.attention_backward on the whole problem.
for layout in ("contiguous", "zigzag"):
    for dtype, tolerance in ((np.float32, 1e-5), (np.float64, 1e-12)):
        rng = np.random.default_rng(11)
        n = 4 * world
        q, dout = (rng.standard_normal((2 * world, n, 8)).astype(dtype) for _ in range(2))
        k, v = (rng.standard_normal((world, n, 8)).astype(dtype) for _ in range(2))
        options = dict(causal=True, window=(5, None), alibi_slopes=attn.alibi_slopes(2 * world),
                       sinks=np.linspace(-0.5, 0.5, 2 * world))
        whole = attn.attention_backward(q, k, v, dout, **options)
        mine = rows(layout, 4)
        out, lse = attn.dist.ring_attention(q[:, mine], k[:, mine], v[:, mine], comm, layout=layout,
                                            return_lse=True, **options)
        got = attn.dist.ring_attention_backward(q[:, mine], k[:, mine], v[:, mine], dout[:, mine], out, lse, comm,
                                                layout=layout, **options)
        digest.update(b"".join(a.tobytes() for a in got))
        for a, b in zip(got, (whole[0][:, mine], whole[1][:, mine], whole[2][:, mine], whole[3])):
            assert np.abs(a - b).max() <= tolerance * np.abs(b).max(), (layout, dtype, np.abs(a - b).max())

# torch tensors in, torch tensors out.
t = torch.randn(world, 4, 8, generator=torch.Generator().manual_seed(3))
out = attn.dist.ring_attention(t, t, t, comm)
assert isinstance(out, torch.Tensor) and out.shape == t.shape
# A tensor that requires grad (attn.dist has no autograd) on one rank: all raise.
try:
    attn.dist.ring_attention(t.clone().requires_grad_(rank == world - 1), t, t, comm)
except RuntimeError as e:
    assert f"rank {world - 1}:" in str(e) and "requires grad" in str(e), str(e)
else:
    raise AssertionError("no error")

# An argument wrong on one rank fails on every rank, naming it (no hang).
bad = world - 1
for function in (attn.dist.ring_attention, attn.dist.ulysses_attention):
    x = np.zeros((2 * world, 4, 8), np.float32)
    try:
        function(x, x, x, comm, window=(1, 2, 3) if rank == bad else None)
    except TypeError as e:
        assert f"rank {bad}:" in str(e) and "window" in str(e), str(e)
    else:
        raise AssertionError("no error")
    try:
        function(x, x[:, :, :7] if rank == bad else x, x, comm)
    except ValueError as e:
        assert f"rank {bad}:" in str(e), str(e)
    else:
        raise AssertionError("no error")
print(f"rank {rank} of {world}: attn.dist matches attn.attention")
print(f"rank {rank} digest {digest.hexdigest()}")
