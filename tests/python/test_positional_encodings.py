"""Issue 19's encodings against references written here: Hugging Face's RoPE
scalings (modeling_rope_utils.py's formulas, in NumPy float64) at the
configurations of real model cards, explicit cos/sin tables, Qwen2-VL's
M-RoPE (apply_multimodal_rotary_pos_emb), and ALiBi against BLOOM's slopes
and a dense bias built in NumPy (PyTorch autograd for its gradients)."""
import math

import numpy as np
import pytest

import attn
from util import rel_err

# ---------------------------------------------------------------------------
# Hugging Face's RoPE init functions, one by one, in float64.


def hf_default(dim, base):
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def hf_inv_freq(dim, base, scaling, seq_len=None):
    """(inv_freq, attention_factor) as ROPE_INIT_FUNCTIONS[rope_type] gives
    them; config values (max_position_embeddings) are keys of `scaling`."""
    kind = scaling.get("rope_type", scaling.get("type"))
    orig = scaling.get("original_max_position_embeddings", scaling.get("max_position_embeddings"))
    if kind in ("default", "mrope"):
        return hf_default(dim, base), 1.0
    if kind == "linear":
        return hf_default(dim, base) / scaling["factor"], 1.0
    if kind == "dynamic":
        factor = scaling["factor"]
        seq = orig if seq_len is None else max(seq_len, orig)
        grown = base * ((factor * seq / orig) - (factor - 1)) ** (dim / (dim - 2))
        return hf_default(dim, grown), 1.0
    if kind == "yarn":
        factor = scaling.get("factor") or scaling["max_position_embeddings"] / orig

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        af = scaling.get("attention_factor")
        if af is None:
            m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
            af = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
        beta_fast = scaling.get("beta_fast") or 32
        beta_slow = scaling.get("beta_slow") or 1

        def correction_dim(rotations):
            return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolation_factor = 1 - ramp
        pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        interpolation, extrapolation = 1.0 / (factor * pos_freqs), 1.0 / pos_freqs
        inv = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
        return inv, af
    if kind == "longrope":
        factor = scaling.get("factor") or scaling["max_position_embeddings"] / orig
        af = scaling.get("attention_factor")
        if af is None:
            af = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = np.array(scaling["long_factor"] if seq_len and seq_len > orig else scaling["short_factor"])
        return 1.0 / (ext * base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)), af
    if kind == "llama3":
        inv = hf_default(dim, base)
        factor, low_ff, high_ff = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        low_wavelen, high_wavelen = orig / low_ff, orig / high_ff
        wavelen = 2 * math.pi / inv
        llama = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (orig / wavelen - low_ff) / (high_ff - low_ff)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, llama), 1.0
    raise AssertionError(kind)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def hf_rope(x, positions, inv_freq, af, interleaved=False):
    """Hugging Face's apply_rotary_pos_emb (x * cos + rotate_half(x) * sin,
    cos and sin times the attention factor) on the first 2 * len(inv_freq)
    features; interleaved pairs (2k, 2k + 1) as GPT-J rotates them."""
    r = 2 * len(inv_freq)
    freqs = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq
    rot, rest = x[..., :r], x[..., r:]
    if interleaved:
        c, s = np.cos(freqs) * af, np.sin(freqs) * af
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = np.empty_like(rot)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, b * c + a * s
    else:
        emb = np.concatenate([freqs, freqs], axis=-1)
        out = rot * (np.cos(emb) * af) + rotate_half(rot) * (np.sin(emb) * af)
    return np.concatenate([out, rest], axis=-1)


