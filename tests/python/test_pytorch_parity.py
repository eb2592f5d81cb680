"""attn as a drop-in for PyTorch: scaled_dot_product_attention against a torch 2.x
semantics reference built from explicit torch 1.13 ops (1.13 has no SDPA),
MultiHeadAttention against torch.nn.MultiheadAttention 1.13 on every option
combination, torch tensors in and out, and gradients through autograd."""
import itertools
import math

import numpy as np
import pytest
import torch

import attn
from util import rel_err


def sdpa_reference(query, key, value, attn_mask=None, is_causal=False, scale=None,
                   enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention (2.5), as its documentation
    defines it, from torch ops (differentiable)."""
    L, S = query.size(-2), key.size(-2)
    scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    bias = torch.zeros(L, S, dtype=query.dtype)
    if is_causal:
        bias = bias.masked_fill(torch.ones(L, S, dtype=torch.bool).tril(0).logical_not(), -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            bias = torch.where(attn_mask, bias, torch.tensor(-math.inf, dtype=query.dtype))
        else:
            bias = attn_mask + bias
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    w = torch.softmax(query @ key.transpose(-2, -1) * scale_factor + bias, dim=-1)
    return w @ value


# (query, key, value, mask) shapes: equal, broadcast batch and heads, rank 2 and 3
SDPA_SHAPES = [
    ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4), (5, 7)),
    ((2, 3, 5, 8), (1, 3, 7, 8), (2, 1, 7, 8), (2, 1, 5, 7)),   # k, v broadcast
    ((1, 4, 6, 8), (3, 4, 6, 8), (3, 4, 6, 8), (3, 4, 6, 6)),   # q broadcasts
    ((5, 8), (7, 8), (7, 3), (7,)),                             # rank 2
    ((4, 5, 8), (4, 7, 8), (4, 7, 8), (4, 5, 7)),               # rank 3
    ((2, 3, 5, 8), (3, 7, 8), (3, 7, 8), (5, 7)),               # k, v of lower rank
]


def arrays(rng, shapes, dtype):
    return [torch.from_numpy(rng.standard_normal(s).astype(dtype)) for s in shapes]


def make_mask(rng, shape, kind, n_k):
    if kind is None:
        return None
    if kind == "bool":
        m = rng.random(shape) < 0.7
        m[..., 0] = True  # every row keeps a key: torch gives NaN for a row with none
        return torch.from_numpy(m)
    return torch.from_numpy(rng.standard_normal(shape))


@pytest.mark.parametrize("shapes", SDPA_SHAPES)
@pytest.mark.parametrize("mask_kind,is_causal", [(None, False), (None, True), ("bool", False),
                                                 ("float", False)])
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sdpa_matches_torch_semantics(shapes, mask_kind, is_causal, scale, dtype):
    rng = np.random.default_rng(len(shapes[0]) + 7 * (scale is None))
    q, k, v = arrays(rng, shapes[:3], dtype)
    mask = make_mask(rng, shapes[3], mask_kind, shapes[1][-2])
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    ref = sdpa_reference(q.double(), k.double(), v.double(),
                         None if mask is None else (mask if mask.dtype == torch.bool else mask.double()),
                         is_causal, scale)
    out = attn.scaled_dot_product_attention(q, k, v, mask, 0.0, is_causal, scale)
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype and out.shape == ref.shape
    assert rel_err(out.numpy(), ref.numpy()) <= (1e-12 if dtype == np.float64 else 2e-6)
    # NumPy in, NumPy out
    np_out = attn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(),
                                               None if mask is None else mask.numpy(),
                                               is_causal=is_causal, scale=scale)
    assert isinstance(np_out, np.ndarray) and np.array_equal(np_out, out.numpy())


@pytest.mark.parametrize("hq,hkv", [(8, 2), (6, 3), (4, 1), (4, 4)])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
def test_sdpa_enable_gqa(hq, hkv, mask_kind):
    rng = np.random.default_rng(hq * 10 + hkv)
    q, k, v = arrays(rng, [(2, hq, 5, 8), (2, hkv, 9, 8), (2, hkv, 9, 6)], np.float64)
    mask = make_mask(rng, (hq, 5, 9), mask_kind, 9)
    ref = sdpa_reference(q, k, v, mask, enable_gqa=True)
    out = attn.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)
    assert rel_err(out.numpy(), ref.numpy()) <= 1e-12
    if hkv not in (1, hq):  # torch without enable_gqa: the heads do not broadcast
        with pytest.raises(ValueError, match="enable_gqa=True"):
            attn.scaled_dot_product_attention(q, k, v)


def test_sdpa_is_causal_is_top_left_where_attention_defaults_to_bottom_right():
    rng = np.random.default_rng(1)
    q, k, v = arrays(rng, [(2, 3, 4, 8), (2, 3, 9, 8), (2, 3, 9, 8)], np.float64)
    out = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert rel_err(out.numpy(), sdpa_reference(q, k, v, is_causal=True).numpy()) <= 1e-12
    assert np.array_equal(out.numpy(), attn.attention(q, k, v, causal="top_left").numpy())
    assert not np.allclose(out.numpy(), attn.attention(q, k, v, causal=True).numpy())


def test_sdpa_errors_name_the_argument():
    q = torch.zeros(2, 4, 3, 8)
    with pytest.raises(ValueError, match="dropout_p=0.1: attn computes attention for inference"):
        attn.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="attn_mask given with is_causal=True"):
        attn.scaled_dot_product_attention(q, q, q, torch.ones(3, 3, dtype=torch.bool), is_causal=True)
    with pytest.raises(TypeError, match="same dtype, got float32, float64, float32"):
        attn.scaled_dot_product_attention(q, q.double(), q)
    with pytest.raises(ValueError, match="do not broadcast"):
        attn.scaled_dot_product_attention(q, torch.zeros(3, 4, 3, 8), torch.zeros(3, 4, 3, 8))
    with pytest.raises(ValueError, match="at least 2 axes"):
        attn.scaled_dot_product_attention(torch.zeros(8), q, q)
    with pytest.raises(TypeError, match="attn_mask must be a bool or float array"):
        attn.scaled_dot_product_attention(q, q, q, torch.ones(3, 3, dtype=torch.int64))


def test_sdpa_a_row_with_no_allowed_key_gives_zeros():
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    out = attn.scaled_dot_product_attention(q, q, q, mask)
    assert torch.equal(out[:, :, 1], torch.zeros(1, 2, 4, dtype=torch.float64))
    assert torch.isnan(sdpa_reference(q, q, q, mask)[:, :, 1]).all()  # torch's math: NaN


@pytest.mark.parametrize("shapes", [SDPA_SHAPES[0], SDPA_SHAPES[1], SDPA_SHAPES[2], SDPA_SHAPES[5]])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_sdpa_gradients_match_torch_autograd(shapes, is_causal, gqa):
    rng = np.random.default_rng(5)
    if gqa:
        shapes = ((2, 4, 5, 8), (2, 2, 7, 8), (1, 2, 7, 3), None)
    q, k, v = (t.requires_grad_() for t in arrays(rng, shapes[:3], np.float64))
    mask = None if is_causal or gqa else make_mask(rng, shapes[3], "float", 7)
    out = attn.scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal, enable_gqa=gqa)
    ref = sdpa_reference(q, k, v, mask, is_causal, enable_gqa=gqa)
    assert out.grad_fn is not None
    dout = torch.from_numpy(rng.standard_normal(tuple(ref.shape)))
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    for g, w, name in zip(got, want, "qkv"):
        assert g.shape == w.shape, name
        assert rel_err(g.numpy(), w.numpy()) <= 1e-10, name


# --- torch tensors in and out, every function ---------------------------------


def test_every_function_returns_the_kind_it_was_given():
    x = torch.randn(2, 3, 6, 8)
    for out in [attn.attention(x, x, x), attn.softmax(x), attn.multi_head(x[0, 0], 2),
                attn.rope(x), attn.rope_backward(x), attn.scaled_dot_product_attention(x, x, x),
                attn.positional_encoding(6, 8, dtype=torch.float64)]:
        assert isinstance(out, torch.Tensor)
    grads = attn.attention_backward(x, x, x, torch.ones(2, 3, 6, 8))
    assert all(isinstance(g, torch.Tensor) for g in grads)
    out, w = attn.attention(x, x, x, return_weights=True)
    assert isinstance(w, torch.Tensor) and w.shape == (2, 3, 6, 6)
    assert attn.positional_encoding(6, 8, dtype=torch.float64).dtype == torch.float64
    for out in [attn.attention(x.numpy(), x.numpy(), x.numpy()), attn.softmax(x.numpy())]:
        assert isinstance(out, np.ndarray)


def test_outputs_share_no_memory_and_strided_inputs_are_read_in_place():
    base = torch.randn(2, 8, 5, 3, dtype=torch.float64)
    q = base.transpose(1, 2)[..., :2, :]  # (2, 5, 2, 3): strided, not contiguous
    assert not q.is_contiguous()
    out = attn.attention(q, q, q)
    assert np.array_equal(out.numpy(), attn.attention(q.contiguous(), q.contiguous(), q.contiguous()).numpy())
    before = out.clone()
    base.add_(1.0)  # changing the input leaves the output alone
    assert torch.equal(out, before)
    sm = attn.softmax(q)
    q.data.mul_(0)
    assert not torch.equal(sm, attn.softmax(q))


def test_half_precision_tensors_come_back_in_their_dtype():
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(2, 4, 8).to(dtype)
        out = attn.scaled_dot_product_attention(x, x, x)
        ref = sdpa_reference(x.double(), x.double(), x.double())
        assert out.dtype == dtype
        assert rel_err(out.double().numpy(), ref.numpy()) <= 1e-2  # one 8-bit-mantissa rounding


def test_tensors_off_the_cpu_are_refused_by_name():
    meta = torch.empty(2, 3, 4, device="meta")
    with pytest.raises(TypeError, match="q is a tensor on meta; attn runs on the CPU"):
        attn.attention(meta, meta, meta)


@pytest.mark.parametrize("name", ["softmax", "rope", "multi_head"])
def test_gradients_of_the_other_functions_match_torch_autograd(name):
    rng = np.random.default_rng(8)
    x = torch.from_numpy(rng.standard_normal((2, 6, 8))).requires_grad_()
    dy = torch.from_numpy(rng.standard_normal((2, 6, 8)))
    if name == "softmax":
        out, ref = attn.softmax(x, axis=1), torch.softmax(x, dim=1)
    elif name == "rope":
        pos = torch.tensor([3, -1, 0, 7, 100, 2])
        out = attn.rope(x, pos, rotary_dim=6)
        theta = pos.double()[:, None] * 10000.0 ** (-torch.arange(3).double() * 2 / 6)
        x1, x2, rest = x[..., :3], x[..., 3:6], x[..., 6:]
        ref = torch.cat([x1 * theta.cos() - x2 * theta.sin(), x2 * theta.cos() + x1 * theta.sin(), rest], -1)
    else:
        out = attn.multi_head(x, 2)
        s = x.reshape(2, 6, 2, 4).transpose(1, 2)
        w = torch.softmax(s @ s.transpose(-1, -2) / 2.0, dim=-1)
        ref = (w @ s).transpose(1, 2).reshape(2, 6, 8)
    assert rel_err(out.detach().numpy(), ref.detach().numpy()) <= 1e-12
    got, = torch.autograd.grad(out, x, dy)
    want, = torch.autograd.grad(ref, x, dy)
    assert rel_err(got.numpy(), want.numpy()) <= 1e-10


def test_gradients_never_silently_dropped():
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    out, w = attn.attention(x, x, x, return_weights=True)
    with pytest.raises(RuntimeError, match="no gradient through the attention weights"):
        (out.sum() + w.sum()).backward()
    mask = torch.zeros(4, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="the mask requires grad.*no gradient for masks"):
        attn.attention(x, x, x, mask)
    with pytest.raises(RuntimeError, match="attention_backward has no backward"):
        attn.attention_backward(x, x, x, torch.ones(2, 4, 8))
    with torch.no_grad():
        assert attn.attention(x, x, x).grad_fn is None


SECOND_DERIVATIVE = "no second derivative \\(double backward is unsupported\\)"


@pytest.mark.parametrize("function", [
    lambda x: attn.attention(x, x * 2, x),
    lambda x: attn.scaled_dot_product_attention(x, x, x, is_causal=True),
    lambda x: attn.softmax(x * x),
    lambda x: attn.multi_head(x, 2),
    lambda x: attn.rope(x) ** 2,
    lambda x: attn.MultiHeadAttention(8, 2, seed=1)(x, need_weights=False)[0],
], ids=["attention", "sdpa", "softmax", "multi_head", "rope", "MultiHeadAttention"])
def test_a_graph_of_the_backward_is_an_error_never_a_silent_zero(function):
    """hessian of a scalar built from attn gave all zeros where torch's math
    does not, and grad(create_graph=True) a gradient that required no grad: a
    gradient penalty trained on nothing. First derivatives still run."""
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    g, = torch.autograd.grad(function(x).sum(), x)
    assert g.abs().sum() > 0
    with pytest.raises(RuntimeError, match=SECOND_DERIVATIVE):
        torch.autograd.grad(function(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=SECOND_DERIVATIVE):
        torch.autograd.functional.hessian(lambda t: function(t).sum(), x)
    with pytest.raises(RuntimeError, match=SECOND_DERIVATIVE):
        function(x).sum().backward(create_graph=True)


# --- nn.MultiheadAttention ------------------------------------------------------


def torch_module(E, H, seed=0, **kw):
    torch.manual_seed(seed)
    t = torch.nn.MultiheadAttention(E, H, **kw)
    with torch.no_grad():  # random biases, so that every bias matters
        for name, p in t.named_parameters():
            if "bias" in name:
                p.uniform_(-0.5, 0.5)
    return t.train()  # train mode with dropout 0 is eval's math, without 1.13's fast path


def call_both(t, a, inputs, **kw):
    """torch's module in float64 (the reference) and attn's layer on float64 tensors."""
    ref_t = torch.nn.MultiheadAttention(t.embed_dim, t.num_heads, bias=t.in_proj_bias is not None,
                                        add_bias_kv=t.bias_k is not None, add_zero_attn=t.add_zero_attn,
                                        kdim=t.kdim, vdim=t.vdim, batch_first=t.batch_first).double()
    ref_t.load_state_dict(t.state_dict())
    with torch.no_grad():
        ref = ref_t(*inputs, **kw)
        got = a(*inputs, **kw)
    return ref, got


MHA_CONFIGS = [dict(batch_first=bf, bias=bias, add_bias_kv=bkv, add_zero_attn=za, kdim=kd, vdim=vd)
               for bf, bias, bkv, za, (kd, vd) in itertools.product(
                   [True, False], [True, False], [False, True], [False, True], [(None, None), (5, 3)])]


def mha_inputs(rng, cfg, batched, E=8, n_q=4, n_k=6, B=2):
    def x(n, width):
        shape = (n, width) if not batched else ((B, n, width) if cfg["batch_first"] else (n, B, width))
        return torch.from_numpy(rng.standard_normal(shape))
    return x(n_q, E), x(n_k, cfg["kdim"] or E), x(n_k, cfg["vdim"] or E)


@pytest.mark.parametrize("cfg", MHA_CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("batched", [True, False])
def test_mha_matches_torch_module(cfg, batched):
    rng = np.random.default_rng(len(MHA_CONFIGS))
    t = torch_module(8, 2, **cfg)
    a = attn.MultiHeadAttention.from_torch(t)
    assert (a.batch_first, a.add_bias_kv, a.add_zero_attn) == (
        cfg["batch_first"], cfg["add_bias_kv"], cfg["add_zero_attn"])
    inputs = mha_inputs(rng, cfg, batched)
    for average in (True, False):
        (ref, ref_w), (out, w) = call_both(t, a, inputs, average_attn_weights=average)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
        assert rel_err(out.numpy(), ref.numpy()) <= 1e-12
        assert w.shape == ref_w.shape and rel_err(w.numpy(), ref_w.numpy()) <= 1e-12
    (ref, _), (out, w) = call_both(t, a, inputs, need_weights=False)
    assert w is None and rel_err(out.numpy(), ref.numpy()) <= 1e-12
    # float32 tensors in, float32 out, against torch's own float32 module
    inputs32 = [x.float() for x in inputs]
    with torch.no_grad():
        ref32, _ = t(*inputs32)
    out32, _ = a(*inputs32)
    assert out32.dtype == torch.float32 and rel_err(out32.numpy(), ref32.numpy()) <= 2e-6


def mha_masks(rng, kind, B, H, n_q, n_k, batched):
    if kind == "bool":
        m = rng.random((n_q, n_k)) < 0.3
        m[:, 0] = False  # True = blocked; keep a key per row (torch: NaN)
        return dict(attn_mask=torch.from_numpy(m))
    if kind == "uint8":
        m = (rng.random((n_q, n_k)) < 0.3).astype(np.uint8)
        m[:, 0] = 0
        return dict(attn_mask=torch.from_numpy(m))
    if kind == "float":
        return dict(attn_mask=torch.from_numpy(rng.standard_normal((n_q, n_k))))
    if kind == "bool_per_head":
        m = rng.random((B * H if batched else H, n_q, n_k)) < 0.3
        m[..., 0] = False
        return dict(attn_mask=torch.from_numpy(m))
    if kind == "float_per_head":
        return dict(attn_mask=torch.from_numpy(rng.standard_normal((B * H if batched else H, n_q, n_k))))
    pad = rng.random((B, n_k) if batched else (n_k,)) < 0.3
    pad[..., 0] = False
    if kind == "padding":
        return dict(key_padding_mask=torch.from_numpy(pad))
    blocked = rng.random((n_q, n_k)) < 0.3
    blocked[:, 0] = False
    return dict(key_padding_mask=torch.from_numpy(pad), attn_mask=torch.from_numpy(blocked))


@pytest.mark.parametrize("kind", ["bool", "uint8", "float", "bool_per_head", "float_per_head",
                                  "padding", "padding_and_bool"])
@pytest.mark.parametrize("cfg", [dict(batch_first=True), dict(batch_first=False),
                                 dict(batch_first=False, add_bias_kv=True, add_zero_attn=True)],
                         ids=["batch_first", "seq_first", "seq_first_bias_kv_zero_attn"])
@pytest.mark.parametrize("batched", [True, False])
def test_mha_masks_match_torch_module(kind, cfg, batched):
    rng = np.random.default_rng(11)
    full = dict(bias=True, add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None)
    full.update(cfg)
    t = torch_module(8, 2, **{k: v for k, v in full.items() if k not in ("kdim", "vdim")})
    a = attn.MultiHeadAttention.from_torch(t)
    q, k, v = mha_inputs(rng, full, batched)
    masks = mha_masks(rng, kind, 2, 2, 4, 6, batched)
    (ref, ref_w), (out, w) = call_both(t, a, (q, k, v), average_attn_weights=False, **masks)
    assert rel_err(out.numpy(), ref.numpy()) <= 1e-12
    assert rel_err(w.numpy(), ref_w.numpy()) <= 1e-12
    # positionally, in torch's order: query, key, value, key_padding_mask, need_weights, attn_mask
    positional = a(q, k, v, masks.get("key_padding_mask"), True, masks.get("attn_mask"), False)
    assert torch.equal(positional[0], out) and torch.equal(positional[1], w)


@pytest.mark.parametrize("cfg", [dict(), dict(batch_first=False), dict(add_bias_kv=True, add_zero_attn=True)])
def test_is_causal_without_a_mask_is_the_top_left_causal_mask(cfg):
    rng = np.random.default_rng(12)
    full = dict(batch_first=True, bias=True, add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None)
    full.update(cfg)
    t = torch_module(8, 2, **{k: v for k, v in full.items() if k not in ("kdim", "vdim")})
    a = attn.MultiHeadAttention.from_torch(t)
    q, k, v = mha_inputs(rng, full, True, n_q=4, n_k=6)
    blocked = torch.ones(4, 6, dtype=torch.bool).triu(1)
    (ref, _), (out, _) = call_both(t, a, (q, k, v), attn_mask=blocked)
    got, _ = a(q, k, v, is_causal=True)
    assert rel_err(got.numpy(), ref.numpy()) <= 1e-12
    hint, _ = a(q, k, v, attn_mask=blocked, is_causal=True)  # with a mask, only a hint
    assert torch.equal(hint, out)
    with pytest.raises(ValueError, match="is_causal=True or causal"):
        a(q, k, v, is_causal=True, causal=True)


def test_mha_gradients_flow_to_the_inputs_as_torch_autograd():
    rng = np.random.default_rng(13)
    for cfg in [dict(batch_first=True, add_bias_kv=True), dict(batch_first=False, add_zero_attn=True, kdim=5, vdim=3)]:
        full = dict(batch_first=True, bias=True, add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None)
        full.update(cfg)
        t = torch_module(8, 2, **full)
        a = attn.MultiHeadAttention.from_torch(t)
        ref_t = torch_module(8, 2, **full).double()
        ref_t.load_state_dict(t.state_dict())
        q, k, v = (x.requires_grad_() for x in mha_inputs(rng, full, True))
        pad = torch.zeros(2, 6, dtype=torch.bool)
        pad[1, 4:] = True
        out, _ = a(q, k, v, key_padding_mask=pad)
        ref, _ = ref_t(q, k, v, key_padding_mask=pad)
        dout = torch.from_numpy(rng.standard_normal(tuple(ref.shape)))
        for g, w in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)):
            assert rel_err(g.numpy(), w.numpy()) <= 1e-10
    # self-attention, m(x, x, x): the three gradients add up in x
    x = torch.from_numpy(rng.standard_normal((2, 5, 8))).requires_grad_()
    t = torch_module(8, 2, batch_first=True)
    a = attn.MultiHeadAttention.from_torch(t)
    ref_t = torch_module(8, 2, batch_first=True).double()
    ref_t.load_state_dict(t.state_dict())
    g, = torch.autograd.grad(a(x, x, x)[0].sum(), x)
    w, = torch.autograd.grad(ref_t(x, x, x)[0].sum(), x)
    assert rel_err(g.numpy(), w.numpy()) <= 1e-10


def test_mha_parameter_gradients_match_torch():
    rng = np.random.default_rng(14)
    t = torch_module(8, 2, batch_first=False, add_bias_kv=True, kdim=5, vdim=3)
    a = attn.MultiHeadAttention.from_torch(t)
    t = t.double()  # the same (float32) values, computed in float64 as attn does for float64 input
    q, k, v = mha_inputs(rng, dict(batch_first=False, kdim=5, vdim=3), True)
    out, _ = t(q, k, v)
    dout = torch.from_numpy(rng.standard_normal(tuple(out.shape)))
    want = dict(zip([n for n, _ in t.named_parameters()], torch.autograd.grad(out, list(t.parameters()), dout)))
    *_, got = a.backward(dout, q, k, v)
    assert set(got) == set(want)
    for name in want:
        assert rel_err(got[name], want[name].numpy()) <= 1e-10, name


def test_load_state_dict_takes_parameters_and_tensors():
    t = torch_module(8, 2, add_bias_kv=True)
    a = attn.MultiHeadAttention(8, 2, add_bias_kv=True)
    a.load_state_dict(dict(t.named_parameters()))  # Parameters that require grad
    for name, p in t.named_parameters():
        assert np.array_equal(a.state_dict()[name], p.detach().numpy()), name
    b = attn.MultiHeadAttention(8, 2)
    b.load_state_dict(t.state_dict(), strict=False)  # bias_k, bias_v ignored
    assert np.array_equal(b.state_dict()["in_proj_weight"], t.in_proj_weight.detach().numpy())


def test_constructor_takes_torch_signature_and_refuses_what_it_cannot_do():
    a = attn.MultiHeadAttention(8, 2, 0.1, False, True, True, 5, 3, False)
    assert (a.dropout, a.bias, a.add_bias_kv, a.add_zero_attn, a.kdim, a.vdim, a.batch_first) == (
        0.1, False, True, True, 5, 3, False)
    assert a.eval() is a and not a.training
    with pytest.raises(ValueError, match="dropout=0.1, which attn never applies"):
        a.train()
    attn.MultiHeadAttention(8, 2, device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="device='cuda'"):
        attn.MultiHeadAttention(8, 2, device="cuda")
    with pytest.raises(ValueError, match="dtype=torch.float64"):
        attn.MultiHeadAttention(8, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\]"):
        attn.MultiHeadAttention(8, 2, dropout=2.0)
    with pytest.raises(ValueError, match="parameter in_proj_weight is torch.float64"):
        attn.MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2).double())
    with pytest.raises(TypeError, match="expected a torch.nn.MultiheadAttention, got Linear"):
        attn.MultiHeadAttention.from_torch(torch.nn.Linear(2, 2))


def test_dropout_layer_behaves_as_torch_in_eval_mode():
    rng = np.random.default_rng(15)
    t = torch.nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True).eval()
    a = attn.MultiHeadAttention.from_torch(t)
    x = torch.from_numpy(rng.standard_normal((2, 5, 8)).astype(np.float32))
    with torch.no_grad():
        ref, ref_w = t(x, x, x)
    out, w = a(x, x, x)
    assert rel_err(out.numpy(), ref.numpy()) <= 2e-6 and rel_err(w.numpy(), ref_w.numpy()) <= 2e-6


def test_save_and_load_keep_torch_options(tmp_path):
    t = torch_module(8, 2, batch_first=False, add_bias_kv=True, add_zero_attn=True, dropout=0.25)
    a = attn.MultiHeadAttention.from_torch(t)
    a.save(tmp_path / "layer.safetensors")
    b = attn.MultiHeadAttention.load(tmp_path / "layer.safetensors")
    assert (b.batch_first, b.add_bias_kv, b.add_zero_attn, b.dropout) == (False, True, True, 0.25)
    x = torch.randn(5, 2, 8)
    assert torch.equal(a(x, x, x)[0], b(x, x, x)[0])


class SmallModel(torch.nn.Module):
    """An embedding, a self-attention block with padding, a classifier head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.attn = torch.nn.MultiheadAttention(16, 4, kdim=16, vdim=16, add_bias_kv=True)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, tokens, padding):
        x = self.embed(tokens).transpose(0, 1)  # (seq, batch, E): nn.MultiheadAttention's default
        y, _ = self.attn(x, x, x, key_padding_mask=padding)
        return self.head(self.norm(x + y).mean(0))


class TorchShell(torch.nn.Module):
    """attn's layer where a torch module is expected (torch tensors in and out)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, *args, **kwargs):
        return self.layer(*args, **kwargs)


def test_a_torch_model_runs_unchanged_with_attn_swapped_in():
    torch.manual_seed(16)
    model = SmallModel()
    tokens = torch.randint(0, 50, (3, 7))
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[0, 5:] = True
    model.train()  # dropout 0: eval's math
    want = model(tokens, padding)
    model.attn = TorchShell(attn.MultiHeadAttention.from_torch(model.attn))
    got = model(tokens, padding)
    assert rel_err(got.detach().numpy(), want.detach().numpy()) <= 1e-5
    got.sum().backward()  # gradients reach the torch parameters around attn's layer
    assert model.embed.weight.grad is not None and model.embed.weight.grad.abs().sum() > 0
