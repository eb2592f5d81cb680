"""The output gate of MultiHeadAttention (gate="headwise" | "elementwise")
against a torch implementation of its formula written here:
out = (concat_h(head_h) * sigmoid(x Wgᵀ + bg)) Woᵀ + bo, forward and backward."""
import numpy as np
import pytest
import torch

import attn
from util import rel_err


def reference(sd, x, heads, kv_heads, gate, causal):
    """The gated layer in float64 torch from its state dict (tensors that may
    require grad): projections, attention per head (GQA by repetition), the
    gate from the query input, the output projection."""
    n, E = x.shape[-2], x.shape[-1]
    dh = E // heads
    if "in_proj_weight" in sd:
        wq, wk, wv = sd["in_proj_weight"].split(E)
    else:
        wq, wk, wv = sd["q_proj_weight"], sd["k_proj_weight"], sd["v_proj_weight"]
    bq, bk, bv = (sd["in_proj_bias"].split([E, wk.shape[0], wv.shape[0]]) if "in_proj_bias" in sd
                  else (None, None, None))
    lin = torch.nn.functional.linear
    q = lin(x, wq, bq).unflatten(-1, (heads, dh)).transpose(-3, -2)
    k = lin(x, wk, bk).unflatten(-1, (kv_heads, dh)).transpose(-3, -2)
    v = lin(x, wv, bv).unflatten(-1, (kv_heads, dh)).transpose(-3, -2)
    k = k.repeat_interleave(heads // kv_heads, dim=-3)
    v = v.repeat_interleave(heads // kv_heads, dim=-3)
    scores = q @ k.transpose(-1, -2) / dh ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    ctx = (scores.softmax(-1) @ v).transpose(-3, -2).flatten(-2)
    if gate != "none":
        g = torch.sigmoid(lin(x, sd["gate_proj.weight"], sd.get("gate_proj.bias")))
        ctx = ctx * (g.repeat_interleave(dh, dim=-1) if gate == "headwise" else g)
    return lin(ctx, sd["out_proj.weight"], sd.get("out_proj.bias"))


CASES = [dict(gate="headwise"), dict(gate="elementwise"), dict(gate="headwise", bias=False, num_kv_heads=2),
         dict(gate="elementwise", num_kv_heads=1)]


def layer_and_state(rng, E=32, H=4, **kw):
    m = attn.MultiHeadAttention(E, H, seed=5, **kw)
    # Biases start at zero: random ones, so that theirs matter too.
    sd = {name: rng.uniform(-0.5, 0.5, t.shape).astype(np.float32) for name, t in m.state_dict().items()}
    m.load_state_dict(sd)
    return m, sd


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_are_the_formula(kw, causal):
    rng = np.random.default_rng(7)
    m, sd = layer_and_state(rng, **kw)
    assert m.gate == kw["gate"]
    shape = {"gate_proj.weight": (4 if kw["gate"] == "headwise" else 32, 32)}
    assert m.state_dict()["gate_proj.weight"].shape == shape["gate_proj.weight"]
    assert ("gate_proj.bias" in m.state_dict()) == kw.get("bias", True)
    x = rng.standard_normal((2, 9, 32))
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in sd.items()}
    xt = torch.tensor(x, requires_grad=True)
    want = reference(params, xt, 4, kw.get("num_kv_heads", 4), kw["gate"], causal)
    dout = rng.standard_normal(want.shape)
    want.backward(torch.from_numpy(dout))

    # float64 inputs compute in float64: the formula to its rounding
    out64, _ = m(x, causal=causal, need_weights=False)
    assert rel_err(out64, want.detach().numpy()) < 1e-12
    out32, _ = m(x.astype(np.float32), causal=causal, need_weights=False)
    assert rel_err(out32, want.detach().numpy()) < 2e-6

    dx, dkey, dvalue, grads = m.backward(dout.astype(np.float32), x.astype(np.float32), causal=causal)
    assert dkey is None and dvalue is None
    assert rel_err(dx, xt.grad.numpy()) < 2e-5
    assert set(grads) == set(sd)
    for name, t in params.items():
        assert rel_err(grads[name], t.grad.numpy()) < 2e-5, name


def test_decoding_token_by_token_is_the_whole_sequence():
    rng = np.random.default_rng(8)
    m, _ = layer_and_state(rng, gate="elementwise", rope=True, num_kv_heads=2)
    x = rng.standard_normal((1, 7, 32)).astype(np.float32)
    whole, _ = m(x, causal=True, need_weights=False)
    cache = m.new_cache()
    steps = [m(x[:, :3], cache=cache, causal=True, need_weights=False)[0]]
    steps += [m(x[:, t:t + 1], cache=cache, causal=True, need_weights=False)[0] for t in range(3, 7)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, rtol=0, atol=2e-6)


def test_a_qwen3_next_q_proj_splits_into_attn_names():
    """Qwen3-Next's q_proj (H * 2 * head_dim, hidden) holds each head's query
    rows then its gate rows; docs/semantics.md's split gives attn's names."""
    rng = np.random.default_rng(9)
    E, H, dh = 32, 4, 8
    m = attn.MultiHeadAttention(E, H, bias=False, num_kv_heads=2, gate="elementwise")
    # (float32 values: the layer keeps float32 parameters)
    q_proj, k_proj, v_proj, o_proj = (rng.standard_normal((rows, E)).astype(np.float32).astype(np.float64)
                                      for rows in (H * 2 * dh, 2 * dh, 2 * dh, E))
    rows = q_proj.reshape(H, 2, dh, E)
    m.load_state_dict({"q_proj_weight": rows[:, 0].reshape(H * dh, E), "gate_proj.weight": rows[:, 1].reshape(H * dh, E),
                       "k_proj_weight": k_proj, "v_proj_weight": v_proj, "out_proj.weight": o_proj})
    # Hugging Face's Qwen3NextAttention, without its q/k norms and RoPE:
    x = torch.tensor(rng.standard_normal((1, 6, E)))
    query, gate = torch.chunk((x @ torch.tensor(q_proj).T).view(1, 6, H, 2 * dh), 2, dim=-1)
    lin = torch.nn.functional.linear
    k = lin(x, torch.tensor(k_proj)).view(1, 6, 2, dh).repeat_interleave(2, dim=2)
    v = lin(x, torch.tensor(v_proj)).view(1, 6, 2, dh).repeat_interleave(2, dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", query, k) / dh ** 0.5
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    ctx = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v).reshape(1, 6, E)
    want = lin(ctx * torch.sigmoid(gate.reshape(1, 6, E)), torch.tensor(o_proj))
    got, _ = m(x.numpy(), causal=True, need_weights=False)
    assert rel_err(got, want.numpy()) < 1e-12


def test_files_pickles_and_bad_gates():
    rng = np.random.default_rng(10)
    m, _ = layer_and_state(rng, gate="headwise")
    x = rng.standard_normal((2, 5, 32)).astype(np.float32)
    want, _ = m(x, need_weights=False)
    import pickle
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        m.save(d + "/gated.safetensors")
        loaded = attn.MultiHeadAttention.load(d + "/gated.safetensors")
    assert loaded.gate == "headwise"
    np.testing.assert_array_equal(loaded(x, need_weights=False)[0], want)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(m))(x, need_weights=False)[0], want)
    with pytest.raises(ValueError, match="gate must be 'none', 'headwise' or 'elementwise', got 'sigmoid'"):
        attn.MultiHeadAttention(32, 4, gate="sigmoid")
    with pytest.raises(ValueError, match="unexpected key 'gate_proj.bias'.*build the layer with gate="):
        attn.MultiHeadAttention(32, 4).load_state_dict(m.state_dict())
    sd = m.state_dict()
    sd["gate_proj.weight"] = np.zeros((32, 32), np.float32)
    with pytest.raises(ValueError, match=r"'gate_proj.weight' has shape \(32, 32\), expected \(4, 32\)"):
        m.load_state_dict(sd)
