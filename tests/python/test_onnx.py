"""attn.onnx.attention and attn.onnx.rotary_embedding against ONNX's
operators as their specification (and the reference implementation that
generates ONNX's test data) define them, written here independently in
float64 NumPy; and attention's return_logits / return_lse / causal offsets
against dense NumPy. The cases follow ONNX's own operator tests
(onnx/backend/test/case/node/attention.py, rotaryembedding.py): their
shapes, attributes and edge cases, with data of our own."""
import numpy as np
import pytest

import attn

F32 = dict(rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# ONNX Attention by its definition (float64)

def split_heads(x, heads):
    """(B, S, H*D) -> (B, H, S, D): ONNX's reading of 3-D inputs."""
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def onnx_attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
                   is_causal=0, kv_num_heads=0, q_num_heads=0, qk_matmul_output_mode=0, scale=None,
                   softcap=0.0, left_window_size=-1, right_window_size=-1, opset=25):
    q, k, v = (np.asarray(x, np.float64) for x in (Q, K, V))
    three_d = q.ndim == 3
    if three_d:
        q, k, v = split_heads(q, q_num_heads), split_heads(k, kv_num_heads), split_heads(v, kv_num_heads)
    if past_key is not None:
        k = np.concatenate([np.asarray(past_key, np.float64), k], axis=2)
        v = np.concatenate([np.asarray(past_value, np.float64), v], axis=2)
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    group = heads // k.shape[1]
    kr, vr = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # query head h reads h // group
    logits = (1 / np.sqrt(d) if scale is None else scale) * q @ kr.swapaxes(-1, -2)
    capped = softcap * np.tanh(logits / softcap) if softcap > 0 else logits
    allowed = np.ones((batch, heads, n_q, n_k), bool)
    bias = np.zeros((batch, heads, n_q, n_k))
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        pad = np.full(m.shape[:-1] + (n_k - m.shape[-1],), False if m.dtype == bool else -np.inf)
        m = np.concatenate([m, pad.astype(m.dtype)], axis=-1)
        if m.dtype == bool:
            allowed &= m
        else:
            bias = bias + m.astype(np.float64)
    j = np.arange(n_k)
    if nonpad_kv_seqlen is not None:
        allowed &= (j < np.asarray(nonpad_kv_seqlen)[:, None])[:, None, None, :]
    # Query i's key position p = offset + i (opset 25's text): the past's
    # length, an external cache's nonpad_kv_seqlen[b] - S, or 0.
    if past_key is not None:
        offset = np.full(batch, np.asarray(past_key).shape[2])
    elif nonpad_kv_seqlen is not None:
        offset = np.asarray(nonpad_kv_seqlen) - n_q
    else:
        offset = np.zeros(batch, int)
    p = (np.arange(n_q)[None, :] + offset[:, None])[:, None, :, None]  # (batch, 1, n_q, 1)
    if is_causal:
        allowed &= j <= p
    if left_window_size >= 0:
        allowed &= p - left_window_size <= j
    if right_window_size >= 0:
        allowed &= j <= p + right_window_size
    masked = np.where(allowed, capped + bias, -np.inf)
    top = masked.max(axis=-1, keepdims=True)
    e = np.where(np.isneginf(masked), 0.0, np.exp(masked - np.where(np.isfinite(top), top, 0.0)))
    total = e.sum(axis=-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)  # no key: zeros
    y = weights @ vr
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(batch, n_q, -1)
    return y, k, v, [logits, capped, masked, weights][qk_matmul_output_mode]


def close(got, want, **tol):
    """Equal -inf patterns and close finite values."""
    got, want = np.asarray(got, np.float64), np.asarray(want)
    assert got.shape == want.shape
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], **(tol or F32))


def expect_refused(operator, case, change, error, message):
    """operator(**inputs, **attrs) with `change` applied raises `error`
    whose text contains `message`."""
    inputs, attrs = case
    with pytest.raises(error) as e:
        operator(**(dict(inputs, **attrs) | change))
    assert message in str(e.value)


def rand(rng, *shape, dtype=np.float32):
    return rng.uniform(-1, 1, shape).astype(dtype)


