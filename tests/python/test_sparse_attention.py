"""attn.sparse_attention against the definition written here in float64
NumPy: softmax over the keys each row's indices name (a dense mask of the
picked keys), with GQA, scale, softcap and sinks; and its refusals."""
import numpy as np
import pytest

import attn


def picked(q, k, v, indices, scale=None, softcap=None, sinks=None):
    """(out, lse) by the definition: every key, masked to the picked ones."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    hq, hkv, n_k = q.shape[-3], k.shape[-3], k.shape[-2]
    group = hq // hkv
    kr, vr = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    idx = np.asarray(indices)
    idx = np.repeat(idx, group, axis=-3) if idx.shape[-3] == hkv else np.broadcast_to(
        idx, idx.shape[:-3] + (hq,) + idx.shape[-2:])
    allowed = np.zeros(q.shape[:-1] + (n_k,), bool)
    it = np.nditer(idx, flags=["multi_index"])
    for j in it:
        if j >= 0:
            allowed[it.multi_index[:-1] + (int(j),)] = True
    logits = (1 / np.sqrt(q.shape[-1]) if scale is None else scale) * q @ np.swapaxes(kr, -1, -2)
    if softcap:
        logits = softcap * np.tanh(logits / softcap)
    logits = np.where(allowed, logits, -np.inf)
    sink = np.full(q.shape[:-1] + (1,), -np.inf) if sinks is None else np.broadcast_to(
        np.asarray(sinks, np.float64)[:, None, None], q.shape[:-1] + (1,))
    full = np.concatenate([logits, sink], axis=-1)  # the sink: a key of value zero
    top = full.max(axis=-1, keepdims=True)
    e = np.where(np.isneginf(full), 0.0, np.exp(full - np.where(np.isfinite(top), top, 0)))
    total = e.sum(axis=-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)[..., :-1]
    lse = np.where(total[..., 0] > 0, np.log(np.where(total[..., 0] > 0, total[..., 0], 1)) + top[..., 0], -np.inf)
    return w @ vr, lse


def make(rng, lead=(2,), hq=6, hkv=2, n_q=5, n_k=50, d=16, d_v=12, topk=9, per_head=True, dtype=np.float32):
    q = rng.standard_normal(lead + (hq, n_q, d)).astype(dtype)
    k = rng.standard_normal(lead + (hkv, n_k, d)).astype(dtype)
    v = rng.standard_normal(lead + (hkv, n_k, d_v)).astype(dtype)
    shape = lead + (hkv if per_head else 1, n_q)
    idx = np.array([rng.permutation(n_k)[:topk] for _ in range(int(np.prod(shape)))]).reshape(shape + (topk,))
    idx[rng.uniform(size=idx.shape) < 0.2] = -1
    return q, k, v, idx.astype(np.int32)


@pytest.mark.parametrize("options", [dict(), dict(softcap=3.0), dict(scale=0.2, sinks=np.linspace(-2, 2, 6)),
                                     dict(per_head=False, softcap=1.5, sinks=np.zeros(6))],
                         ids=["plain", "softcap", "scale_sinks", "shared_indices"])
def test_sparse_attention_is_the_definition(options):
    options = dict(options)
    per_head = options.pop("per_head", True)
    q, k, v, idx = make(np.random.default_rng(1), per_head=per_head)
    want, want_lse = picked(q, k, v, idx, **options)
    out, lse = attn.sparse_attention(q, k, v, idx, return_lse=True, **options)
    assert out.dtype == np.float32 and out.shape == q.shape[:-1] + (12,) and lse.shape == q.shape[:-1]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6, atol=2e-6)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    out64 = attn.sparse_attention(q64, k64, v64, idx.astype(np.int64), **options)
    assert out64.dtype == np.float64
    np.testing.assert_allclose(out64, want, rtol=1e-12, atol=1e-13)


def test_every_key_picked_is_dense_attention_and_none_is_zeros():
    q, k, v, _ = make(np.random.default_rng(2), lead=(), hq=4, hkv=4, n_k=20)
    every = np.broadcast_to(np.arange(20)[::-1], (4, 5, 20))  # in any order
    np.testing.assert_allclose(attn.sparse_attention(q, k, v, every), attn.attention(q, k, v), rtol=1e-5, atol=1e-6)
    none = np.full((4, 5, 3), -1)
    out, lse = attn.sparse_attention(q, k, v, none, return_lse=True)
    assert not out.any() and np.isneginf(lse).all()


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    q, k, v, idx = make(np.random.default_rng(3))
    got = attn.sparse_attention(*(torch.from_numpy(x) for x in (q, k, v, idx)))
    assert isinstance(got, torch.Tensor)
    np.testing.assert_array_equal(got.numpy(), attn.sparse_attention(q, k, v, idx))


@pytest.mark.parametrize("change, error, message", [
    (lambda i: i.__setitem__((0, 0, 0, 0), -2), ValueError, "is -2: must be -1 (no key) or a key in 0..49"),
    (lambda i: i.__setitem__((1, 1, 4, 8), 50), ValueError, "indices at (batch entry 1, head 1, row 4, slot 8) is 50"),
    (lambda i: i.__setitem__((0, 1, 2, slice(0, 2)), 7), ValueError, "names key 7 a second time"),
])
def test_bad_indices_are_refused_by_name(change, error, message):
    q, k, v, idx = make(np.random.default_rng(4))
    change(idx)
    with pytest.raises(error) as e:
        attn.sparse_attention(q, k, v, idx)
    assert message in str(e.value)


def test_bad_shapes_and_dtypes_are_refused():
    q, k, v, idx = make(np.random.default_rng(5))
    with pytest.raises(ValueError, match="indices must be"):
        attn.sparse_attention(q, k, v, idx[..., :4, :])
    with pytest.raises(TypeError, match="indices must be an integer array"):
        attn.sparse_attention(q, k, v, idx.astype(np.float32))
    with pytest.raises(ValueError, match="beyond int32"):
        attn.sparse_attention(q, k, v, idx.astype(np.int64) + 2**31)
    with pytest.raises(ValueError, match="sinks"):
        attn.sparse_attention(q, k, v, idx, sinks=np.zeros(5))


# ---------------------------------------------------------------------------
# Over a PagedKVCache: each request against the definition over its own
# sequence's keys and values, as the cache stores them.

def stored(x, dtype):
    """x as a cache of that dtype holds it (rows of the last axis), in float64."""
    return np.asarray(x, np.float64) if dtype == "f32" else attn.quantize(x, dtype).dequantize().astype(np.float64)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "q8_0", "q4_0"])
def test_sparse_attention_over_a_paged_cache_is_each_request_alone(dtype, layout):
    rng = np.random.default_rng(11)
    hq, hkv, d, dv, topk = 4, 2, 32, 64, 7
    cache = attn.PagedKVCache(40, 4, hkv, d, value_head_dim=dv, dtype=dtype, layout=layout)
    lengths = [9, 0, 30, 5]  # tokens per sequence: pages partly filled, one empty
    seqs, kv = [], {}
    for n in lengths:
        s = cache.add_sequence()
        k, v = rng.standard_normal((n, hkv, d)).astype(np.float32), rng.standard_normal((n, hkv, dv)).astype(np.float32)
        cache.append([s], k, v, [0, n])
        seqs.append(s)
        kv[s] = (k, v)
    fork = cache.fork(seqs[2])  # shares the pages of sequence 2
    kv[fork] = kv[seqs[2]]
    order = [seqs[2], seqs[0], seqs[1], fork, seqs[3]]
    qo_lens = [3, 1, 2, 0, 2]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    q = rng.standard_normal((qo_indptr[-1], hq, d)).astype(np.float32)
    indices = np.full((qo_indptr[-1], hkv, topk), -1, np.int32)
    for r, s in enumerate(order):
        n = len(kv[s][0])
        for row in range(qo_indptr[r], qo_indptr[r + 1]):
            for h in range(hkv):
                picks = rng.permutation(n)[:rng.integers(0, min(n, topk) + 1)]
                indices[row, h, rng.permutation(topk)[:len(picks)]] = picks
    sinks = np.linspace(-1, 1, hq)
    out, lse = attn.sparse_attention(q, qo_indptr, cache, order, indices, softcap=4.0, sinks=sinks, return_lse=True)
    assert out.shape == (qo_indptr[-1], hq, dv) and lse.shape == (qo_indptr[-1], hq) and out.dtype == np.float32
    for r, s in enumerate(order):
        rows = slice(qo_indptr[r], qo_indptr[r + 1])
        if qo_lens[r] == 0:
            continue
        k, v = (stored(x, dtype).transpose(1, 0, 2) for x in kv[s])  # (hkv, n, ·)
        if len(kv[s][0]) == 0:
            k, v = np.zeros((hkv, 0, d)), np.zeros((hkv, 0, dv))
        want, want_lse = picked(q[rows].transpose(1, 0, 2), k, v, indices[rows].transpose(1, 0, 2), softcap=4.0,
                                sinks=sinks)
        np.testing.assert_allclose(out[rows], want.transpose(1, 0, 2), rtol=0, atol=2e-6)
        np.testing.assert_allclose(lse[rows], want_lse.T, rtol=0, atol=2e-6)


def test_sparse_attention_over_a_paged_cache_refuses_by_name():
    rng = np.random.default_rng(12)
    cache = attn.PagedKVCache(8, 4, 1, 16)
    s = cache.add_sequence()
    cache.append([s], rng.standard_normal((6, 1, 16)), rng.standard_normal((6, 1, 16)), [0, 6])
    q = rng.standard_normal((2, 2, 16)).astype(np.float32)
    indices = np.array([[[0, 5]], [[1, -1]]], np.int32)
    out = attn.sparse_attention(q, [0, 2], cache, [s], indices)
    assert out.shape == (2, 2, 16)
    far = indices.copy()
    far[1, 0, 1] = 6  # the sequence holds positions 0..5
    with pytest.raises(ValueError, match=r"indices at \(row 1 \(request 0, of 6 keys\), head 0, slot 1\) is 6"):
        attn.sparse_attention(q, [0, 2], cache, [s], far)
    twice = indices.copy()
    twice[0, 0, 1] = 0
    with pytest.raises(ValueError, match="names key 0 a second time"):
        attn.sparse_attention(q, [0, 2], cache, [s], twice)
    with pytest.raises(ValueError, match="qo_indptr"):
        attn.sparse_attention(q, [0, 1], cache, [s], indices)
    with pytest.raises(ValueError, match=r"indices \(nnz_q, Hkv or 1, topk\), got .* indices \(2, 1, 1, 2\)"):
        attn.sparse_attention(q, [0, 2], cache, [s], indices[:, :, None])
    with pytest.raises(ValueError, match=r"indices must be \(nnz_q, Hkv or 1, topk\) = \(2, 1 or 1, topk\)"):
        attn.sparse_attention(q, [0, 2], cache, [s], indices[:1])
    with pytest.raises(KeyError):
        attn.sparse_attention(q, [0, 2], cache, [s + 1], indices)
    with pytest.raises(TypeError, match="missing indices"):
        attn.sparse_attention(q, [0, 2], cache, [s])
