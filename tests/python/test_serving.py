"""What serving needs (issue 21): attention sinks, against gpt-oss's
reference written here in torch (a sink column joined to the logits before
the softmax and dropped after it; its gradients by torch's autograd) and in
NumPy."""
import os
import subprocess
import sys

import numpy as np
import pytest

import attn
from util import PEAK_BYTES, PYTHONPATH

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
    np.testing.assert_allclose(out_only, want[0], **tol)    # (n_q <= 32: the split-KV kernel)
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


# ---------------------------------------------------------------------------
# Packed variable-length batches, against one attention call per sequence

def packed(rng, lengths_q, lengths_k, hq=4, hkv=2, d=16, d_v=8, dtype=np.float32):
    cu_q, cu_k = np.concatenate([[0], np.cumsum(lengths_q)]), np.concatenate([[0], np.cumsum(lengths_k)])
    q, k, v = rand(rng, cu_q[-1], hq, d, dtype=dtype), rand(rng, cu_k[-1], hkv, d, dtype=dtype), \
        rand(rng, cu_k[-1], hkv, d_v, dtype=dtype)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(causal="top_left", window=(3, 0)),
                                     dict(causal=True, softcap=5.0, scale=0.3,
                                          alibi_slopes=np.array([0.5, 0.25, -0.125, 1.0]),
                                          sinks=np.array([0.0, 1.0, -1.0, 2.0]))])