# Model cards' rope settings: (head dim or rotary dim, rope_theta, rope_scaling).
LLAMA_3_1_8B = (128, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
QWEN2_5_YARN = (128, 1000000.0, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
DEEPSEEK_V2_LITE = (64, 10000.0, {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                  "mscale": 0.707, "mscale_all_dim": 0.707,
                                  "original_max_position_embeddings": 4096})
GPT_OSS = (64, 150000.0, {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                          "original_max_position_embeddings": 4096, "truncate": False})
# Phi-3-mini-128k-instruct as first released (type "su", renamed "longrope"):
# head dim 96, 48 factors each; its config's max and original lengths.
PHI3_LONG = [1.0299999713897705, 1.0499999523162842, 1.0499999523162842, 1.0799999237060547,
             1.2299998998641968, 1.2299998998641968, 1.2999999523162842, 1.4499999284744263,
             1.5999999046325684, 1.6499998569488525, 1.8999998569488525, 2.859999895095825,
             3.68999981880188, 5.419999599456787, 5.489999771118164, 5.489999771118164,
             9.09000015258789, 11.579999923706055, 15.65999984741211, 15.769999504089355,
             15.789999961853027, 18.360000610351562, 21.989999771118164, 23.079999923706055,
             30.009998321533203, 32.35000228881836, 32.590003967285156, 35.56000518798828,
             39.95000457763672, 53.840003967285156, 56.20000457763672, 57.95000457763672,
             59.29000473022461, 59.77000427246094, 59.920005798339844, 61.190006256103516,
             61.96000671386719, 62.50000762939453, 63.3700065612793, 63.48000717163086,
             63.48000717163086, 63.66000747680664, 63.850006103515625, 64.08000946044922,
             64.760009765625, 64.80001068115234, 64.81001281738281, 64.81001281738281]
PHI3_SHORT = [1.05, 1.05, 1.05, 1.1, 1.1, 1.1, 1.2500000000000002, 1.2500000000000002,
              1.4000000000000004, 1.4500000000000004, 1.5500000000000005, 1.8500000000000008,
              1.9000000000000008] + [2.000000000000001] * 19 + [
              2.1000000000000005, 2.1000000000000005, 2.2, 2.3499999999999996, 2.3499999999999996,
              2.3499999999999996, 2.3499999999999996, 2.3999999999999995, 2.3999999999999995,
              2.6499999999999986, 2.6999999999999984, 2.8999999999999977, 2.9499999999999975,
              3.049999999999997, 3.049999999999997, 3.049999999999997]
PHI3_MINI_128K = (96, 10000.0, {"type": "longrope", "long_factor": PHI3_LONG, "short_factor": PHI3_SHORT,
                                "original_max_position_embeddings": 4096, "max_position_embeddings": 131072})
GEMMA3_LINEAR = (256, 1000000.0, {"rope_type": "linear", "factor": 8.0})
DYNAMIC = (64, 10000.0, {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 2048})
CARDS = {"llama3.1-8b": LLAMA_3_1_8B, "qwen2.5-yarn": QWEN2_5_YARN, "deepseek-v2-lite": DEEPSEEK_V2_LITE,
         "gpt-oss": GPT_OSS, "phi3-mini-128k": PHI3_MINI_128K, "gemma3-linear": GEMMA3_LINEAR,
         "dynamic": DYNAMIC, "default": (128, 10000.0, {"rope_type": "default"})}

# Positions up to 10^6, on both sides of the cards' original contexts.
POSITIONS = np.array([0, 1, 2, 100, 2047, 4095, 4096, 8191, 8192, 32767, 32768, 65536, 131071,
                      500000, 999999, 1000000])


def relative(a, b):
    return np.max(np.abs(np.asarray(a) - b) / np.abs(b))


@pytest.mark.parametrize("card", sorted(CARDS))
@pytest.mark.parametrize("seq_len", [None, 1000, 5000, 200000])
def test_frequencies_match_hugging_face(card, seq_len):
    dim, base, scaling = CARDS[card]
    inv, af = attn.rope_frequencies(dim, base=base, scaling=scaling, seq_len=seq_len)
    want, want_af = hf_inv_freq(dim, base, scaling, seq_len)
    assert inv.dtype == np.float64 and inv.shape == (dim // 2,)
    assert relative(inv, want) < 1e-14
    assert af == pytest.approx(want_af, rel=1e-15)


def test_the_cards_scalings_do_what_their_papers_say():
    plain = hf_default(128, 500000.0)
    inv, _ = attn.rope_frequencies(128, base=500000.0, scaling=LLAMA_3_1_8B[2])
    wavelen = 2 * np.pi / plain
    assert np.allclose(inv[wavelen < 8192 / 4], plain[wavelen < 8192 / 4], rtol=1e-15)  # high: kept
    assert np.allclose(inv[wavelen > 8192], plain[wavelen > 8192] / 8, rtol=1e-15)  # low: / factor
    _, af = attn.rope_frequencies(128, base=1e6, scaling=QWEN2_5_YARN[2])
    assert af == pytest.approx(0.1 * math.log(4) + 1)
    _, af = attn.rope_frequencies(96, scaling=PHI3_MINI_128K[2])
    assert af == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    short, _ = attn.rope_frequencies(96, scaling=PHI3_MINI_128K[2], seq_len=4096)
    long, _ = attn.rope_frequencies(96, scaling=PHI3_MINI_128K[2], seq_len=4097)
    assert np.allclose(short * np.array(PHI3_SHORT), hf_default(96, 10000.0), rtol=1e-15)
    assert np.allclose(long * np.array(PHI3_LONG), hf_default(96, 10000.0), rtol=1e-15)
    # dynamic: the original frequencies up to the original context, then a larger base
    at, _ = attn.rope_frequencies(64, scaling=DYNAMIC[2], seq_len=2048)
    beyond, _ = attn.rope_frequencies(64, scaling=DYNAMIC[2], seq_len=4096)
    assert np.allclose(at, hf_default(64, 10000.0), rtol=1e-15) and np.all(beyond[1:] < at[1:])


@pytest.mark.parametrize("card", sorted(CARDS))
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_with_scaling_matches_hugging_face(card, interleaved):
    dim, base, scaling = CARDS[card]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, len(POSITIONS), dim))
    got = attn.rope(x, positions=POSITIONS, base=base, scaling=scaling, interleaved=interleaved)
    # rope's sequence length is the largest position + 1, as Hugging Face's dynamic update
    inv, af = hf_inv_freq(dim, base, scaling, seq_len=int(POSITIONS.max()) + 1)
    want = hf_rope(x, POSITIONS, inv, af, interleaved)
    # angles of up to 10^6 radians: an ulp of inv_freq moves them by ~1e-10
    assert np.max(np.abs(got - want)) < 1e-9
    got32 = attn.rope(x.astype(np.float32), positions=POSITIONS, base=base, scaling=scaling,
                      interleaved=interleaved)
    assert got32.dtype == np.float32 and rel_err(got32, want) < 1e-6


def test_length_dependent_types_use_the_largest_position():
    dim, base, scaling = PHI3_MINI_128K
    x = np.random.default_rng(2).standard_normal((3, dim))
    for positions in ([0, 1, 4095], [0, 1, 4096]):  # short factors, then long ones
        inv, af = hf_inv_freq(dim, base, scaling, seq_len=max(positions) + 1)
        got = attn.rope(x, positions=np.array(positions), base=base, scaling=scaling)
        assert np.max(np.abs(got - hf_rope(x, positions, inv, af))) < 1e-12
    # default positions 0..n-1 give n
    x = np.random.default_rng(3).standard_normal((3000, 64))
    inv, _ = hf_inv_freq(64, 10000.0, DYNAMIC[2], seq_len=3000)
    assert np.max(np.abs(attn.rope(x, scaling=DYNAMIC[2]) - hf_rope(x, np.arange(3000), inv, 1.0))) < 1e-10


def test_partial_rotary_factor_rotates_its_share():
    # Phi-2: head dim 80, partial_rotary_factor 0.4 -> 32 features rotated
    x = np.random.default_rng(4).standard_normal((2, 7, 80))
    scaling = {"rope_type": "default", "partial_rotary_factor": 0.4}
    got = attn.rope(x, positions=np.arange(7) * 1000, scaling=scaling)
    want = hf_rope(x, np.arange(7) * 1000, hf_default(32, 10000.0), 1.0)
    assert np.max(np.abs(got - want)) < 1e-12
    assert np.array_equal(got[..., 32:], x[..., 32:])
    with pytest.raises(ValueError, match="rotary_dim 16 contradicts partial_rotary_factor"):
        attn.rope(x, scaling=scaling, rotary_dim=16)


def test_rope_backward_is_the_adjoint_with_scaling():
    # <rope(x), y> == <x, rope_backward(y)>: the backward is the transpose, attention factor included
    dim, base, scaling = QWEN2_5_YARN
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((2, 2, 9, dim))
    positions = np.array([0, 5, 40000, 70000, 1, 2, 3, 999999, 12])
    options = dict(positions=positions, base=base, scaling=scaling)
    lhs = np.sum(attn.rope(x, **options) * y)
    rhs = np.sum(x * attn.rope_backward(y, **options))
    assert lhs == pytest.approx(rhs, rel=1e-12)


# ---------------------------------------------------------------------------
# Explicit tables (ONNX RotaryEmbedding's cos_cache / sin_cache).


def tables(inv, af, rows):
    angles = np.arange(rows, dtype=np.float64)[:, None] * inv
    return np.cos(angles) * af, np.sin(angles) * af


@pytest.mark.parametrize("interleaved", [False, True])
def test_tables_indexed_by_positions_equal_computed_angles(interleaved):
    dim, base, scaling = LLAMA_3_1_8B
    inv, af = attn.rope_frequencies(dim, base=base, scaling=scaling)
    cos, sin = tables(inv, af, 20000)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 6, dim))
    positions = rng.integers(0, 20000, size=(2, 1, 6))
    got = attn.rope(x, positions=positions, cos=cos, sin=sin, interleaved=interleaved)
    want = attn.rope(x, positions=positions, base=base, scaling=scaling, interleaved=interleaved)
    assert np.max(np.abs(got - want)) < 1e-12
    assert np.max(np.abs(got - hf_rope(x, positions, inv, af, interleaved))) < 1e-12


