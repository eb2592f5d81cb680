"""attention(..., precision="bf16") against NumPy: q, k, v rounded to bfloat16
and then computed exactly (float64) is what any bf16 attention starts from;
attn rounds the softmax's weights too, which adds about 1e-3. Both against
the exact result on the unrounded inputs, within the issue's 4e-3."""
import numpy as np
import pytest

import attn


def bf16(x):
    """x rounded to bfloat16 (nearest, ties to even), as float64."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def reference(q, k, v, causal=False):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2:]
        s = np.where(np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 300, 64), (1, 2, 130, 128)])
def test_bf16_against_rounded_inputs(shape, causal):
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    out = attn.attention(q, k, v, causal=causal, precision="bf16")
    assert out.dtype == np.float32
    exact = reference(*(x.astype(np.float64) for x in (q, k, v)), causal=causal)
    rounded = reference(bf16(q), bf16(k), bf16(v), causal=causal)
    assert rel(out, rounded) < 2e-3           # P's rounding on top of the inputs'
    assert 1e-4 < rel(out, exact) < 4e-3      # rounded, and within the bound
    assert rel(attn.attention(q, k, v, causal=causal), exact) < 1e-5


def test_bf16_with_compact_kv():
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 2, 100, 64)).astype(np.float32) for _ in range(3))
    kq, vq = attn.quantize(k, "q8_0"), attn.quantize(v, "q8_0")
    out = attn.attention(q, kq, vq, precision="bf16")
    exact = reference(q.astype(np.float64), kq.dequantize().astype(np.float64), vq.dequantize().astype(np.float64))
    assert 1e-4 < rel(out, exact) < 4e-3


def test_bf16_refusals():
    q = np.zeros((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match="precision must be 'f32' or 'bf16', got 'fp8'"):
        attn.attention(q, q, q, precision="fp8")
    with pytest.raises(ValueError, match="pass float32 q, k, v"):
        attn.attention(q.astype(np.float64), q, q, precision="bf16")
    torch = pytest.importorskip("torch")
    t = torch.zeros((2, 3, 8), requires_grad=True)
    with pytest.raises(ValueError, match="precision must be 'f32' or 'bf16', got 'fp8'"):
        attn.attention(t, t, t, precision="fp8")  # the value first, before the gradient
    with pytest.raises(RuntimeError, match="q requires grad, but precision='bf16' is for the forward"):
        attn.attention(t, t, t, precision="bf16")
    with torch.no_grad():
        assert attn.attention(t, t, t, precision="bf16").shape == (2, 3, 8)


def test_precision_unit_names_the_units():
    assert attn.precision_unit("f32") == "highway"
    assert attn.precision_unit("bf16") in ("highway", "avx512_bf16", "neon_bf16")
    with pytest.raises(ValueError, match="precision must be 'f32' or 'bf16', got 'fp8'"):
        attn.precision_unit("fp8")