def qkv(rng, b=2, hq=3, hkv=3, n_q=4, n_k=6, d=8, d_v=8, three_d=False, dtype=np.float32):
    q, k, v = rand(rng, b, hq, n_q, d, dtype=dtype), rand(rng, b, hkv, n_k, d, dtype=dtype), \
        rand(rng, b, hkv, n_k, d_v, dtype=dtype)
    if three_d:
        q, k, v = (x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1) for x in (q, k, v))
    return q, k, v


# The shapes and attributes of ONNX's operator tests (data of our own).
CASES = {
    "4d": dict(),
    "4d_gqa": dict(shape=dict(hq=9, hkv=3)),
    "4d_diff_heads_sizes": dict(shape=dict(d_v=10)),
    "4d_scaled": dict(attrs=dict(scale=0.01)),
    "4d_causal": dict(attrs=dict(is_causal=1)),  # no cache: top-left, keys 4 and 5 never seen
    "4d_gqa_causal": dict(shape=dict(hq=9, hkv=3), attrs=dict(is_causal=1)),
    "4d_attn_mask": dict(mask=(4, 6)),
    "4d_attn_mask_3d": dict(mask=(2, 1, 4, 6)),
    "4d_attn_mask_3d_causal": dict(mask=(2, 1, 4, 6), attrs=dict(is_causal=1)),
    "4d_attn_mask_4d": dict(mask=(2, 3, 4, 6)),
    "4d_attn_mask_bool": dict(mask=(4, 6), bool_mask=True),
    "4d_attn_mask_bool_4d_causal": dict(mask=(2, 3, 4, 6), bool_mask=True, attrs=dict(is_causal=1)),
    "4d_with_past_and_present": dict(mask=(4, 18), past=12),
    "4d_gqa_with_past_and_present": dict(shape=dict(hq=9, hkv=3), mask=(4, 18), past=12),
    "4d_diff_heads_with_past_and_present_mask4d": dict(shape=dict(d_v=10), mask=(2, 3, 4, 18), past=12),
    "4d_softcap": dict(attrs=dict(softcap=2.0)),
    "4d_with_qk_matmul": dict(attrs=dict(qk_matmul_output_mode=0)),
    "4d_with_qk_matmul_softcap_mode0": dict(mask=(4, 6), attrs=dict(softcap=2.0, qk_matmul_output_mode=0)),
    "4d_with_qk_matmul_softcap": dict(mask=(4, 6), attrs=dict(softcap=2.0, qk_matmul_output_mode=1)),
    "4d_with_qk_matmul_bias": dict(mask=(4, 6), attrs=dict(qk_matmul_output_mode=2)),
    "4d_with_qk_matmul_softmax": dict(mask=(4, 6), attrs=dict(qk_matmul_output_mode=3)),
    "4d_past_qk_matmul_bias_3d_mask_causal": dict(mask=(2, 1, 4, 18), past=12,
                                                  attrs=dict(is_causal=1, qk_matmul_output_mode=2)),
    "4d_causal_with_past_and_present": dict(shape=dict(n_k=4), past=3, attrs=dict(is_causal=1)),
    "4d_softcap_neginf_mask": dict(shape=dict(b=1, hq=1, hkv=1), mask=(4, 6), neginf_columns=True,
                                   attrs=dict(softcap=0.5, qk_matmul_output_mode=2)),
    "3d": dict(three_d=True),
    "3d_gqa": dict(three_d=True, shape=dict(hq=9, hkv=3)),
    "3d_diff_heads_sizes_causal": dict(three_d=True, shape=dict(d_v=10), attrs=dict(is_causal=1)),
    "3d_softcap": dict(three_d=True, attrs=dict(softcap=3.0)),
    "3d_with_past_and_present_qk_matmul_softcap": dict(three_d=True, mask=(4, 18), past=12,
                                                       attrs=dict(softcap=2.0, qk_matmul_output_mode=1)),
    "3d_gqa_with_past_and_present_softmax": dict(three_d=True, shape=dict(hq=9, hkv=3), mask=(4, 18),
                                                 past=12, attrs=dict(qk_matmul_output_mode=3)),
    # a mask shorter than the keys, padded (opset 24), with nonpad_kv_seqlen
    "4d_diff_heads_mask4d_padded_kv": dict(shape=dict(d_v=10), mask=(2, 3, 4, 4), nonpad=[3, 4]),
    "4d_short_bool_mask": dict(mask=(4, 4), bool_mask=True, attrs=dict(qk_matmul_output_mode=2)),
    # external caches: causal offset nonpad[b] - S, per batch entry
    "4d_gqa_causal_nonpad_decode": dict(shape=dict(hq=4, hkv=2, n_q=1, n_k=8), nonpad=[8, 5],
                                        attrs=dict(is_causal=1)),
    "4d_causal_nonpad_continued_prefill": dict(shape=dict(b=1, hq=2, hkv=2, n_q=2, n_k=4), nonpad=[4],
                                               attrs=dict(is_causal=1)),
    "4d_causal_nonpad_negative_offset": dict(shape=dict(b=1, hq=2, hkv=2, n_q=4, n_k=4), nonpad=[2],
                                             attrs=dict(is_causal=1, qk_matmul_output_mode=3)),
    "4d_causal_nonpad_attn_mask": dict(shape=dict(hq=2, hkv=2, n_q=3, n_k=6), mask=(2, 1, 3, 6),
                                       bool_mask=True, nonpad=[4, 5], attrs=dict(is_causal=1)),
    "4d_causal_nonpad_batch_prefill": dict(shape=dict(b=3, hq=2, hkv=2, n_q=2, n_k=6), nonpad=[4, 5, 6],
                                           attrs=dict(is_causal=1, qk_matmul_output_mode=2)),
    # rows no key may take part in: zeros, never NaN (Y and the mode-3 weights)
    "fully_masked_row": dict(shape=dict(b=1, hq=2, hkv=2, n_q=2, n_k=2), mask=(2, 2), bool_mask=True,
                             masked_row=0, attrs=dict(qk_matmul_output_mode=3)),
    "fully_masked_row_causal": dict(shape=dict(b=1, hq=2, hkv=2, n_q=2, n_k=2), mask=(2, 2), bool_mask=True,
                                    masked_row=1, attrs=dict(is_causal=1)),
    # opset 25's sliding windows, from p = offset + i, with and without causal
    "4d_window": dict(attrs=dict(left_window_size=2, right_window_size=1, qk_matmul_output_mode=3)),
    "4d_window_left_only": dict(attrs=dict(left_window_size=1, qk_matmul_output_mode=2)),
    "4d_window_right_only": dict(attrs=dict(right_window_size=0, qk_matmul_output_mode=2)),
    "4d_causal_window": dict(attrs=dict(is_causal=1, left_window_size=2, qk_matmul_output_mode=2)),
    "4d_causal_window_right": dict(attrs=dict(is_causal=1, left_window_size=1, right_window_size=3)),
    "4d_window_wider_than_the_keys": dict(attrs=dict(left_window_size=2**62, right_window_size=2**62)),
    "4d_window_with_past": dict(mask=(4, 18), past=12, attrs=dict(left_window_size=3, right_window_size=2,
                                                                  qk_matmul_output_mode=2)),
    "4d_gqa_causal_window_with_past": dict(shape=dict(hq=9, hkv=3), mask=(2, 1, 4, 18), bool_mask=True, past=12,
                                           attrs=dict(is_causal=1, left_window_size=5)),
    "4d_window_nonpad": dict(shape=dict(n_k=8), nonpad=[5, 8], attrs=dict(left_window_size=1, right_window_size=1,
                                                                          qk_matmul_output_mode=2)),
    "4d_causal_window_nonpad_negative_offset": dict(shape=dict(b=1, hq=2, hkv=2, n_q=4, n_k=4), nonpad=[2],
                                                    attrs=dict(is_causal=1, left_window_size=1,
                                                               qk_matmul_output_mode=3)),
    "4d_window_softcap": dict(mask=(4, 6), attrs=dict(softcap=2.0, left_window_size=0, right_window_size=2)),
    "3d_window": dict(three_d=True, shape=dict(hq=9, hkv=3), attrs=dict(left_window_size=2, right_window_size=0)),
}