def test_tables_used_as_given_and_broadcast_without_positions():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 5, 8))
    cos, sin = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 4))  # not a rotation at all
    got = attn.rope(x, cos=cos[:, None], sin=sin[:, None])  # (2, 1, 5, 4) against (2, 3, 5)
    c, s = np.concatenate([cos, cos], -1)[:, None], np.concatenate([sin, sin], -1)[:, None]
    assert np.max(np.abs(got - (x * c + rotate_half(x) * s))) < 1e-14
    # a narrower table rotates twice its width, asked for; the rest passes through
    part = attn.rope(x, cos=cos[:, None, :, :2], sin=sin[:, None, :, :2], rotary_dim=4)
    assert np.array_equal(part[..., 4:], x[..., 4:])
    # Not asked for, it is refused naming both widths, as ONNX's reference
    # refuses it (it rotated silently).
    with pytest.raises(ValueError, match=r"the cos/sin tables are 2 wide, but rotary_dim / 2 is 4 \(rotary_dim 8 "
                                         r"\(the default, all of d\)\): they must match; pass tables of width 4, "
                                         r"or rotary_dim=4 to rotate the first 4 features only"):
        attn.rope(x, cos=cos[:, None, :, :2], sin=sin[:, None, :, :2])
    assert attn.rope(x.astype(np.float32), cos=cos[:, None], sin=sin[:, None]).dtype == np.float32


