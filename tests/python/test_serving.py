"""What serving needs (issue 21): attention sinks, against gpt-oss's
reference written here in torch (a sink column joined to the logits before
the softmax and dropped after it; its gradients by torch's autograd) and in
NumPy."""
import numpy as np
import pytest

import attn

F32 = dict(rtol=1e-5, atol=1e-6)


def rand(rng, *shape, dtype=np.float32):
    return rng.uniform(-1, 1, shape).astype(dtype)


def dense_with_sinks(q, k, v, sinks, allowed=True, scale=None, softcap=None):
    """float64 NumPy: the sink is one more term of each row's denominator."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    s = (1 / np.sqrt(q.shape[-1]) if scale is None else scale) * q @ np.swapaxes(k, -1, -2)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    s = np.where(allowed, s, -np.inf)
    sink = np.asarray(sinks, np.float64)[:, None, None]
    top = np.maximum(s.max(axis=-1, keepdims=True), sink)
    e = np.exp(s - top)
    denominator = e.sum(axis=-1, keepdims=True) + np.exp(sink - top)
    w = e / denominator
    return w @ v, w, (top + np.log(denominator))[..., 0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_q, n_k, causal", [(5, 7, True), (300, 260, "top_left"), (2, 1500, True),
                                              (4, 6, ("offset", -2))])
def test_sinks_forward(dtype, n_q, n_k, causal):
    rng = np.random.default_rng(n_q)
    q, k, v = rand(rng, 2, 4, n_q, 16, dtype=dtype), rand(rng, 2, 2, n_k, 16, dtype=dtype), \
        rand(rng, 2, 2, n_k, 8, dtype=dtype)
    sinks = np.array([0.5, -1.0, 3.0, 0.0])
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    diagonal = {True: n_k - n_q, "top_left": 0}.get(causal if not isinstance(causal, tuple) else None,
                                                      causal[1] if isinstance(causal, tuple) else 0)
    want = dense_with_sinks(q, k, v, sinks, allowed=j <= i + diagonal, softcap=5.0)
    out, w, lse = attn.attention(q, k, v, causal=causal, softcap=5.0, sinks=sinks, return_weights=True,
                                 return_lse=True)
    tol = F32 if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out, want[0], **tol)
    np.testing.assert_allclose(w, want[1], **tol)
    np.testing.assert_allclose(lse, want[2], **tol)
    assert np.all(w.sum(axis=-1) < 1)                       # the sink takes its share
    out_only, lse_only = attn.attention(q, k, v, causal=causal, softcap=5.0, sinks=sinks, return_lse=True)
    np.testing.assert_allclose(out_only, want[0], **tol)    # (n_q <= 8: the split-KV kernel)
    np.testing.assert_allclose(lse_only, want[2], **tol)


def test_sinks_against_torch_autograd():
    """gpt-oss's sdpa: the sink as a logit column, softmax, the column
    dropped; dq, dk, dv and dsinks by torch's autograd."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    sinks = torch.tensor([0.3, -0.7, 1.5, 0.0], dtype=torch.float64, requires_grad=True)
    dout = torch.randn(2, 4, 6, 5, generator=g, dtype=torch.float64)

    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    logits = q @ kr.transpose(-1, -2) / np.sqrt(8)
    logits = logits.masked_fill(torch.ones(6, 9, dtype=torch.bool).triu(9 - 6 + 1), float("-inf"))
    column = sinks.reshape(1, 4, 1, 1).expand(2, 4, 6, 1)
    weights = torch.softmax(torch.cat([logits, column], dim=-1), dim=-1)[..., :-1]
    (weights @ vr).backward(dout)

    out = attn.attention(q.detach(), k.detach(), v.detach(), causal=True, sinks=sinks.detach())
    np.testing.assert_allclose(out.numpy(), (weights @ vr).detach().numpy(), rtol=1e-12, atol=1e-14)
    grads = attn.attention_backward(q.detach(), k.detach(), v.detach(), dout, causal=True, sinks=sinks.detach())
    assert len(grads) == 4
    for got, want in zip(grads, (q.grad, k.grad, v.grad, sinks.grad)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)

    # and through attn's autograd: learnable sinks get their gradient
    q2, k2, v2, s2 = (x.detach().clone().requires_grad_() for x in (q, k, v, sinks))
    attn.attention(q2, k2, v2, causal=True, sinks=s2).backward(dout)
    for got, want in zip((q2.grad, k2.grad, v2.grad, s2.grad), (q.grad, k.grad, v.grad, sinks.grad)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


def test_sinks_refuse_bad_input():
    q = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"sinks must hold one logit per query head \(2\), got 3"):
        attn.attention(q, q, q, sinks=np.zeros(3))
    with pytest.raises(ValueError, match="sinks must be finite"):
        attn.attention(q, q, q, sinks=np.array([0, np.inf]))
    with pytest.raises(ValueError, match="sinks must be a 1-D array"):
        attn.attention(q, q, q, sinks=np.zeros((2, 1)))