def make_case(name, seed):
    c = CASES[name]
    rng = np.random.default_rng(seed)
    shape = dict(dict(b=2, hq=3, hkv=3, n_q=4, n_k=6, d=8, d_v=8), **c.get("shape", {}))
    q, k, v = qkv(rng, three_d=c.get("three_d", False), **shape)
    attrs = dict(c.get("attrs", {}))
    if c.get("three_d"):
        attrs.update(q_num_heads=shape["hq"], kv_num_heads=shape["hkv"])
    inputs = dict(Q=q, K=k, V=v)
    if "past" in c:
        inputs["past_key"] = rand(rng, shape["b"], shape["hkv"], c["past"], shape["d"])
        inputs["past_value"] = rand(rng, shape["b"], shape["hkv"], c["past"], shape["d_v"])
    if "mask" in c:
        if c.get("bool_mask"):
            mask = rng.uniform(size=c["mask"]) > 0.3
            if "masked_row" in c:
                mask[..., c["masked_row"], :] = False
        else:
            mask = rng.uniform(-2, 1, c["mask"]).astype(np.float32)
            mask[rng.uniform(size=c["mask"]) < 0.15] = -np.inf
            if c.get("neginf_columns"):
                mask[:] = 0
                mask[..., 4:] = -np.inf
        inputs["attn_mask"] = mask
    if "nonpad" in c:
        inputs["nonpad_kv_seqlen"] = np.array(c["nonpad"], np.int64)
    return inputs, attrs


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_matches_the_operator(name):
    inputs, attrs = make_case(name, seed=sorted(CASES).index(name))
    want = onnx_attention(**inputs, **attrs)
    got = attn.onnx.attention(**inputs, **attrs)
    assert [g.dtype for g in got] == [np.float32] * 4
    np.testing.assert_allclose(got[0], want[0], **F32)
    np.testing.assert_array_equal(got[1], want[1])  # the cache is copied, not computed
    np.testing.assert_array_equal(got[2], want[2])
    close(got[3], want[3])
    assert not np.isnan(got[0]).any() and not np.isnan(got[3]).any()