def test_table_errors_name_the_problem():
    x = np.zeros((4, 8))
    cos = sin = np.ones((10, 4))
    with pytest.raises(ValueError, match="position 10 is outside the cos/sin tables, which hold positions 0..9"):
        attn.rope(x, positions=np.array([0, 3, 10, 2]), cos=cos, sin=sin)
    with pytest.raises(ValueError, match="position -1 is outside"):
        attn.rope(x, positions=np.array([0, -1, 1, 2]), cos=cos, sin=sin)
    with pytest.raises(ValueError, match="cos and sin tables go together"):
        attn.rope(x, cos=cos)
    with pytest.raises(ValueError, match="one shape"):
        attn.rope(x, positions=np.arange(4), cos=cos, sin=np.ones((10, 3)))
    with pytest.raises(ValueError, match="bake the scaling"):
        attn.rope(x, positions=np.arange(4), cos=cos, sin=sin, scaling=GEMMA3_LINEAR[2])
    with pytest.raises(ValueError, match="the cos/sin tables are 4 wide, but rotary_dim / 2 is 2"):
        attn.rope(x, positions=np.arange(4), cos=cos, sin=sin, rotary_dim=4)
    # x is left as it was: a table error comes before anything is written
    x = np.arange(32.0).reshape(4, 8)
    with pytest.raises(ValueError):
        attn.rope(x, positions=np.array([0, 1, 2, 99]), cos=cos, sin=sin)
    assert np.array_equal(x, np.arange(32.0).reshape(4, 8))


# ---------------------------------------------------------------------------
# M-RoPE (Qwen2-VL: head dim 128, rope_theta 1e6, sections [16, 24, 24]).


def qwen2_vl_mrope(x, positions, section, base):
    """apply_multimodal_rotary_pos_emb: cos/sin per position row (3, n, dim),
    split along the features in section * 2 chunks, chunk i from row i % 3."""
    dim = x.shape[-1]
    freqs = positions[..., None].astype(np.float64) * hf_default(dim, base)  # (3, n, dim/2)
    emb = np.concatenate([freqs, freqs], -1)
    pick = np.cumsum(section * 2)[:-1]
    cos = np.concatenate([c[i % 3] for i, c in enumerate(np.split(np.cos(emb), pick, -1))], -1)
    sin = np.concatenate([s[i % 3] for i, s in enumerate(np.split(np.sin(emb), pick, -1))], -1)
    return x * cos + rotate_half(x) * sin


def vision_positions():
    """A text token, a 2 x 3 image grid (time 1, rows 1-2, columns 1-3), text again."""
    t = [0, 1, 1, 1, 1, 1, 1, 4, 5]
    h = [0, 1, 1, 1, 2, 2, 2, 4, 5]
    w = [0, 1, 2, 3, 1, 2, 3, 4, 5]
    return np.array([t, h, w])


def test_mrope_matches_qwen2_vl():
    section = [16, 24, 24]
    positions = vision_positions()
    x = np.random.default_rng(8).standard_normal((2, 9, 128))
    got = attn.rope(x, positions=positions, base=1e6, mrope_section=section)
    want = qwen2_vl_mrope(x, positions, section, 1e6)
    assert np.max(np.abs(got - want)) < 1e-12
    # Qwen2-VL's own rope_scaling dict says the same
    config = attn.rope(x, positions=positions, base=1e6,
                       scaling={"type": "mrope", "mrope_section": section})
    assert np.array_equal(config, got)
    # text tokens have t = h = w: plain RoPE
    text = np.tile(np.arange(9), (3, 1))
    assert np.max(np.abs(attn.rope(x, positions=text, base=1e6, mrope_section=section) -
                         attn.rope(x, positions=np.arange(9), base=1e6))) < 1e-15


def test_mrope_interleaved_pairs_take_their_sections_row():
    section = [16, 24, 24]
    positions = vision_positions()
    x = np.random.default_rng(9).standard_normal((9, 128))
    got = attn.rope(x, positions=positions, base=1e6, mrope_section=section, interleaved=True)
    inv = hf_default(128, 1e6)
    row = np.repeat([0, 1, 2], section)  # pair k's position row
    angles = positions[row].T * inv  # (n, 64)
    a, b = x[:, 0::2], x[:, 1::2]
    want = np.empty_like(x)
    want[:, 0::2] = a * np.cos(angles) - b * np.sin(angles)
    want[:, 1::2] = b * np.cos(angles) + a * np.sin(angles)
    assert np.max(np.abs(got - want)) < 1e-12


