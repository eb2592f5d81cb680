"""attn.MultiHeadLatentAttention against Hugging Face's DeepseekV3Attention
formulas (modeling_deepseek_v3.py, modeling_rope_utils.py's YaRN), written
here in float64 NumPy: nothing of attn inside the reference."""
import json
import math
import os
import pickle
import tempfile

import numpy as np
import pytest

import attn
from util import rel_err

BASE = dict(hidden_size=64, num_attention_heads=4, q_lora_rank=32, kv_lora_rank=64, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=12)
YARN = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 0.707}


def get_mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def inv_freq_and_factor(cfg):
    """Hugging Face's default and YaRN rope init functions."""
    dim, base, rs = cfg["qk_rope_head_dim"], cfg.get("rope_theta", 10000.0), cfg.get("rope_scaling")
    pos_freqs = base ** (np.arange(0, dim, 2) / dim)
    if not rs:
        return 1.0 / pos_freqs, 1.0
    factor = rs.get("factor") or cfg["max_position_embeddings"] / rs["original_max_position_embeddings"]
    mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
    att = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) if mscale and mscale_all_dim
           else get_mscale(factor))
    orig = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]

    def correction_dim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
    low = max(math.floor(correction_dim(rs.get("beta_fast") or 32)), 0)
    high = min(math.ceil(correction_dim(rs.get("beta_slow") or 1)), dim - 1)
    if low == high:
        high += 0.001
    extrapolation = 1 - np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    inv = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv, att


