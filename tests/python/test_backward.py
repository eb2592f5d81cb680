"""attn.attention_backward against torch.autograd through the explicit-ops
reference of torch_reference.py (float64), with every option of
docs/semantics.md "The backward"."""

import numpy as np
import pytest
import torch

import attn
from test_torch import qkv, random_mask
from torch_reference import torch_attention
from util import rel_err


def check(q, k, v, **kw):
    rng = np.random.default_rng(1)
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    out, _ = torch_attention(tq, tk, tv, **kw)
    dout = rng.normal(size=tuple(out.shape))
    out.backward(torch.from_numpy(dout))
    dq, dk, dv = attn.attention_backward(q, k, v, dout, **kw)
    for got, ref in ((dq, tq.grad), (dk, tk.grad), (dv, tv.grad)):
        assert got.dtype == np.float64 and got.shape == tuple(ref.shape)
        assert rel_err(got, ref.numpy()) <= 1e-12
    # float32 in, float32 out, through the fused float32 kernel
    kw32 = dict(kw)
    if kw.get("mask") is not None and kw["mask"].dtype != bool:
        kw32["mask"] = kw["mask"].astype(np.float32)
    got32 = attn.attention_backward(*(a.astype(np.float32) for a in (q, k, v, dout)), **kw32)
    for got, ref in zip(got32, (tq.grad, tk.grad, tv.grad)):
        assert got.dtype == np.float32
        assert rel_err(got, ref.numpy()) <= 1e-4


@pytest.mark.parametrize("batch,hq,hkv,nq,nk,d,dv", [
    ((), 1, 1, 5, 5, 8, 8), ((2,), 4, 4, 7, 11, 16, 8), ((2,), 4, 2, 6, 6, 8, 8),
    ((2,), 6, 1, 3, 9, 4, 4)])
def test_shapes_and_gqa(batch, hq, hkv, nq, nk, d, dv):
    check(*qkv(np.random.default_rng(hq + nk), batch, hq, hkv, nq, nk, d, dv))


@pytest.mark.parametrize("causal", [True, "bottom_right", "top_left"])
@pytest.mark.parametrize("nq,nk", [(6, 6), (4, 9), (9, 4)])
def test_causal(causal, nq, nk):
    check(*qkv(np.random.default_rng(nq * nk), (2,), 4, 2, nq, nk, 8, 8), causal=causal)


@pytest.mark.parametrize("window", [(2, 0), (3, 1), (-1, 2), (1, -1)])
def test_windows(window):
    check(*qkv(np.random.default_rng(5), (2,), 2, 2, 7, 10, 8, 4), window=window,
          causal="top_left")


@pytest.mark.parametrize("softcap", [None, 0.5, 3.0])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_softcap_and_scale(softcap, scale):
    check(*qkv(np.random.default_rng(6), (), 3, 3, 5, 8, 16, 6), softcap=softcap, scale=scale)


@pytest.mark.parametrize("mask_shape", [(8,), (5, 8), (3, 1, 8), (2, 3, 5, 8)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks(mask_shape, kind):
    rng = np.random.default_rng(len(mask_shape))
    q, k, v = qkv(rng, (2,), 3, 3, 5, 8, 8, 4)
    check(q, k, v, mask=random_mask(rng, mask_shape, kind))


def test_rows_with_no_allowed_key_have_zero_gradient():
    q, k, v = qkv(np.random.default_rng(9), (), 2, 2, 4, 5, 8, 3)
    mask = np.ones((4, 5), dtype=bool)
    mask[1] = False
    check(q, k, v, mask=mask)
    dq, _, _ = attn.attention_backward(q, k, v, np.ones((2, 4, 3)), mask)
    assert np.all(dq[:, 1] == 0)


def test_errors_name_the_argument():
    q, k, v = qkv(np.random.default_rng(0), (), 2, 2, 3, 4, 8, 5)
    with pytest.raises(ValueError, match=r"dout has shape \(2, 3, 4\), expected"):
        attn.attention_backward(q, k, v, np.zeros((2, 3, 4)))
    with pytest.raises(TypeError, match="dout must be a numeric array"):
        attn.attention_backward(q, k, v, "x")


@pytest.mark.parametrize("causal", [False, True, "top_left"])
def test_fused_float32_across_tiles(causal):
    # Lengths that cross the kernel's 64-key tiles and 32-row blocks, GQA,
    # against torch.autograd in float64.
    rng = np.random.default_rng(11)
    q, k, v = qkv(rng, (2,), 4, 2, 100, 150, 64, 48)
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    out, _ = torch_attention(tq, tk, tv, causal=causal, softcap=20.0)
    dout = rng.normal(size=tuple(out.shape))
    out.backward(torch.from_numpy(dout))
    got = attn.attention_backward(*(a.astype(np.float32) for a in (q, k, v, dout)), causal=causal, softcap=20.0)
    for g, ref in zip(got, (tq.grad, tk.grad, tv.grad)):
        assert g.dtype == np.float32
        assert rel_err(g, ref.numpy()) <= 1e-4


def test_saved_output_and_lse_skip_the_forward():
    rng = np.random.default_rng(12)
    q, k, v = (a.astype(np.float32) for a in qkv(rng, (), 2, 1, 70, 90, 32, 32))
    dout = rng.normal(size=(2, 70, 32)).astype(np.float32)
    out, lse = attn.attention(q, k, v, causal=True, return_lse=True)
    given = attn.attention_backward(q, k, v, dout, causal=True, out=out, lse=lse)
    recomputed = attn.attention_backward(q, k, v, dout, causal=True)
    for a, b in zip(given, recomputed):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="needs both out and lse"):
        attn.attention_backward(q, k, v, dout, causal=True, out=out)
    with pytest.raises(ValueError, match=r"saved lse has shape \(2, 69\), expected \(2, 70\)"):
        attn.attention_backward(q, k, v, dout, causal=True, out=out, lse=lse[:, :69])


def test_autograd_reads_the_saved_forward():
    # attn.attention on tensors keeps the output and log-sum-exp for its
    # backward; the gradients are attention_backward's.
    rng = np.random.default_rng(13)
    q, k, v = (torch.from_numpy(a.astype(np.float32)).requires_grad_() for a in qkv(rng, (), 2, 2, 40, 50, 16, 16))
    dout = torch.from_numpy(rng.normal(size=(2, 40, 16)).astype(np.float32))
    attn.attention(q, k, v, causal=True).backward(dout)
    want = attn.attention_backward(*(t.detach().numpy() for t in (q, k, v)), dout.numpy(), causal=True)
    for t, w in zip((q, k, v), want):
        assert np.array_equal(t.grad.numpy(), w)


def test_autograd_is_not_fooled_by_an_in_place_change_of_the_output():
    # The node keeps copies of the output and log-sum-exp: changing the
    # returned tensor in place afterwards leaves the gradients alone.
    rng = np.random.default_rng(14)
    q, k, v = (torch.from_numpy(a.astype(np.float32)).requires_grad_() for a in qkv(rng, (), 2, 2, 30, 40, 16, 16))
    dout = torch.from_numpy(rng.normal(size=(2, 30, 16)).astype(np.float32))
    out, lse = attn.attention(q, k, v, return_lse=True)
    with torch.no_grad():
        out.add_(1.0)
        lse.mul_(2.0)
    out.backward(dout)
    want = attn.attention_backward(*(t.detach().numpy() for t in (q, k, v)), dout.numpy())
    for t, w in zip((q, k, v), want):
        assert np.array_equal(t.grad.numpy(), w)