def test_mrope_errors():
    x = np.zeros((9, 128))
    with pytest.raises(ValueError, match="must add up to rotary_dim / 2 = 64"):
        attn.rope(x, positions=vision_positions(), mrope_section=[16, 24, 23])
    with pytest.raises(ValueError, match=r"positions must be \(3, ..., n\)"):
        attn.rope(x, positions=np.arange(9), mrope_section=[16, 24, 24])
    with pytest.raises(ValueError, match="given twice"):
        attn.rope(x, positions=vision_positions(), mrope_section=[16, 24, 24],
                  scaling={"type": "mrope", "mrope_section": [32, 16, 16]})


# ---------------------------------------------------------------------------
# rope_scaling dicts: errors name the key.


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "ntk"}, "unknown rope_type 'ntk'"),
    ({"factor": 2.0}, "no 'rope_type'"),
    ({"rope_type": "linear"}, "rope_type 'linear' needs 'factor'"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
     "needs 'original_max_position_embeddings'"),
    ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, "needs 'low_freq_factor'"),
    ({"rope_type": "longrope", "long_factor": [1.0] * 4, "original_max_position_embeddings": 4096},
     "needs 'short_factor'"),
    ({"rope_type": "longrope", "long_factor": [1.0] * 4, "short_factor": [1.0] * 4,
      "original_max_position_embeddings": 4096}, "needs 'factor'"),
    ({"rope_type": "yarn", "original_max_position_embeddings": 4096}, "needs 'factor'"),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 32}, "'beta_fast' is not a key of rope_type 'linear'"),
    ({"rope_type": "linear", "factr": 2.0}, "'factr' is not a key of rope_type 'linear'"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}, "pass the base"),
    ({"rope_type": "linear", "factor": -1.0}, "'factor' must be a finite number > 0"),
    ({"rope_type": "linear", "factor": float("nan")}, "'factor' must be finite"),
    ({"rope_type": "linear", "factor": "2"}, "'factor' must be a number"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096.5},
     "'original_max_position_embeddings' must be an integer"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096, "truncate": 1},
     "'truncate' must be true or false"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 8192}, "must be greater than 'low_freq_factor'"),
    ({"rope_type": "linear", "type": "yarn", "factor": 2.0}, "'rope_type' is 'linear' but 'type' is 'yarn'"),
])
def test_bad_scaling_is_a_value_error_naming_the_key(scaling, message):
    with pytest.raises(ValueError, match=message):
        attn.rope_frequencies(64, scaling=scaling)


def test_scaling_checks_that_need_the_rotary_dim():
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 4,
                "original_max_position_embeddings": 4096, "factor": 2.0}
    with pytest.raises(ValueError, match="'short_factor' has 3 values, expected one per pair: rotary_dim / 2 = 4"):
        attn.rope_frequencies(8, scaling=longrope)
    with pytest.raises(ValueError, match="needs rotary_dim > 2"):
        attn.rope_frequencies(2, scaling=DYNAMIC[2])
    with pytest.raises(TypeError, match="rope_scaling dict"):
        attn.rope(np.zeros((2, 4)), scaling="linear")
    # NumPy and torch scalars are numbers
    torch = pytest.importorskip("torch")
    for factor in (np.float32(2.0), np.int64(2), torch.tensor(2.0)):
        inv, _ = attn.rope_frequencies(8, scaling={"rope_type": "linear", "factor": factor})
        assert np.allclose(inv, hf_default(8, 10000.0) / 2, rtol=1e-15)


# ---------------------------------------------------------------------------
# ALiBi.


def bloom_slopes(num_heads):
    """BLOOM's build_alibi_tensor's slopes."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = [base ** p for p in range(1, 1 + closest)]
    if closest != num_heads:
        extra_base = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        remaining = min(closest, num_heads - closest)
        slopes += [extra_base ** p for p in range(1, 1 + 2 * remaining, 2)]
    return np.array(slopes)


def ggml_slopes(num_heads, max_bias):
    """ggml's soft_max with max_bias: m0^(h+1) below n_head_log2, m1^(2(h-n)+1) above."""
    n = 2 ** math.floor(math.log2(num_heads))
    m0, m1 = 2 ** (-max_bias / n), 2 ** (-max_bias / 2 / n)
    return np.array([m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1) for h in range(num_heads)])


def test_alibi_slopes_are_bloom_and_ggml():
    for heads in range(1, 41):  # (BLOOM's and ggml's repeated powers round a few times)
        assert relative(attn.alibi_slopes(heads), bloom_slopes(heads)) < 1e-14
        assert relative(attn.alibi_slopes(heads, max_bias=5.0), ggml_slopes(heads, 5.0)) < 1e-14
    assert np.array_equal(attn.alibi_slopes(8), 2.0 ** -np.arange(1, 9))  # the paper's 2^(-8h/H)
    with pytest.raises(ValueError, match="num_heads must be in \\[1, 16777216\\], got 0"):
        attn.alibi_slopes(0)