def test_varlen_equals_one_call_per_sequence(dtype, options):
    rng = np.random.default_rng(40)
    lengths_q, lengths_k = [5, 0, 300, 1, 2, 70], [9, 3, 300, 600, 0, 70]  # decode, empty, prefill
    q, k, v, cu_q, cu_k = packed(rng, lengths_q, lengths_k, dtype=dtype)
    out, lse = attn.attention_varlen(q, k, v, cu_q.astype(np.int32), cu_k, return_lse=True, **options)
    assert out.shape == (cu_q[-1], 4, 8) and lse.shape == (4, cu_q[-1]) and out.dtype == dtype
    for b in range(len(lengths_q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want, want_lse = attn.attention(*(x.transpose(1, 0, 2) for x in (q[rows], k[keys], v[keys])),
                                        return_lse=True, **options)
        np.testing.assert_array_equal(out[rows], want.transpose(1, 0, 2))
        np.testing.assert_array_equal(lse[:, rows], want_lse)
    np.testing.assert_array_equal(attn.attention_varlen(q, k, v, cu_q, cu_k, **options), out)


def test_varlen_torch_tensors():
    torch = pytest.importorskip("torch")
    q, k, v, cu_q, cu_k = packed(np.random.default_rng(41), [3, 4], [5, 4])
    out = attn.attention_varlen(*(torch.from_numpy(x) for x in (q, k, v)), torch.from_numpy(cu_q), cu_k)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_array_equal(out.numpy(), attn.attention_varlen(q, k, v, cu_q, cu_k))


@pytest.mark.parametrize("change, error, message", [
    (dict(cu_seqlens_q=np.array([1, 3, 7])), ValueError, "cu_seqlens_q[0] must be 0, got 1"),
    (dict(cu_seqlens_q=np.array([0, 5, 3, 7])), ValueError, "must not decrease"),
    (dict(cu_seqlens_k=np.array([0, 5, 8])), ValueError, "cu_seqlens_k must end at k's length 9, got 8"),
    (dict(cu_seqlens_k=np.array([0, 9])), ValueError, "as many sequences"),
    (dict(cu_seqlens_q=np.array([0.0, 3.0, 7.0])), TypeError, "integer array"),
    (dict(cu_seqlens_q=np.array([0, 2**64 - 1, 7], np.uint64)), ValueError,  # (was reported as -1)
     "cu_seqlens_q must fit in int64, got 18446744073709551615"),
    (dict(q=np.zeros((7, 3, 16), np.float32)), ValueError, "multiple of key/value heads"),
    (dict(q=np.zeros((7, 16), np.float32)), ValueError, "packed (total, heads, head_dim)"),
])
def test_varlen_refuses_bad_input(change, error, message):
    q, k, v, cu_q, cu_k = packed(np.random.default_rng(42), [3, 4], [5, 4])
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    args.update(change)
    with pytest.raises(error) as e:
        attn.attention_varlen(**args)
    assert message in str(e.value)


# ---------------------------------------------------------------------------
# The layer's learnable sinks

def test_layer_sinks_are_a_parameter(tmp_path):
    rng = np.random.default_rng(43)
    m = attn.MultiHeadAttention(8, 2, sinks=True, seed=1)
    sd = m.state_dict()
    assert m.sinks and np.array_equal(sd["sinks"], np.zeros(2, np.float32))
    sd["sinks"] = np.array([1.5, -2.0], np.float32)
    m.load_state_dict(sd)
    x = rand(rng, 2, 5, 8)
    y = m(x, x, x, causal=True)[0]
    # the layer by hand: projections, attention with the sinks per head, out_proj
    wq, wk, wv = np.split(sd["in_proj_weight"], 3)
    bq, bk, bv = np.split(sd["in_proj_bias"], 3)
    heads = [(x @ w.T + b).reshape(2, 5, 2, 4).transpose(0, 2, 1, 3) for w, b in ((wq, bq), (wk, bk), (wv, bv))]
    ctx = attn.attention(*heads, causal=True, sinks=sd["sinks"]).transpose(0, 2, 1, 3).reshape(2, 5, 8)
    np.testing.assert_allclose(y, ctx @ sd["out_proj.weight"].T + sd["out_proj.bias"], **F32)
    path = tmp_path / "sinks.safetensors"
    m.save(path)
    loaded = attn.MultiHeadAttention.load(path)
    assert loaded.sinks and np.array_equal(loaded.state_dict()["sinks"], sd["sinks"])
    np.testing.assert_array_equal(loaded(x, x, x, causal=True)[0], y)
    with pytest.raises(ValueError, match="build the layer with sinks=True"):
        attn.MultiHeadAttention(8, 2, seed=1).load_state_dict(sd)


# ---------------------------------------------------------------------------
# The StreamingLLM cache

def streaming_allowed(positions_q, positions_k, sink_tokens, window):
    """Token t attends key j iff j <= t and (j < S or j > t - W)."""
    t, j = np.asarray(positions_q)[:, None], np.asarray(positions_k)[None, :]
    return (j <= t) & ((j < sink_tokens) | (j > t - window))


@pytest.mark.parametrize("chunks", [[1] * 40, [3, 7, 1, 12, 2, 15], [40]])
def test_streaming_cache_original_positions_is_a_dense_mask(chunks):
    S, W, N = 4, 9, sum(chunks)
    rng = np.random.default_rng(44)
    m = attn.MultiHeadAttention(16, 4, num_kv_heads=2, rope=True, sinks=True, seed=2)
    sd = m.state_dict()
    sd["sinks"] = np.array([0.5, -1.0, 1.0, 0.0], np.float32)
    m.load_state_dict(sd)
    x = rand(rng, 2, N, 16)
    blocked = ~streaming_allowed(np.arange(N), np.arange(N), S, W)  # the layer's mask: True blocks
    want = m(x, attn_mask=blocked)[0]
    cache = m.new_cache(sink_tokens=S, window=W)
    parts, start = [], 0
    for n in chunks:
        parts.append(m(x[:, start:start + n], cache=cache, causal=True)[0])
        start += n
        assert len(cache) <= S + W   # bounded memory
    np.testing.assert_allclose(np.concatenate(parts, axis=1), want, rtol=1e-5, atol=1e-6)


def test_streaming_prefill_of_200k_tokens_takes_no_quadratic_memory():
    """A streaming cache's prefill built a dense (n, n) mask for its rule: 918
    MiB more at 30k tokens, and 200k did not fit. Its peak memory now grows by
    no more than the same prefill's without streaming (a plain cache, the
    window as attention's own option) + 64 MiB. Each in a fresh interpreter
    (VmHWM, reset before the call)."""
    code = PEAK_BYTES + """
import sys
import numpy as np, attn
streaming = sys.argv[1] == "streaming"
m = attn.MultiHeadAttention(64, 4, num_kv_heads=2, seed=1)
x = np.random.default_rng(0).standard_normal((1, 200_000, 64)).astype(np.float32)
cache = m.new_cache(sink_tokens=4, window=512) if streaming else m.new_cache()
window = None if streaming else (511, 0)
open('/proc/self/clear_refs', 'w').write('5')
before = peak_bytes()
out = m(x, cache=cache, causal=True, window=window, need_weights=False)[0]
print(peak_bytes() - before, len(cache))
"""
    grew = {}
    for kind in ("plain", "streaming"):
        r = subprocess.run([sys.executable, "-c", code, kind], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": PYTHONPATH})
        assert r.returncode == 0, r.stderr[-2000:]
        grew[kind], held = map(int, r.stdout.split())
        assert held == (516 if kind == "streaming" else 200_000)
    assert grew["streaming"] <= grew["plain"] + (64 << 20), {k: f"{v / 2**20:.0f} MiB" for k, v in grew.items()}


def rope_half(x, positions, base=10000.0):
    """RoPE (half-split pairs) at the given positions, float64: x (..., n, d)."""
    d = x.shape[-1]
    angles = np.asarray(positions, np.float64)[:, None] * base ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(angles), np.sin(angles)
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def test_streaming_cache_positions_in_the_cache():
    """positions='cache': q and every kept key turn by their slot in the
    cache, re-rotated as tokens are evicted; computed here in NumPy."""
    S, W, E, H = 2, 5, 8, 2
    rng = np.random.default_rng(45)
    m = attn.MultiHeadAttention(E, H, rope=True, seed=3)
    sd = {k: v.astype(np.float64) for k, v in m.state_dict().items()}
    wq, wk, wv = np.split(sd["in_proj_weight"], 3)
    bq, bk, bv = np.split(sd["in_proj_bias"], 3)
    heads = lambda y: y.reshape(len(y), H, E // H).transpose(1, 0, 2)  # (H, n, dh)
    x = rand(rng, 1, 20, E)
    cache = m.new_cache(sink_tokens=S, window=W, positions="cache")
    raw_k, values, positions, seen = np.zeros((H, 0, E // H)), np.zeros((H, 0, E // H)), [], 0
    for n in [3, 1, 4, 2, 6, 1, 3]:
        chunk = x[0, seen:seen + n].astype(np.float64)
        got = m(x[:, seen:seen + n], cache=cache, causal=True)[0][0]
        held = raw_k.shape[1]
        raw_k = np.concatenate([raw_k, heads(chunk @ wk.T + bk)], axis=1)
        values = np.concatenate([values, heads(chunk @ wv.T + bv)], axis=1)
        positions += list(range(seen, seen + n))
        q = rope_half(heads(chunk @ wq.T + bq), held + np.arange(n))        # the chunk's slots
        k = rope_half(raw_k, np.arange(raw_k.shape[1]))                     # every key at its slot
        logits = q @ k.swapaxes(-1, -2) / np.sqrt(E // H)
        logits = np.where(streaming_allowed(seen + np.arange(n), positions, S, W), logits, -np.inf)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        ctx = (w / w.sum(-1, keepdims=True) @ values).transpose(1, 0, 2).reshape(n, E)
        np.testing.assert_allclose(got, ctx @ sd["out_proj.weight"].T + sd["out_proj.bias"], rtol=1e-5, atol=1e-6)
        keep = [i for i, p in enumerate(positions) if p < S or i >= len(positions) - W]
        raw_k, values, positions = raw_k[:, keep], values[:, keep], [positions[i] for i in keep]
        seen += n
        assert len(cache) == len(positions)


def test_streaming_cache_refuses_what_it_cannot_honour():
    m = attn.MultiHeadAttention(8, 2, rope=True)
    x = np.zeros((1, 3, 8), np.float32)
    cache = m.new_cache(sink_tokens=2, window=4)
    with pytest.raises(ValueError, match="attends causally: pass causal=True"):
        m(x, cache=cache)
    with pytest.raises(ValueError, match="sets the window itself"):
        m(x, cache=cache, causal=True, window=(2, 0))
    with pytest.raises(ValueError, match="no attn_mask or key_padding_mask"):
        m(x, cache=cache, causal=True, attn_mask=np.zeros((3, 3), bool))
    assert len(cache) == 0                                         # nothing appended
    with pytest.raises(ValueError, match="ALiBi with a streaming cache"):
        attn.MultiHeadAttention(8, 2, alibi=True)(x, cache=attn.MultiHeadAttention(8, 2, alibi=True).new_cache(
            sink_tokens=1, window=2), causal=True)
    with pytest.raises(ValueError, match="positions 'cache' rotates the cached keys"):
        m.new_cache("bf16", sink_tokens=1, window=4, positions="cache")
    with pytest.raises(ValueError, match="both sink_tokens and window"):
        m.new_cache(window=4)
    with pytest.raises(ValueError, match="window must be >= 1"):
        m.new_cache(sink_tokens=1, window=0)
    with pytest.raises(ValueError, match="positions must be 'original' or 'cache'"):
        m.new_cache(sink_tokens=1, window=4, positions="slot")
