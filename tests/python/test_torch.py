"""attn against PyTorch 1.13: softmax, attention built from explicit torch ops
with every option of docs/semantics.md "Attention", and the two published forms
of RoPE."""
import math

import numpy as np
import pytest
import torch

import attn
from torch_reference import torch_attention
from util import rel_err



def check(q, k, v, **kw):
    out_ref, w_ref = (t.numpy() for t in torch_attention(q, k, v, **kw))
    out, w = attn.attention(q, k, v, return_weights=True, **kw)
    assert out.dtype == np.float64
    assert rel_err(out, out_ref) <= 1e-12
    assert rel_err(w, w_ref) <= 1e-12
    f32 = [a.astype(np.float32) for a in (q, k, v)]
    kw32 = dict(kw)
    if kw.get("mask") is not None and kw["mask"].dtype != bool:
        kw32["mask"] = kw["mask"].astype(np.float32)
    out, w = attn.attention(*f32, return_weights=True, **kw32)
    assert out.dtype == np.float32
    assert rel_err(out, out_ref) <= 2e-5
    assert rel_err(w, w_ref) <= 2e-5


def qkv(rng, batch, hq, hkv, nq, nk, d, dv):
    return (rng.normal(size=batch + (hq, nq, d)), rng.normal(size=batch + (hkv, nk, d)),
            rng.normal(size=batch + (hkv, nk, dv)))


def random_mask(rng, shape, kind):
    """A boolean mask (70% allowed) or an additive one (normal, 20% -inf)."""
    if kind == "bool":
        return rng.random(shape) < 0.7
    mask = rng.normal(size=shape)
    mask[rng.random(shape) < 0.2] = -np.inf
    return mask


@pytest.mark.parametrize("shape", [(3,), (4, 7), (2, 3, 33), (1, 1)])
def test_softmax(shape):
    a = np.random.default_rng(0).normal(scale=10, size=shape)
    ref = torch.softmax(torch.from_numpy(a), dim=-1).numpy()
    assert rel_err(attn.softmax(a), ref) <= 1e-13
    assert rel_err(attn.softmax(a.astype(np.float32)), ref) <= 2e-6
    if len(shape) > 1:
        ref0 = torch.softmax(torch.from_numpy(a), dim=0).numpy()
        assert rel_err(attn.softmax(a, axis=0), ref0) <= 1e-13


@pytest.mark.parametrize("batch,hq,hkv,nq,nk,d,dv", [
    ((), 1, 1, 5, 5, 8, 8), ((2,), 4, 4, 7, 11, 16, 8), ((2, 3), 2, 2, 1, 9, 5, 3),
    ((1,), 8, 2, 6, 6, 32, 32), ((2,), 6, 1, 3, 17, 12, 4), ((), 3, 3, 13, 2, 1, 1)])
def test_shapes_and_gqa(batch, hq, hkv, nq, nk, d, dv):
    rng = np.random.default_rng(hq * 7 + nk)
    check(*qkv(rng, batch, hq, hkv, nq, nk, d, dv))


@pytest.mark.parametrize("causal", [False, True, "bottom_right", "top_left"])
@pytest.mark.parametrize("nq,nk", [(6, 6), (4, 9), (9, 4)])
def test_causal(causal, nq, nk):
    check(*qkv(np.random.default_rng(nq * nk), (2,), 4, 2, nq, nk, 8, 8), causal=causal)


@pytest.mark.parametrize("window", [(2, 0), (0, 0), (3, 1), (-1, 2), (1, -1)])
@pytest.mark.parametrize("causal", [False, "top_left"])
def test_windows(window, causal):
    check(*qkv(np.random.default_rng(5), (2,), 2, 2, 7, 10, 8, 4), window=window, causal=causal)