def test_window_is_the_specifications_picture():
    """Opset 25's own example, S = 4 queries, 6 keys, left 2, right 1, no
    cache: q0 sees k0-k1, q1 k0-k2, q2 k0-k3, q3 k1-k4."""
    rng = np.random.default_rng(11)
    Q, K, V = qkv(rng, b=1, hq=1, hkv=1, n_q=4, n_k=6)
    weights = attn.onnx.attention(Q, K, V, left_window_size=2, right_window_size=1, qk_matmul_output_mode=3)[3]
    seen = [set(np.flatnonzero(row)) for row in weights[0, 0]]
    assert seen == [{0, 1}, {0, 1, 2}, {0, 1, 2, 3}, {1, 2, 3, 4}]
    # Opsets 23 and 24 are what they were: the same call without the window.
    same = attn.onnx.attention(Q, K, V, opset=23)[0]
    np.testing.assert_array_equal(same, attn.onnx.attention(Q, K, V)[0])


def test_attention_float16_is_float32_rounded_back():
    inputs, attrs = make_case("4d_gqa_with_past_and_present", seed=3)
    half = {key: (a.astype(np.float16) if a.dtype == np.float32 else a) for key, a in inputs.items()}
    got = attn.onnx.attention(**half, **attrs)
    assert [g.dtype for g in got] == [np.float16] * 4
    wide = {key: (a.astype(np.float32) if a.dtype == np.float16 else a) for key, a in half.items()}
    for g, w in zip(got, attn.onnx.attention(**wide, **attrs)):
        np.testing.assert_array_equal(g, w.astype(np.float16))
    # and close to the definition on the float16 values (float16's half-ulp: 2^-11)
    np.testing.assert_allclose(got[0], onnx_attention(**half, **attrs)[0], rtol=1e-3, atol=1e-3)


def test_attention_float64_and_softmax_precision_double():
    inputs, attrs = make_case("4d_with_past_and_present", seed=5)
    wide = {key: (a.astype(np.float64) if a.dtype == np.float32 else a) for key, a in inputs.items()}
    want = onnx_attention(**wide, **attrs)
    got = attn.onnx.attention(**wide, **attrs)
    assert got[0].dtype == np.float64
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-14)
    # softmax_precision=11 (DOUBLE): float32 in and out, computed in float64
    y = attn.onnx.attention(**inputs, **attrs, softmax_precision=11)[0]
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, onnx_attention(**inputs, **attrs)[0].astype(np.float32))


