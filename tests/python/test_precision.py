"""attention(..., precision="bf16"|"int8") against NumPy: q, k, v rounded to
bfloat16 and then computed exactly (float64) is what any bf16 attention
starts from; attn rounds the softmax's weights too, which adds about 1e-3.
int8 is the same with q and k quantized per row instead (k less the mean of
its head's keys), written here from docs/semantics.md "Precision". Both
against the exact result on the unrounded inputs, within the issue's bounds:
4e-3 for bf16, 2e-2 for int8."""
import numpy as np
import pytest

import attn


def bf16(x):
    """x rounded to bfloat16 (nearest, ties to even), as float64."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def int8(x, center=None):
    """x's rows quantized to int8 codes with one scale per row, less center
    (then added back), as float64: center + s * round((x - center) / s),
    s = max |x - center| / 127 (computed in float32, as attn does)."""
    x = np.asarray(x, np.float32)
    c = np.zeros_like(x) if center is None else np.broadcast_to(center, x.shape).astype(np.float32)
    diff = x - c
    s = np.abs(diff).max(-1, keepdims=True) / np.float32(127)
    return c.astype(np.float64) + s.astype(np.float64) * np.round(diff / s)


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


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 300, 64), (1, 2, 130, 128), (1, 2, 70, 33)])
def test_int8_against_quantized_inputs(shape, causal):
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    k += np.float32(3)  # keys sharing an offset, as trained models' do: the mean takes it out
    out = attn.attention(q, k, v, causal=causal, precision="int8")
    assert out.dtype == np.float32
    exact = reference(*(x.astype(np.float64) for x in (q, k, v)), causal=causal)
    mean = k.astype(np.float64).mean(-2, keepdims=True).astype(np.float32)
    quantized = reference(int8(q), int8(k, mean), bf16(v), causal=causal)
    assert rel(out, quantized) < 2e-3         # P's rounding on top of the inputs'
    assert 1e-3 < rel(out, exact) < 2e-2      # quantized, and within the bound
    assert rel(out, quantized) < rel(out, exact) / 2


def test_bf16_with_compact_kv():
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 2, 100, 64)).astype(np.float32) for _ in range(3))
    kq, vq = attn.quantize(k, "q8_0"), attn.quantize(v, "q8_0")
    out = attn.attention(q, kq, vq, precision="bf16")
    exact = reference(q.astype(np.float64), kq.dequantize().astype(np.float64), vq.dequantize().astype(np.float64))
    assert 1e-4 < rel(out, exact) < 4e-3


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_refusals(precision):
    q = np.zeros((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match="precision must be 'f32', 'bf16' or 'int8', got 'fp8'"):
        attn.attention(q, q, q, precision="fp8")
    with pytest.raises(ValueError, match="pass float32 q, k, v"):
        attn.attention(q.astype(np.float64), q, q, precision=precision)
    torch = pytest.importorskip("torch")
    t = torch.zeros((2, 3, 8), requires_grad=True)
    with pytest.raises(ValueError, match="precision must be 'f32', 'bf16' or 'int8', got 'fp8'"):
        attn.attention(t, t, t, precision="fp8")  # the value first, before the gradient
    with pytest.raises(RuntimeError, match=f"q requires grad, but precision='{precision}' is for the forward"):
        attn.attention(t, t, t, precision=precision)
    with torch.no_grad():
        assert attn.attention(t, t, t, precision=precision).shape == (2, 3, 8)


def test_decode_takes_the_int8_unit_from_eight_rows_per_kv_head():
    assert attn.decode_precision_unit("int8", 1) == "highway"
    assert attn.decode_precision_unit("int8", 8) == attn.precision_unit("int8")
    assert attn.decode_precision_unit("bf16", 1) == attn.precision_unit("bf16")
    with pytest.raises(ValueError, match="precision must be 'f32', 'bf16' or 'int8', got 'fp8'"):
        attn.decode_precision_unit("fp8", 8)


def test_precision_unit_names_the_units():
    assert attn.precision_unit("f32") == "highway"
    assert attn.precision_unit("bf16") in ("highway", "avx512_bf16", "neon_bf16")
    assert attn.precision_unit("int8") in ("highway", "avx512_vnni", "neon_dotprod")
    with pytest.raises(ValueError, match="precision must be 'f32', 'bf16' or 'int8', got 'fp8'"):
        attn.precision_unit("fp8")