@pytest.mark.parametrize("softcap", [0.5, 3.0, 50.0])
@pytest.mark.parametrize("scale", [None, 0.1, 2.0])
def test_softcap_and_scale(softcap, scale):
    check(*qkv(np.random.default_rng(6), (), 3, 3, 5, 8, 16, 6), softcap=softcap, scale=scale)


@pytest.mark.parametrize("mask_shape", [(8,), (5, 8), (1, 8), (5, 1), (3, 5, 8), (3, 1, 8),
                                        (2, 1, 5, 8), (2, 3, 5, 8)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks(mask_shape, kind):
    rng = np.random.default_rng(len(mask_shape))
    q, k, v = qkv(rng, (2,), 3, 3, 5, 8, 8, 4)
    mask = random_mask(rng, mask_shape, kind)
    check(q, k, v, mask=mask)
    check(q, k, v, mask=mask, causal="top_left", scale=0.3)


def test_fully_masked_rows_are_zero_not_nan():
    q, k, v = qkv(np.random.default_rng(9), (), 2, 2, 4, 5, 8, 3)
    mask = np.ones((4, 5), dtype=bool)
    mask[1] = False
    for arrays in ((q, k, v), tuple(a.astype(np.float32) for a in (q, k, v))):
        out, w = attn.attention(*arrays, mask=mask, return_weights=True)
        assert np.all(out[:, 1] == 0) and np.all(w[:, 1] == 0)
        assert np.isfinite(out).all()
    # the torch form gives NaN there (the documented difference)
    s = torch.from_numpy(q) @ torch.from_numpy(k).transpose(-1, -2)
    assert torch.isnan(torch.softmax(s.masked_fill(~torch.from_numpy(mask), -math.inf), -1)).any()


# ---------------------------------------------------------------------------
# RoPE: the two published forms.

def rope_rotate_half(x, pos, base, r):
    """GPT-NeoX / Hugging Face LLaMA: x * cos + rotate_half(x) * sin."""
    x = torch.from_numpy(x)
    inv_freq = 1.0 / (base ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    freqs = torch.from_numpy(pos).double()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    xr = x[..., :r]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
    rotated = xr * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()
    return torch.cat([rotated, x[..., r:]], dim=-1).numpy()


def rope_complex(x, pos, base, r):
    """GPT-J / Meta LLaMA: pairs (2i, 2i+1) as complex numbers times e^(i·angle)."""
    x = torch.from_numpy(x)
    inv_freq = 1.0 / (base ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    freqs = torch.from_numpy(pos).double()[..., None] * inv_freq
    cis = torch.polar(torch.ones_like(freqs), freqs)
    xc = torch.view_as_complex(x[..., :r].reshape(*x.shape[:-1], r // 2, 2).contiguous())
    rotated = torch.view_as_real(xc * cis).flatten(-2)
    return torch.cat([rotated, x[..., r:]], dim=-1).numpy()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("d,rotary_dim", [(8, None), (16, 8), (64, 64), (10, 4), (7, 6)])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rope_forms(interleaved, d, rotary_dim, base):
    rng = np.random.default_rng(d)
    x = rng.normal(size=(2, 3, 9, d))
    r = rotary_dim or d
    form = rope_complex if interleaved else rope_rotate_half
    # default positions 0..n-1
    expected = form(x, np.arange(9), base, r)
    got = attn.rope(x, base=base, interleaved=interleaved, rotary_dim=rotary_dim)
    assert rel_err(got, expected) <= 1e-12
    got32 = attn.rope(x.astype(np.float32), base=base, interleaved=interleaved,
                      rotary_dim=rotary_dim)
    assert got32.dtype == np.float32 and rel_err(got32, expected) <= 2e-6
    # explicit positions, per batch, negative and large (a KV cache offset)
    pos = rng.integers(-5000, 200000, size=(2, 1, 9))
    expected = form(x, pos, base, r)
    got = attn.rope(x, pos, base=base, interleaved=interleaved, rotary_dim=rotary_dim)
    assert rel_err(got, expected) <= 1e-10