def reference(sd, cfg, x, positions):
    """DeepseekV3Attention's forward in float64, causal over x's n tokens
    (x (B, n, E)), RoPE at `positions`."""
    sd = {k: v.astype(np.float64) for k, v in sd.items()}
    H, r = cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, p, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    B, n, _ = x.shape

    def lin(a, name):
        return a @ sd[name + ".weight"].T + sd.get(name + ".bias", 0.0)

    def rms(a, w):
        return w * (a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6))
    q = lin(rms(lin(x, "q_a_proj"), sd["q_a_layernorm.weight"]), "q_b_proj") if cfg.get("q_lora_rank") \
        else lin(x, "q_proj")
    q = q.reshape(B, n, H, nope + p).transpose(0, 2, 1, 3)
    kv = lin(x, "kv_a_proj_with_mqa")
    c, k_rot = rms(kv[..., :r], sd["kv_a_layernorm.weight"]), kv[..., r:][:, None]
    kvb = (c @ sd["kv_b_proj.weight"].T).reshape(B, n, H, nope + dv).transpose(0, 2, 1, 3)
    k_pass, v = kvb[..., :nope], kvb[..., nope:]
    inv, att = inv_freq_and_factor(cfg)
    emb = np.concatenate([positions[:, None] * inv] * 2, axis=-1)
    cos, sin = np.cos(emb) * att, np.sin(emb) * att

    def rotate(t):
        if cfg.get("rope_interleave", True):  # apply_rotary_pos_emb_interleave's de-interleave
            t = t.reshape(*t.shape[:-1], p // 2, 2).swapaxes(-1, -2).reshape(t.shape)
        half = np.concatenate([-t[..., p // 2:], t[..., :p // 2]], axis=-1)
        return t * cos + half * sin
    query = np.concatenate([q[..., :nope], rotate(q[..., nope:])], axis=-1)
    key = np.concatenate([k_pass, np.broadcast_to(rotate(k_rot), (B, H, n, p))], axis=-1)
    scale = (nope + p) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs and rs.get("mscale_all_dim"):
        scale *= get_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2
    s = query @ key.swapaxes(-1, -2) * scale + np.triu(np.full((n, n), -np.inf), 1)
    w = np.exp(s - s.max(-1, keepdims=True))
    out = (w / w.sum(-1, keepdims=True)) @ v
    return lin(out.transpose(0, 2, 1, 3).reshape(B, n, H * dv), "o_proj")


def write(path, tensors):
    """A safetensors file (the format: an 8-byte little-endian header
    length, the JSON header, the data), float32 tensors."""
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        blob = np.ascontiguousarray(t, "<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def layer(rng, **overrides):
    cfg = {**BASE, **overrides}
    kw = {k: v for k, v in cfg.items() if k not in ("max_position_embeddings",)}
    m = attn.MultiHeadLatentAttention(**kw)
    sd = {k: (rng.standard_normal(v.shape) * (0.3 if v.ndim == 1 else 1 / math.sqrt(v.shape[-1]))
              + (1.0 if "layernorm" in k else 0.0)).astype(np.float32) for k, v in m.state_dict().items()}
    m.load_state_dict(sd)
    return m, sd, cfg


CONFIGS = {"q_lora": {}, "q_proj": dict(q_lora_rank=None), "yarn_bias": dict(rope_scaling=YARN, attention_bias=True),
           "half_split_rope": dict(rope_interleave=False, q_lora_rank=None, rope_scaling=YARN)}


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("form", ["absorbed", "expanded"])
def test_prefill_is_hugging_faces_formula(name, form):
    rng = np.random.default_rng(1)
    m, sd, cfg = layer(rng, **CONFIGS[name])
    x = rng.standard_normal((2, 11, 64))
    want = reference(sd, cfg, x, np.arange(11.0))
    got = m(x.astype(np.float32), form=form)
    assert rel_err(got, want) < 2e-6
    # positions given: another place in the sequence
    assert rel_err(m(x.astype(np.float32), positions=np.arange(50, 61), form=form),
                   reference(sd, cfg, x, np.arange(50.0, 61.0))) < 2e-6


@pytest.mark.parametrize("name", CONFIGS)
def test_decode_token_by_token_and_a_mix_over_the_cache(name):
    rng = np.random.default_rng(2)
    m, sd, cfg = layer(rng, **CONFIGS[name])
    x = rng.standard_normal((2, 12, 64))
    want = reference(sd, cfg, x, np.arange(12.0))
    cache = m.new_cache()
    steps = [m(x[:, :5].astype(np.float32), cache=cache)]                       # a prompt (expanded)
    steps += [m(x[:, t:t + 1].astype(np.float32), cache=cache) for t in range(5, 9)]  # decode (absorbed)
    steps += [m(x[:, 9:].astype(np.float32), cache=cache)]                       # a chunk after a past
    assert len(cache) == 12
    assert rel_err(np.concatenate(steps, axis=1), want) < 2e-6


# The latent rows' own rounding bounds the error: the relative error of the
# rows themselves (bf16 2^-9, f16 2^-12, q8_0 about 1/254 of a block's
# largest), carried through attention and W_UV; measured 1/3 to 1/2 of these.
@pytest.mark.parametrize("dtype,bound,per_token", [("f32", 2e-6, (64 + 8) * 4), ("bf16", 1e-2, (64 + 8) * 2),
                                                   ("f16", 1.5e-3, (64 + 8) * 2), ("q8_0", 2e-2, 2 * 34 + 8 * 2)])
@pytest.mark.parametrize("form", ["absorbed", "expanded"])
def test_every_storage_type_within_its_bound(dtype, bound, per_token, form):
    rng = np.random.default_rng(3)
    m, sd, cfg = layer(rng, rope_scaling=YARN)
    x = rng.standard_normal((2, 10, 64))
    want = reference(sd, cfg, x, np.arange(10.0))
    cache = m.new_cache(dtype)
    got = np.concatenate([m(x[:, :6].astype(np.float32), cache=cache, form=form)] +
                         [m(x[:, t:t + 1].astype(np.float32), cache=cache, form=form) for t in range(6, 10)], axis=1)
    assert rel_err(got, want) < bound
    assert cache.bytes_per_token == per_token
    assert cache.nbytes == 2 * 10 * per_token
    cache.clear()  # reused for another batch: as new
    again = m(x[1:, :6].astype(np.float32), cache=cache, form=form)
    np.testing.assert_array_equal(again, got[1:, :6])
    assert cache.nbytes == 6 * per_token


def test_deepseek_v3s_bytes_per_token():
    m = attn.MultiHeadLatentAttention(128, 2, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
                                      qk_rope_head_dim=64, v_head_dim=128)
    assert [m.new_cache(d).bytes_per_token for d in ("f32", "bf16", "f16", "q8_0")] == [2304, 1152, 1152, 672]


def test_from_config_reads_hugging_faces_names_and_rope_forms():
    base = {**BASE, "rope_theta": 5000.0, "max_position_embeddings": 2560, "rope_interleave": True,
            "attention_bias": False, "vocab_size": 129280, "model_type": "deepseek_v3", "num_key_value_heads": 4}
    yarn = {k: v for k, v in YARN.items() if k != "factor"}
    m = attn.MultiHeadLatentAttention.from_config({**base, "rope_scaling": yarn})
    assert (m.hidden_size, m.q_lora_rank, m.rope_theta) == (64, 32, 5000.0)
    # no factor: max_position_embeddings / original_max_position_embeddings = 40
    assert m.softmax_scale == pytest.approx(24 ** -0.5 * get_mscale(40, 0.707) ** 2, rel=1e-15)
    v5 = attn.MultiHeadLatentAttention.from_config(
        {**base, "rope_parameters": {"rope_type": "yarn", "rope_theta": 5000.0, **yarn, "factor": 10.0}})
    assert v5.softmax_scale == pytest.approx(24 ** -0.5 * get_mscale(10, 0.707) ** 2, rel=1e-15)
    assert v5.rope_scaling["factor"] == 10.0
    plain = attn.MultiHeadLatentAttention.from_config({**base, "rope_scaling": None, "q_lora_rank": None})
    assert plain.rope_scaling is None and plain.q_lora_rank is None and "q_proj.weight" in plain.state_dict()
    # the layer computes the config's formula (the ratio as YaRN's factor)
    rng = np.random.default_rng(4)
    sd = {k: rng.standard_normal(v.shape).astype(np.float32) / 4 + ("layernorm" in k)
          for k, v in m.state_dict().items()}
    m.load_state_dict(sd)
    x = rng.standard_normal((1, 7, 64))
    cfg = {**base, "rope_scaling": {**yarn, "factor": 40.0}}
    assert rel_err(m(x.astype(np.float32)), reference(sd, cfg, x, np.arange(7.0))) < 2e-6
    with pytest.raises(ValueError, match="has no 'kv_lora_rank'"):
        attn.MultiHeadLatentAttention.from_config({k: v for k, v in base.items() if k != "kv_lora_rank"})


def test_state_dict_keys_safetensors_and_bad_input():
    m = attn.MultiHeadLatentAttention(64, 4, q_lora_rank=32, kv_lora_rank=64, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                      v_head_dim=12, attention_bias=True)
    assert sorted(m.state_dict()) == sorted(
        ["q_a_proj.weight", "q_a_proj.bias", "q_a_layernorm.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight",
         "kv_a_proj_with_mqa.bias", "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight", "o_proj.bias"])
    shapes = {k: v.shape for k, v in m.state_dict().items()}
    assert shapes["q_b_proj.weight"] == (4 * 24, 32) and shapes["kv_b_proj.weight"] == (4 * 28, 64)
    assert shapes["kv_a_proj_with_mqa.weight"] == (72, 64) and shapes["o_proj.weight"] == (64, 48)
    rng = np.random.default_rng(5)
    sd = {"model.layers.3.self_attn." + k: rng.standard_normal(v.shape).astype(np.float32)
          for k, v in m.state_dict().items()}
    sd["model.layers.3.mlp.gate_proj.weight"] = np.zeros((2, 2), np.float32)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "layer.safetensors")
        write(path, sd)
        m.load_safetensors(path, prefix="model.layers.3.self_attn.")
        for k, v in m.state_dict().items():
            np.testing.assert_array_equal(v, sd["model.layers.3.self_attn." + k])
        with pytest.raises(ValueError, match="unexpected key 'model.layers.3.mlp.gate_proj.weight'"):
            m.load_safetensors(path)
    with pytest.raises(ValueError, match="missing key 'o_proj.bias'"):
        m.load_state_dict({k: v for k, v in m.state_dict().items() if k != "o_proj.bias"})
    with pytest.raises(ValueError, match=r"x's last axis must be hidden_size=64, got \(2, 3, 65\)"):
        m(np.zeros((2, 3, 65), np.float32))
    with pytest.raises(ValueError, match="LatentCache: q8_0 stores blocks of 32 values, so kv_lora_rank must be a multiple of 32, got 48"):
        attn.MultiHeadLatentAttention(64, 4, q_lora_rank=None, kv_lora_rank=48, qk_nope_head_dim=16,
                                      qk_rope_head_dim=8, v_head_dim=12).new_cache("q8_0")
    for make in (lambda: m.new_cache("q4_0"), lambda: m.new_paged_cache(4, 16, "q4_0")):
        with pytest.raises(ValueError, match="a latent cache stores f32, bf16, f16 or q8_0, not q4_0"):
            make()
    cache = m.new_cache()
    m(np.zeros((2, 3, 64), np.float32), cache=cache)
    with pytest.raises(ValueError, match="the cache holds batch 2, x has 1"):
        m(np.zeros((1, 1, 64), np.float32), cache=cache)
    assert len(cache) == 3
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even"):
        attn.MultiHeadLatentAttention(64, 4, q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=16,
                                      qk_rope_head_dim=7, v_head_dim=12)
    json.dumps(m.rope_scaling)


# ---------------------------------------------------------------------------
# Serving over a paged latent cache: many sequences' tokens in one call per
# step, each sequence against the formula over its own tokens.

def serve(m, cache, steps, xs):
    """Runs the steps (each {sequence: its new token count}) as packed calls;
    each sequence's outputs concatenated."""
    outs, done = {s: [] for s in xs}, {s: 0 for s in xs}
    for step in steps:
        ids = list(step)
        x = np.concatenate([xs[s][done[s]:done[s] + step[s]] for s in ids]).astype(np.float32)
        cu = np.concatenate([[0], np.cumsum([step[s] for s in ids])])
        y = m(x, cache=cache, seq_ids=ids, cu_seqlens=cu)
        for i, s in enumerate(ids):
            outs[s].append(y[cu[i]:cu[i + 1]])
            done[s] += step[s]
    return {s: np.concatenate(o) for s, o in outs.items()}


@pytest.mark.parametrize("dtype,bound", [("f32", 2e-6), ("bf16", 1e-2), ("f16", 1.5e-3), ("q8_0", 2e-2)])
@pytest.mark.parametrize("name", ["q_lora", "yarn_bias"])
def test_serving_over_a_paged_latent_cache_is_each_sequence_alone(name, dtype, bound):
    rng = np.random.default_rng(5)
    m, sd, cfg = layer(rng, **CONFIGS[name])
    cache = m.new_paged_cache(64, 4, dtype)
    assert (cache.latent_rank, cache.head_dim, cache.value_head_dim, cache.kv_heads) == (64, 72, 64, 1)
    a, b, c = (cache.add_sequence() for _ in range(3))
    xs = {a: rng.standard_normal((9, 64)), b: rng.standard_normal((7, 64)), c: rng.standard_normal((5, 64))}
    # Prompts, then decodes mixed with a later prompt and a chunk: one call per step.
    steps = [{a: 5, b: 3}, {a: 1, c: 4, b: 1}, {b: 3, a: 1}, {a: 1, c: 1}, {a: 1}]
    got = serve(m, cache, steps, xs)
    for s, x in xs.items():
        assert cache.length(s) == len(x)
        assert rel_err(got[s], reference(sd, cfg, x[None], np.arange(float(len(x))))[0]) < bound, s
    # A fork shares the prefix's pages and goes its own way.
    d = cache.fork(a)
    more = {a: rng.standard_normal((2, 64)), d: rng.standard_normal((2, 64))}
    later = serve(m, cache, [{a: 1, d: 1}, {d: 1, a: 1}], more)
    for s in (a, d):
        whole = np.concatenate([xs[a], more[s]])
        want = reference(sd, cfg, whole[None], np.arange(float(len(whole))))[0]
        assert rel_err(later[s], want[len(xs[a]):]) < bound, s
    # The rows as stored, read back, are the model's normalised, rotated latents.
    rows = cache.latent_rows(c)
    assert rows.shape == (5, 72) and rows.dtype == np.float32


def test_a_paged_latent_cache_reads_values_in_place_and_counts_its_bytes():
    m = attn.MultiHeadLatentAttention(128, 2, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
                                      qk_rope_head_dim=64, v_head_dim=128)
    for dtype, per_token in (("f32", 2304), ("bf16", 1152), ("f16", 1152), ("q8_0", 672)):
        cache = m.new_paged_cache(8, 16, dtype)
        s = cache.add_sequence()
        m(np.zeros((20, 128), np.float32), cache=cache, seq_ids=[s], cu_seqlens=[0, 20])
        assert cache.pages_in_use() == 2 and cache.nbytes == 2 * 16 * per_token, dtype
        restored = pickle.loads(pickle.dumps(cache))
        assert restored.latent_rank == 512 and restored.dtype == dtype
        np.testing.assert_array_equal(restored.latent_rows(s), cache.latent_rows(s))
    k, v = m.new_paged_cache(4, 2).pages()
    assert v.shape == (4, 2, 1, 512) and k.shape == (4, 2, 1, 576) and np.shares_memory(k, v)
    q8 = m.new_paged_cache(4, 2, "q8_0")
    with pytest.raises(TypeError, match="two types"):
        attn.batch_attention(np.zeros((1, 2, 576), np.float32), [0, 1], q8, [q8.add_sequence()])


def test_serving_refuses_a_cache_of_other_rows_and_unknown_ids():
    rng = np.random.default_rng(6)
    m, sd, cfg = layer(rng)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    plain = attn.PagedKVCache(8, 4, 1, 72)
    with pytest.raises(ValueError, match="needs a PagedKVCache.latent of this layer's rows, 64 \\+ 8, got a cache of"):
        m(x, cache=plain, seq_ids=[plain.add_sequence()], cu_seqlens=[0, 3])
    cache = m.new_paged_cache(8, 4)
    s = cache.add_sequence()
    with pytest.raises(KeyError):
        m(x, cache=cache, seq_ids=[s, s + 7], cu_seqlens=[0, 1, 3])
    with pytest.raises(ValueError, match="cu_seqlens must end at x's length 3, got 2"):
        m(x, cache=cache, seq_ids=[s], cu_seqlens=[0, 2])
    assert cache.length(s) == 0 and cache.pages_in_use() == 0  # nothing appended
    with pytest.raises(TypeError, match="needs seq_ids and cu_seqlens"):
        m(x, cache=cache)
    with pytest.raises(ValueError, match="takes rows k \\(nnz, 1, kv_lora_rank \\+ rope_dim\\)"):
        cache.append([s], np.zeros((1, 1, 72)), np.zeros((1, 1, 64)), [0, 1])