def dense_attention(q, k, v, slopes, causal=False, window=None, mask=None, softcap=None):
    """Attention with ALiBi as a dense (Hq, n_q, n_k) bias, in float64, GQA by
    repeating k and v; returns (out, weights)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    n_q, n_k = q.shape[-2], k.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if softcap:
        s = softcap * np.tanh(s / softcap)
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    p = i + (n_k - n_q)
    s = s + (-np.asarray(slopes)[:, None, None] * (p - j))
    allowed = np.ones((n_q, n_k), bool)
    if causal == "top_left":
        allowed &= j <= i
    elif causal:
        allowed &= j <= p
    if window is not None:
        left, right = window
        if left is not None:
            allowed &= p - j <= left
        if right is not None:
            allowed &= j - p <= right
    if mask is not None:
        if mask.dtype == bool:
            allowed = allowed & mask
        else:
            s = s + mask
    s = np.where(allowed, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    w = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = w.sum(-1, keepdims=True)
    w = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    return w @ v, w


CAUSALS = [False, True, "top_left"]
WINDOWS = [None, (3, 2), (0, None), (None, 1)]
MASKS = [None, "bool", "float"]


@pytest.mark.parametrize("causal", CAUSALS)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("n_q, n_k", [(7, 7), (5, 11), (9, 4)])
def test_alibi_matches_a_dense_bias(causal, window, mask_kind, n_q, n_k):
    rng = np.random.default_rng(10)
    q = rng.standard_normal((2, 6, n_q, 8))  # Hq 6 (not a power of 2), Hkv 3: GQA
    k = rng.standard_normal((2, 3, n_k, 8))
    v = rng.standard_normal((2, 3, n_k, 5))
    slopes = attn.alibi_slopes(6)
    mask = None
    if mask_kind == "bool":
        mask = rng.random((n_q, n_k)) < 0.8
    elif mask_kind == "float":
        mask = rng.standard_normal((6, 1, n_k))
    want_out, want_w = dense_attention(q, k, v, slopes, causal, window, mask)
    out, w = attn.attention(q, k, v, mask, causal=causal, window=window, alibi_slopes=slopes,
                            return_weights=True)
    assert np.max(np.abs(out - want_out)) < 1e-12 and np.max(np.abs(w - want_w)) < 1e-12
    f32 = [a.astype(np.float32) for a in (q, k, v)]
    m32 = mask.astype(np.float32) if mask_kind == "float" else mask
    out32, w32 = attn.attention(*f32, m32, causal=causal, window=window, alibi_slopes=slopes,
                                return_weights=True)
    assert np.max(np.abs(out32 - want_out)) < 2e-5 and np.max(np.abs(w32 - want_w)) < 2e-6


@pytest.mark.parametrize("causal", CAUSALS)
@pytest.mark.parametrize("shape", [(300, 700), (3, 1500), (8, 600)])
def test_alibi_in_the_kernels_tiles_and_chunks(causal, shape):
    """float32 prefill (query tiles, key tiles) and decode (split keys merged
    by their maxima) against the dense reference, softcap on."""
    n_q, n_k = shape
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 4, n_q, 32)).astype(np.float32)
    k = rng.standard_normal((1, 2, n_k, 32)).astype(np.float32)
    v = rng.standard_normal((1, 2, n_k, 16)).astype(np.float32)
    slopes = attn.alibi_slopes(4, max_bias=4.0)
    want, _ = dense_attention(q, k, v, slopes, causal, softcap=20.0)
    got = attn.attention(q, k, v, causal=causal, softcap=20.0, alibi_slopes=slopes)
    assert rel_err(got, want) < 1e-5


def test_alibi_far_keys_keep_float32_accuracy():
    """The literal bias -slope (p - j) reaches +slope n on the last keys of a
    non-causal row near the start (and, for a negative slope, on the first
    keys of any row): a float32 kernel adding it as is would lose 1e-4 of
    the logits there. The bias is the same up to a per-row constant, which
    the kernels choose so that it is never positive."""
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, 2048, 16)) * 0.1
    k = rng.standard_normal((1, 2048, 16)) * 0.1
    v = rng.standard_normal((1, 2048, 16))
    f32 = [a.astype(np.float32) for a in (q, k, v)]
    for slope in (0.5, -0.5):  # prefill: positive biases on late keys, then on early ones
        want, want_w = dense_attention(q, k, v, [slope])
        got, w = attn.attention(*f32, alibi_slopes=[slope], return_weights=True)
        assert rel_err(got, want) < 1e-6 and rel_err(w, want_w) < 1e-6
    # decode (a few queries at the end, keys in chunks): a negative slope
    # puts the large literal biases on the first keys
    want, _ = dense_attention(q[:, :3], k, v, [-0.5])
    got = attn.attention(f32[0][:, :3], f32[1], f32[2], alibi_slopes=[-0.5])
    assert rel_err(got, want) < 1e-6


def test_alibi_gradients_match_torch_autograd():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    q = rng.standard_normal((2, 4, 6, 8))
    k = rng.standard_normal((2, 2, 9, 8))
    v = rng.standard_normal((2, 2, 9, 5))
    dout = rng.standard_normal((2, 4, 6, 5))
    slopes = attn.alibi_slopes(4)
    for causal, window in ((False, None), (True, (4, 0)), ("top_left", None)):
        tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
        kr, vr = tk.repeat_interleave(2, dim=1), tv.repeat_interleave(2, dim=1)
        i, j = np.arange(6)[:, None], np.arange(9)[None, :]
        p = i + 3
        bias = -slopes[:, None, None] * (p - j)
        allowed = np.ones((6, 9), bool)
        if causal is True:
            allowed &= j <= p
        if causal == "top_left":
            allowed &= j <= i
        if window:
            allowed &= (p - j <= window[0]) & (j - p <= window[1])
        s = tq @ kr.transpose(-1, -2) / math.sqrt(8) + torch.tensor(np.where(allowed, bias, -np.inf))
        out = torch.softmax(s, dim=-1) @ vr
        out.backward(torch.tensor(dout))
        dq, dk, dv = attn.attention_backward(q, k, v, dout, causal=causal, window=window, alibi_slopes=slopes)
        for got, want in ((dq, tq.grad), (dk, tk.grad), (dv, tv.grad)):
            assert np.max(np.abs(got - want.numpy())) < 1e-12


def test_alibi_errors():
    q = np.zeros((4, 3, 8))
    with pytest.raises(ValueError, match=r"one slope per query head \(4\), got 3"):
        attn.attention(q, q, q, alibi_slopes=[0.5, 0.25, 0.125])
    with pytest.raises(ValueError, match="alibi_slopes must be finite"):
        attn.attention(q, q, q, alibi_slopes=[0.5, np.inf, 0.1, 0.1])
    with pytest.raises(ValueError, match="1-D array"):
        attn.attention(q, q, q, alibi_slopes=np.ones((2, 2)))


def test_alibi_torch_tensors_and_autograd():
    torch = pytest.importorskip("torch")
    q = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    slopes = torch.tensor(attn.alibi_slopes(2))
    out = attn.attention(q, q.detach(), q.detach(), causal=True, alibi_slopes=slopes)
    out.sum().backward()
    dq, _, _ = attn.attention_backward(q.detach().numpy(), q.detach().numpy(), q.detach().numpy(),
                                       np.ones((2, 5, 8)), causal=True, alibi_slopes=slopes.numpy())
    assert np.allclose(q.grad.numpy(), dq, rtol=0, atol=1e-14)
    with pytest.raises(RuntimeError, match="alibi_slopes requires grad"):
        attn.attention(q, q, q, alibi_slopes=slopes.clone().requires_grad_())


# ---------------------------------------------------------------------------
# The layer: MultiHeadAttention(rope=True, rope_scaling=...) and (alibi=True),
# against the layer's arithmetic written out in NumPy.


def numpy_layer(sd, x, H, Hkv, rotate=None, slopes=None, causal=False):
    """The layer of state dict sd on x (B, n, E), float64: q and k through
    rotate(t) per head when given, ALiBi's dense bias when slopes are."""
    B, n, E = x.shape
    dh = E // H
    bq, bk, bv = np.split(sd["in_proj_bias"], [E, E + Hkv * dh])
    q = (x @ sd["q_proj_weight"].T + bq).reshape(B, n, H, dh).transpose(0, 2, 1, 3)
    k = (x @ sd["k_proj_weight"].T + bk).reshape(B, n, Hkv, dh).transpose(0, 2, 1, 3)
    v = (x @ sd["v_proj_weight"].T + bv).reshape(B, n, Hkv, dh).transpose(0, 2, 1, 3)
    if rotate is not None:
        q, k = rotate(q), rotate(k)
    ctx, _ = dense_attention(q, k, v, np.zeros(H) if slopes is None else slopes, causal)
    return ctx.transpose(0, 2, 1, 3).reshape(B, n, E) @ sd["out_proj.weight"].T + sd["out_proj.bias"]