def test_attention_torch_tensors_give_tensors():
    torch = pytest.importorskip("torch")
    inputs, attrs = make_case("4d_causal", seed=7)
    got = attn.onnx.attention(**{k: torch.from_numpy(a) for k, a in inputs.items()}, **attrs)
    assert all(isinstance(g, torch.Tensor) for g in got)
    np.testing.assert_allclose(got[0].numpy(), onnx_attention(**inputs, **attrs)[0], **F32)
    # bfloat16 in, bfloat16 out (ONNX's T for every output; it came back float32),
    # computed in float32 from the bfloat16 values
    half = {k: torch.from_numpy(a).to(torch.bfloat16) if a.dtype.kind == "f" else torch.from_numpy(a)
            for k, a in inputs.items()}
    got = attn.onnx.attention(**half, **attrs)
    assert all(g.dtype == torch.bfloat16 for g in got if g is not None)
    wide = {k: t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy() for k, t in half.items()}
    np.testing.assert_array_equal(got[0].float().numpy(),
                                  torch.from_numpy(attn.onnx.attention(**wide, **attrs)[0]).to(torch.bfloat16).float())
    x = torch.randn(1, 2, 3, 4, dtype=torch.bfloat16)
    y = attn.onnx.rotary_embedding(x, torch.ones(3, 2, dtype=torch.bfloat16), torch.zeros(3, 2, dtype=torch.bfloat16),
                                   torch.zeros(1, 3, dtype=torch.int64))
    assert y.dtype == torch.bfloat16 and torch.equal(y, x)  # cos 1, sin 0: x itself


@pytest.mark.parametrize("change, error, message", [
    (dict(Q=np.zeros((2, 3, 4))), ValueError, "must all be 4-D"),
    (dict(Q=np.zeros((2, 4, 24), np.float32), K=np.zeros((2, 6, 24), np.float32),
          V=np.zeros((2, 6, 24), np.float32)), ValueError, "q_num_heads must be a divisor > 0"),
    (dict(attn_mask=np.zeros((4, 7), np.float32)), ValueError, "more keys"),
    (dict(attn_mask=np.zeros((3, 6), np.float32)), ValueError, "attn_mask"),
    (dict(attn_mask=np.zeros((4, 6), np.int32)), TypeError, "attn_mask must be boolean"),
    (dict(past_key=np.zeros((2, 3, 2, 8), np.float32)), ValueError, "past_key and past_value go together"),
    (dict(past_key=np.zeros((2, 3, 2, 8), np.float32), past_value=np.zeros((2, 3, 3, 8), np.float32)),
     ValueError, "past_key and past_value must be"),
    (dict(nonpad_kv_seqlen=np.array([7, 1])), ValueError, "nonpad_kv_seqlen[0] = 7"),
    (dict(nonpad_kv_seqlen=np.array([1])), ValueError, "nonpad_kv_seqlen must have shape (2,)"),
    (dict(nonpad_kv_seqlen=np.array([1.0, 2.0])), TypeError, "integer array"),
    (dict(nonpad_kv_seqlen=np.array([1, 2**64 - 1], np.uint64)), ValueError,
     "nonpad_kv_seqlen must fit in int64, got 18446744073709551615"),
    (dict(is_causal=2), ValueError, "is_causal must be 0 or 1"),
    (dict(qk_matmul_output_mode=4), ValueError, "qk_matmul_output_mode"),
    (dict(softmax_precision=3), ValueError, "softmax_precision"),
    (dict(q_num_heads=5, opset=24), ValueError, "q_num_heads (5) differs"),
    (dict(q_num_heads=3), ValueError, "for 3-D inputs only from opset 25 on"),
    (dict(left_window_size=-2), ValueError, "must be -1 (open) or >= 0, got -2 and -1"),
    (dict(right_window_size=-3), ValueError, "must be -1 (open) or >= 0, got -1 and -3"),
    (dict(left_window_size=2, opset=24), ValueError, "attributes from opset 25 on, got opset 24"),
    (dict(nonpad_kv_seqlen=np.array([1, 2]), opset=23), ValueError, "an input from opset 24 on"),
    (dict(opset=26), ValueError, "opset must be 23, 24 or 25"),
    (dict(past_key=np.zeros((2, 3, 2, 8), np.float32), past_value=np.zeros((2, 3, 2, 8), np.float32),
          nonpad_kv_seqlen=np.array([1, 2])), ValueError, "cannot come with past_key"),
    (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(Q=np.zeros((2, 3, 4, 8), np.int32)), TypeError, "Q must be float16, float32 or float64"),
])
def test_attention_refuses_bad_input(change, error, message):
    expect_refused(attn.onnx.attention, make_case("4d", seed=1), change, error, message)


