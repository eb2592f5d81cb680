"""attn.latent_attention (MLA's absorbed attention) against its definition
written here in float64 NumPy: logits scale · (q_nope·c + q_pe·k_pe), the
softmax over the keys, out = Σ softmax · c; and against the expanded form of
a DeepSeek-style layer (per-head keys and values decompressed by W_UK and
W_UV), which the absorbed form must equal within float rounding."""
import numpy as np
import pytest

import attn

R, P = 32, 8  # kv_lora_rank and qk_rope_head_dim, small


def definition(q_nope, q_pe, ckv, kpe, scale, causal=False):
    q_nope, q_pe, ckv, kpe = (np.asarray(x, np.float64) for x in (q_nope, q_pe, ckv, kpe))
    logits = scale * (np.einsum("ihr,jr->hij", q_nope, ckv) + np.einsum("ihp,jp->hij", q_pe, kpe))
    n_q, n_k = q_nope.shape[0], ckv.shape[0]
    if causal:
        allowed = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + n_k - n_q
        logits = np.where(allowed, logits, -np.inf)
    top = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - top)
    out = np.einsum("hij,jr->ihr", e / e.sum(axis=-1, keepdims=True), ckv)
    return out, (np.log(e.sum(axis=-1)) + top[..., 0]).T


def inputs(rng, n_q=3, heads=5, n_k=40, dtype=np.float32):
    cache = rng.standard_normal((n_k, R + P)).astype(dtype)  # one row per token: [c | k_pe]
    return (rng.standard_normal((n_q, heads, R)).astype(dtype), rng.standard_normal((n_q, heads, P)).astype(dtype),
            cache)


@pytest.mark.parametrize("causal", [False, True])
def test_latent_attention_is_the_definition(causal):
    q_nope, q_pe, cache = inputs(np.random.default_rng(1))
    want, want_lse = definition(q_nope, q_pe, cache[:, :R], cache[:, R:], 0.3, causal)
    # the cache's rows in place, and separate arrays (copied side by side): the same
    out, lse = attn.latent_attention(q_nope, q_pe, cache[:, :R], cache[:, R:], scale=0.3, causal=causal,
                                     return_lse=True)
    apart = attn.latent_attention(q_nope, q_pe, cache[:, :R].copy(), cache[:, R:].copy(), scale=0.3, causal=causal)
    assert out.shape == (3, 5, R) and lse.shape == (3, 5) and out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out, apart)
    out64 = attn.latent_attention(*(x.astype(np.float64) for x in (q_nope, q_pe)), cache[:, :R].astype(np.float64),
                                  cache[:, R:].astype(np.float64), scale=0.3, causal=causal)
    np.testing.assert_allclose(out64, want, rtol=1e-12, atol=1e-13)


def test_a_decode_step_over_a_long_cache_and_float16_rows():
    q_nope, q_pe, cache = inputs(np.random.default_rng(2), n_q=1, heads=16, n_k=1500)  # the split-KV kernel
    want, _ = definition(q_nope, q_pe, cache[:, :R], cache[:, R:], 0.2)
    np.testing.assert_allclose(attn.latent_attention(q_nope, q_pe, cache[:, :R], cache[:, R:], scale=0.2), want,
                               rtol=1e-5, atol=1e-6)
    half = cache.astype(np.float16)  # read as float16, computed in float32
    want_half, _ = definition(q_nope, q_pe, half[:, :R], half[:, R:], 0.2)
    np.testing.assert_allclose(attn.latent_attention(q_nope, q_pe, half[:, :R], half[:, R:], scale=0.2), want_half,
                               rtol=1e-5, atol=1e-6)


def test_absorbed_equals_expanded():
    """A DeepSeek-style attention: per-head keys [W_UK c | k_pe] and values
    W_UV c, softmax scale 1/sqrt(qk_nope + rope). Absorbed: q_nope W_UK over
    the latents, W_UV applied to the latent output."""
    rng = np.random.default_rng(3)
    heads, nope, v_dim, n_k = 4, 12, 10, 30
    w_uk = rng.standard_normal((heads, nope, R)) / np.sqrt(R)
    w_uv = rng.standard_normal((heads, v_dim, R)) / np.sqrt(R)
    c, k_pe = rng.standard_normal((n_k, R)), rng.standard_normal((n_k, P))
    q_n, q_pe = rng.standard_normal((2, heads, nope)), rng.standard_normal((2, heads, P))
    scale = 1 / np.sqrt(nope + P)
    keys = np.concatenate([np.einsum("hnr,jr->hjn", w_uk, c), np.broadcast_to(k_pe, (heads, n_k, P))], axis=-1)
    values = np.einsum("hvr,jr->hjv", w_uv, c)
    q = np.concatenate([q_n, q_pe], axis=-1).transpose(1, 0, 2)  # (heads, n_q, nope + rope)
    expanded = attn.attention(q, keys, values, scale=scale, causal=True).transpose(1, 0, 2)
    latent = attn.latent_attention(np.einsum("ihn,hnr->ihr", q_n, w_uk), q_pe, c, k_pe, scale=scale, causal=True)
    np.testing.assert_allclose(np.einsum("ihr,hvr->ihv", latent, w_uv), expanded, rtol=1e-10, atol=1e-12)


def test_bad_shapes_are_refused_by_name():
    q_nope, q_pe, cache = inputs(np.random.default_rng(4))
    with pytest.raises(ValueError, match="ckv must be"):
        attn.latent_attention(q_nope, q_pe, cache[:, :R - 1], cache[:, R:], scale=0.1)
    with pytest.raises(ValueError, match="q_pe's rows and heads"):
        attn.latent_attention(q_nope, q_pe[:, :2], cache[:, :R], cache[:, R:], scale=0.1)
    with pytest.raises(TypeError):
        attn.latent_attention(q_nope, q_pe, cache[:, :R], cache[:, R:])  # scale is required