def layer_and_state(H, Hkv, **options):
    layer = attn.MultiHeadAttention(48, H, num_kv_heads=Hkv, seed=5, **options)
    sd = {k: v.astype(np.float64) for k, v in layer.state_dict().items()}
    sd["in_proj_bias"] = np.random.default_rng(1).normal(size=sd["in_proj_bias"].shape)
    layer.load_state_dict(sd)
    return layer, {k: v.astype(np.float64) for k, v in layer.state_dict().items()}


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_layer(causal):
    layer, sd = layer_and_state(6, 3, alibi=True)
    x = np.random.default_rng(2).normal(size=(2, 9, 48))
    want = numpy_layer(sd, x, 6, 3, slopes=bloom_slopes(6), causal=causal)
    assert rel_err(layer(x, causal=causal)[0], want) < 1e-12
    assert rel_err(layer(x.astype(np.float32), causal=causal)[0], want) < 1e-5
    assert layer.alibi and "alibi=True" in repr(layer)


def test_scaled_rope_layer():
    # Phi-style partial rotation (half of each 16-wide head) with llama3 scaling
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 4, "partial_rotary_factor": 0.5}
    layer, sd = layer_and_state(3, 3, rope=True, rope_base=500.0, rope_scaling=scaling)
    assert layer.rope_scaling == {"rope_type": "llama3", **{k: v for k, v in scaling.items() if k != "rope_type"}}
    x = np.random.default_rng(3).normal(size=(2, 11, 48))
    inv, af = hf_inv_freq(8, 500.0, scaling)
    want = numpy_layer(sd, x, 3, 3, rotate=lambda t: hf_rope(t, np.arange(11), inv, af), causal=True)
    assert rel_err(layer(x, causal=True)[0], want) < 1e-12