def test_a_short_mask_is_refused_by_attention_itself():
    q, k, v = qkv(np.random.default_rng(2))
    with pytest.raises(ValueError, match="mask"):
        attn.attention(q, k, v, np.zeros((4, 4), np.float32))


# ---------------------------------------------------------------------------
# ONNX RotaryEmbedding by its definition (float64)

def onnx_rotary_embedding(X, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0,
                          rotary_embedding_dim=0):
    x = np.asarray(X, np.float64)
    x4 = split_heads(x, num_heads) if x.ndim == 3 else x  # (B, H, S, D)
    r = rotary_embedding_dim or x4.shape[-1]
    cos, sin = (np.asarray(c, np.float64) for c in (cos_cache, sin_cache))
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]  # (B, S, r/2)
    cos, sin = cos[:, None], sin[:, None]
    rot = x4[..., :r]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else (rot[..., :r // 2], rot[..., r // 2:])
    a, b = cos * x1 - sin * x2, sin * x1 + cos * x2
    out = x4.copy()
    if interleaved:
        out[..., 0:r:2], out[..., 1:r:2] = a, b
    else:
        out[..., :r // 2], out[..., r // 2:r] = a, b
    return out.transpose(0, 2, 1, 3).reshape(x.shape) if x.ndim == 3 else out


ROPE_CASES = {  # ONNX's rotaryembedding tests, random positions in 0..49
    "4d": dict(),
    "3d_input": dict(three_d=True),
    "interleaved": dict(attrs=dict(interleaved=1)),
    "with_rotary_dim": dict(r=4, attrs=dict(rotary_embedding_dim=4)),
    "with_interleaved_rotary_dim": dict(r=4, attrs=dict(rotary_embedding_dim=4, interleaved=1)),
    "no_position_ids": dict(positions=False),
    "no_position_ids_interleaved": dict(positions=False, attrs=dict(interleaved=1)),
    "no_position_ids_rotary_dim": dict(positions=False, r=4, attrs=dict(rotary_embedding_dim=4)),
}


def rope_case(name, seed, dtype=np.float32):
    c = ROPE_CASES[name]
    rng = np.random.default_rng(seed)
    b, h, s, d = 2, 4, 3, 8
    r = c.get("r", d)
    x = rand(rng, b, h, s, d, dtype=dtype)
    attrs = dict(c.get("attrs", {}))
    if c.get("three_d"):
        x = x.transpose(0, 2, 1, 3).reshape(b, s, h * d)
        attrs["num_heads"] = h
    inputs = dict(X=x)
    if c.get("positions", True):
        angles = rng.uniform(0, 6, (50, r // 2))
        inputs["position_ids"] = rng.integers(0, 50, (b, s))
    else:
        angles = rng.uniform(0, 6, (b, s, r // 2))
    inputs["cos_cache"], inputs["sin_cache"] = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    return inputs, attrs


@pytest.mark.parametrize("name", sorted(ROPE_CASES))
def test_rotary_embedding_matches_the_operator(name):
    inputs, attrs = rope_case(name, seed=sorted(ROPE_CASES).index(name))
    got = attn.onnx.rotary_embedding(**inputs, **attrs)
    assert got.dtype == np.float32 and got.shape == inputs["X"].shape
    np.testing.assert_allclose(got, onnx_rotary_embedding(**inputs, **attrs), **F32)


def test_rotary_embedding_float16_and_float64():
    inputs, attrs = rope_case("3d_input", seed=11, dtype=np.float16)
    got = attn.onnx.rotary_embedding(**inputs, **attrs)
    assert got.dtype == np.float16
    wide = {k: (a.astype(np.float32) if a.dtype == np.float16 else a) for k, a in inputs.items()}
    np.testing.assert_array_equal(got, attn.onnx.rotary_embedding(**wide, **attrs).astype(np.float16))
    inputs, attrs = rope_case("interleaved", seed=12, dtype=np.float64)
    np.testing.assert_allclose(attn.onnx.rotary_embedding(**inputs, **attrs),
                               onnx_rotary_embedding(**inputs, **attrs), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("change, error, message", [
    (dict(X=np.zeros((2, 3), np.float32)), ValueError, "X must be 4-D"),
    (dict(X=np.zeros((2, 3, 30), np.float32)), ValueError, "num_heads must be a divisor > 0"),
    (dict(rotary_embedding_dim=3), ValueError, "rotary_embedding_dim must be even"),
    (dict(rotary_embedding_dim=4), ValueError, "cos_cache and sin_cache must be"),
    (dict(position_ids=np.zeros((2, 4), np.int64)), ValueError, "position_ids must be (batch, sequence)"),
    (dict(position_ids=np.full((2, 3), 50)), ValueError, "position"),
    (dict(interleaved=2), ValueError, "interleaved must be 0 or 1"),
    # head size 1: the default rotary_embedding_dim (0: all of it) is not to blame
    (dict(X=np.zeros((2, 4, 3, 1), np.float32)), ValueError,
     "the head size 1 (X (2, 4, 3, 1)) is odd, and rotary_embedding_dim 0 rotates all of it"),
    (dict(position_ids=np.array([[0, 1, 2**64 - 1]] * 2, np.uint64)), ValueError,
     "position_ids must fit in int64, got 18446744073709551615"),
])
def test_rotary_embedding_refuses_bad_input(change, error, message):
    expect_refused(attn.onnx.rotary_embedding, rope_case("4d", seed=1), change, error, message)


# ---------------------------------------------------------------------------
# attention's extras and causal offsets, against dense NumPy

def dense(q, k, v, allowed, bias, scale, softcap):
    logits = scale * q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)
    capped = softcap * np.tanh(logits / softcap) if softcap else logits
    masked = np.where(allowed, capped + bias, -np.inf)
    with np.errstate(divide="ignore"):
        lse = np.log(np.exp(masked).sum(axis=-1))
    weights = np.where(np.isneginf(masked), 0.0, np.exp(masked - np.where(np.isfinite(lse), lse, 0)[..., None]))
    return weights @ v.astype(np.float64), weights, dict(scaled=logits, softcapped=capped, masked=masked), lse


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("offset", [-2, 0, 3, 9])
def test_extras_and_causal_offset_match_dense(dtype, offset):
    rng = np.random.default_rng(20 + offset)
    q, k, v = rand(rng, 2, 3, 5, 8, dtype=dtype), rand(rng, 2, 3, 9, 8, dtype=dtype), rand(rng, 2, 3, 9, 4, dtype=dtype)
    mask = rng.uniform(-1, 0.5, (5, 9)).astype(dtype)
    slopes = np.array([0.5, -0.25, 1.0])
    i, j = np.arange(5)[:, None], np.arange(9)[None, :]
    allowed = (j <= i + offset) & (j >= i + offset - 3)  # causal offset with window (3, 0) around i + k
    bias = mask + (-slopes[:, None, None] * (i + offset - j))  # ALiBi measured from i + k
    want_out, want_w, want_logits, want_lse = dense(q, k, v, allowed, bias, 0.4, 2.0)
    tol = F32 if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)
    for stage in ("scaled", "softcapped", "masked"):
        out, w, logits, lse = attn.attention(q, k, v, mask, causal=("offset", offset), window=(3, 0),
                                             scale=0.4, softcap=2.0, alibi_slopes=slopes, return_weights=True,
                                             return_logits=stage, return_lse=True)
        assert out.dtype == w.dtype == logits.dtype == lse.dtype == dtype
        assert lse.shape == (2, 3, 5)
        np.testing.assert_allclose(out, want_out, **tol)
        np.testing.assert_allclose(w, want_w, **tol)
        close(logits, want_logits[stage], **tol)
        close(lse, want_lse, **tol)


def test_extras_order_and_alone():
    rng = np.random.default_rng(30)
    q, k, v = rand(rng, 2, 4, 8), rand(rng, 2, 6, 8), rand(rng, 2, 6, 8)
    out, w, lse = attn.attention(q, k, v, return_weights=True, return_lse=True)
    out2, logits = attn.attention(q, k, v, return_logits="masked")
    out3, lse3 = attn.attention(q, k, v, return_lse=True)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(lse, lse3)
    np.testing.assert_allclose(w, np.exp(logits - lse[..., None]), rtol=1e-5, atol=1e-7)
    # rank 2: lse is (n_q,); a row with no key has lse -inf and zero output
    out, lse = attn.attention(q[0], k[0], v[0], causal=("offset", -1), return_lse=True)
    assert lse.shape == (4,) and lse[0] == -np.inf and np.all(np.isfinite(lse[1:]))
    assert np.all(out[0] == 0)


def test_decode_kernel_lse():
    """Few queries against many keys take the split-KV kernel: its merged
    log-sum-exp, with a padded-cache offset."""
    rng = np.random.default_rng(31)
    q, k, v = rand(rng, 4, 2, 64), rand(rng, 4, 1500, 64), rand(rng, 4, 1500, 64)
    i, j = np.arange(2)[:, None], np.arange(1500)[None, :]
    want = dense(q, k, v, j <= i + 900, 0.0, 1 / 8, 0)
    out, lse = attn.attention(q, k, v, causal=("offset", 900), return_lse=True)
    np.testing.assert_allclose(out, want[0], **F32)
    np.testing.assert_allclose(lse, want[3], **F32)


@pytest.mark.parametrize("causal, error, message", [
    (("offset", 1.5), TypeError, "k"),
    (("offset",), TypeError, "('offset', k)"),
    (("bottom", 2), TypeError, "('offset', k)"),
    (("offset", 2 ** 62 + 1), ValueError, "within"),
])
def test_causal_offset_refuses_bad_input(causal, error, message):
    q = np.zeros((2, 4), np.float32)
    with pytest.raises(error) as e:
        attn.attention(q, q, q, causal=causal)
    assert message in str(e.value)


def test_return_logits_refuses_unknown_stage():
    q = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="'scaled', 'softcapped' or 'masked'"):
        attn.attention(q, q, q, return_logits="softmax")
    with pytest.raises(TypeError, match="return_logits"):
        attn.attention(q, q, q, return_logits=True)


def test_extras_are_not_differentiable():
    torch = pytest.importorskip("torch")
    q = torch.randn(2, 3, 4, requires_grad=True)
    out, lse = attn.attention(q, q.detach(), q.detach(), return_lse=True)
    out.sum().backward()
    assert q.grad is not None
    q.grad = None
    out, lse = attn.attention(q, q.detach(), q.detach(), return_lse=True)
    with pytest.raises(RuntimeError, match="log-sum-exp"):
        lse.sum().backward()


def test_causal_offset_backward_is_the_dense_masks():
    rng = np.random.default_rng(32)
    q, k, v, dout = rand(rng, 2, 4, 8), rand(rng, 2, 7, 8), rand(rng, 2, 7, 3), rand(rng, 2, 4, 3)
    allowed = np.arange(7)[None, :] <= np.arange(4)[:, None] + 2
    for got, want in zip(attn.attention_backward(q, k, v, dout, causal=("offset", 2)),
                         attn.attention_backward(q, k, v, dout, allowed)):
        np.testing.assert_array_equal(got, want)


def test_attention_without_qk_matmul_output():
    """A graph that does not ask for qk_matmul_output: None, and a decode
    step against a long cache (the split-KV kernel) gives the same Y."""
    rng = np.random.default_rng(33)
    Q, K, V = rand(rng, 1, 4, 1, 64), rand(rng, 1, 2, 1, 64), rand(rng, 1, 2, 1, 64)
    past_key, past_value = rand(rng, 1, 2, 1500, 64), rand(rng, 1, 2, 1500, 64)
    got = attn.onnx.attention(Q, K, V, None, past_key, past_value, is_causal=1, qk_matmul_output=False)
    assert got[3] is None
    want = onnx_attention(Q, K, V, None, past_key, past_value, is_causal=1)
    np.testing.assert_allclose(got[0], want[0], **F32)
    np.testing.assert_array_equal(got[1], want[1])
