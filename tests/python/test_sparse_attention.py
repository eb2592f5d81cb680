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