def test_dynamic_rope_with_a_cache_rotates_each_chunk_at_its_length():
    """Each chunk's q and k take seq_len = the cache length after appending;
    cached keys keep the rotation they were stored with."""
    scaling = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 8}
    layer, sd = layer_and_state(4, 2, rope=True, rope_scaling=scaling)
    x = np.random.default_rng(4).normal(size=(1, 20, 48))
    cache = layer.new_cache()
    got = np.concatenate([layer(x[:, a:b], cache=cache, causal=True)[0]
                          for a, b in ((0, 6), (6, 13), (13, 20))], axis=1)
    # NumPy: keys rotated chunk by chunk, each chunk at its own frequencies
    E, H, Hkv, dh = 48, 4, 2, 12
    bq, bk, bv = np.split(sd["in_proj_bias"], [E, E + Hkv * dh])
    q = (x @ sd["q_proj_weight"].T + bq).reshape(1, 20, H, dh).transpose(0, 2, 1, 3)
    k = (x @ sd["k_proj_weight"].T + bk).reshape(1, 20, Hkv, dh).transpose(0, 2, 1, 3)
    v = (x @ sd["v_proj_weight"].T + bv).reshape(1, 20, Hkv, dh).transpose(0, 2, 1, 3)
    keys, outs = [], []
    for a, b in ((0, 6), (6, 13), (13, 20)):
        inv, _ = hf_inv_freq(dh, 10000.0, scaling, seq_len=b)
        keys.append(hf_rope(k[:, :, a:b], np.arange(a, b), inv, 1.0))
        qc = hf_rope(q[:, :, a:b], np.arange(a, b), inv, 1.0)
        ctx, _ = dense_attention(qc, np.concatenate(keys, 2), v[:, :, :b], np.zeros(H), causal=True)
        outs.append(ctx.transpose(0, 2, 1, 3).reshape(1, b - a, E) @ sd["out_proj.weight"].T + sd["out_proj.bias"])
    assert rel_err(got, np.concatenate(outs, axis=1)) < 1e-12
    # the scaling grew past the original context: one call over all 20 is not the same
    assert rel_err(got, layer(x, causal=True)[0]) > 1e-3


def test_layer_keeps_scaling_and_alibi_through_save_and_load(tmp_path):
    scaling = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 16}
    layer, _ = layer_and_state(4, 4, rope=True, rope_scaling=scaling, alibi=True)
    layer.save(tmp_path / "layer.safetensors")
    back = attn.MultiHeadAttention.load(tmp_path / "layer.safetensors")
    assert back.alibi and back.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "beta_fast": 16.0,
                                                 "original_max_position_embeddings": 32}
    x = np.random.default_rng(5).normal(size=(2, 40, 48)).astype(np.float32)
    assert np.array_equal(back(x, causal=True)[0], layer(x, causal=True)[0])
    assert attn.MultiHeadAttention(8, 2).rope_scaling is None
    with pytest.raises(ValueError, match="rope_scaling is given but rope is off"):
        attn.MultiHeadAttention(8, 2, rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="'factr' is not a key"):
        attn.MultiHeadAttention(8, 2, rope=True, rope_scaling={"rope_type": "linear", "factr": 2.0})


def test_rope_autograd_with_scaling_and_tables():
    torch = pytest.importorskip("torch")
    dim, base, scaling = QWEN2_5_YARN
    x = torch.randn(2, 5, dim, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([0, 3, 40000, 70000, 999999])
    y = attn.rope(x, positions=positions, base=base, scaling=scaling)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float64
    dy = torch.randn_like(y)
    y.backward(dy)
    want = attn.rope_backward(dy.numpy(), positions=positions.numpy(), base=base, scaling=scaling)
    assert np.array_equal(x.grad.numpy(), want)
    # tables as tensors; asking for their gradient is an error, not a silent zero
    inv, af = attn.rope_frequencies(dim, base=base, scaling=scaling)
    angles = np.arange(1000)[:, None] * inv
    cos, sin = torch.tensor(np.cos(angles) * af), torch.tensor(np.sin(angles) * af)
    z = attn.rope(x.detach(), positions=positions % 1000, cos=cos, sin=sin)
    assert np.allclose(z.numpy(), attn.rope(x.detach().numpy(), positions=positions.numpy() % 1000,
                                            base=base, scaling=scaling), rtol=0, atol=1e-12)
    with pytest.raises(RuntimeError, match="cos requires grad"):
        attn.rope(x, positions=positions % 1000, cos=cos.requires_grad_(), sin=sin)
