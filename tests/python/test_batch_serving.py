"""Serving many sequences (issue 48): merge_state and merge_states against
attention over the union of the keys, written here in float64 NumPy, and
FlashInfer's layouts and conventions."""
import numpy as np
import pytest

import attn


def dense_state(q, k, v):
    """float64 attention of q (n, H, d) over k, v (m, H, ·): v (n, H, d_v), lse (n, H)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("nhd,mhd->hnm", q, k) / np.sqrt(q.shape[-1])
    if s.shape[-1] == 0:
        return np.zeros(q.shape[:2] + v.shape[-1:]), np.full(q.shape[:2], -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - top)
    out = np.einsum("hnm,mhd->nhd", e / e.sum(-1, keepdims=True), v)
    return out, (top[..., 0] + np.log(e.sum(-1))).T


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_merge_state_of_two_parts_is_attention_over_both(dtype):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((5, 3, 8)), rng.standard_normal((13, 3, 8)), rng.standard_normal((13, 3, 4))
    whole = dense_state(q, k, v)
    a, b = dense_state(q, k[:6], v[:6]), dense_state(q, k[6:], v[6:])
    out, lse = attn.merge_state(*(x.astype(dtype) for x in (*a, *b)))
    assert out.dtype == lse.dtype == dtype and out.shape == (5, 3, 4) and lse.shape == (5, 3)
    tol = 1e-13 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(out, whole[0], atol=tol)
    np.testing.assert_allclose(lse, whole[1], atol=tol)

    v_acc, s_acc = (x.astype(dtype).copy() for x in a)
    attn.merge_state_in_place(v_acc, s_acc, *b)
    np.testing.assert_allclose(v_acc, whole[0], atol=tol)
    np.testing.assert_allclose(s_acc, whole[1], atol=tol)


def test_merge_states_in_order_with_an_empty_part():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((4, 2, 8)), rng.standard_normal((10, 2, 8)), rng.standard_normal((10, 2, 3))
    cuts = [0, 4, 4, 10]  # the middle part has no key: lse -inf and zeros, which change nothing
    parts = [dense_state(q, k[a:b], v[a:b]) for a, b in zip(cuts, cuts[1:])]
    vs, ss = np.stack([p[0] for p in parts], axis=1), np.stack([p[1] for p in parts], axis=1)
    out, lse = attn.merge_states(vs, ss)
    whole = dense_state(q, k, v)
    np.testing.assert_allclose(out, whole[0], atol=1e-13)
    np.testing.assert_allclose(lse, whole[1], atol=1e-13)


def test_merge_state_torch_and_flashinfers_base_2():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((3, 2, 8)), rng.standard_normal((9, 2, 8)), rng.standard_normal((9, 2, 8))
    a, b = dense_state(q, k[:5], v[:5]), dense_state(q, k[5:], v[5:])
    # FlashInfer's lse is base 2: times ln 2 it is attn's natural log.
    a2, b2 = a[1] / np.log(2), b[1] / np.log(2)
    out, lse = attn.merge_state(torch.tensor(a[0], dtype=torch.float32), torch.tensor(a2 * np.log(2)),
                                torch.tensor(b[0], dtype=torch.float32), torch.tensor(b2 * np.log(2)))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64  # one float64 input
    np.testing.assert_allclose(out.numpy(), dense_state(q, k, v)[0], atol=1e-6)
    v_t, s_t = torch.tensor(a[0]), torch.tensor(a[1])
    attn.merge_state_in_place(v_t, s_t, b[0], b[1])
    np.testing.assert_allclose(s_t.numpy(), lse.numpy(), atol=1e-6)
    with pytest.raises(TypeError, match="v must be float32 or float64"):
        attn.merge_state_in_place(v_t.bfloat16(), s_t, b[0], b[1])


def test_merge_state_refuses_bad_input():
    v, s = np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"v_b must have shape \(2, 3, 4\)"):
        attn.merge_state(v, s, v[:1], s[:1])
    with pytest.raises(ValueError, match="vs must be"):
        attn.merge_states(v, s)
    with pytest.raises(ValueError, match="must be writable"):
        ro = v.copy()
        ro.flags.writeable = False
        attn.merge_state_in_place(ro, s, v, s)
