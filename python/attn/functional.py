"""attn's functions on NumPy arrays or torch tensors, and PyTorch's
scaled_dot_product_attention. The computing is attn._core's; this file adds
torch tensors in and out and their gradients (see _interop)."""
import numpy as np

from . import _core
from ._interop import (Differentiable, any_tensor, is_quantized, is_tensor, refuse_grad, result_dtype,
                       scaling_json, sum_to_shape, to_array, to_tensor, wants_grad, _torch)

__all__ = ["softmax", "attention", "attention_backward", "attention_varlen", "sparse_attention", "latent_attention",
           "scaled_dot_product_attention",
           "multi_head", "positional_encoding", "rope", "rope_backward", "rope_frequencies",
           "alibi_slopes"]


class _Attention(Differentiable):
    """_core.attention on arrays, as an autograd node over the tensors
    `inputs` (q, k, v as given, and the sinks when there are some). `arrays`
    are what the library reads: q, k, v, or views of them broadcast to a
    common batch shape, whose gradients are summed back to the inputs'
    shapes. `returns` are the return_* keywords."""

    differentiable = 1

    def __init__(self, inputs, arrays, mask, options, returns, dtype):
        self.inputs, self.arrays, self.mask = inputs, arrays, mask
        self.options, self.returns, self.dtype = options, returns, dtype
        self.output_names = ("the output",) + tuple(
            name for name, key in (("the attention weights", "return_weights"),
                                   ("the logits", "return_logits"), ("the log-sum-exp", "return_lse"))
            if returns[key] not in (None, False))

    def forward(self):
        # The log-sum-exp always: the backward reads it with the output
        # instead of running the forward again.
        r = _core.attention(*self.arrays, self.mask, **dict(self.returns, return_lse=True), **self.options)
        # (Copies: the returned tensors share these arrays' memory, and an
        # in-place change to them must not change the gradients.)
        self.saved = dict(out=r[0].copy(), lse=r[-1].copy())
        r = r if self.returns["return_lse"] else r[:-1]
        return tuple(to_tensor(a, self.dtype) for a in r)

    def backward(self, dout):
        options = {key: value for key, value in self.options.items() if key != "precision"}  # (f32 here)
        grads = _core.attention_backward(*self.arrays, dout, self.mask, **self.saved, **options)
        return tuple(sum_to_shape(g, tuple(x.shape)) for g, x in zip(grads, self.inputs))  # (dsinks: (Hq,))


def _attention(inputs, arrays, mask, options, returns):
    """The output (and the extras asked for), as arrays or, when any input or
    the mask is a tensor, as tensors with autograd."""
    mask_array = to_array(mask, "mask")
    if not any_tensor(*inputs, mask):
        return _core.attention(*arrays, mask_array, **returns, **options)
    refuse_grad(mask, "the mask", "attn computes no gradient for masks")
    run = _Attention(inputs, arrays, mask_array, options, returns, result_dtype(*inputs[:3]))
    out = run.apply() if wants_grad(*inputs) else run.forward()
    return out if len(out) > 1 else out[0]


def attention(q, k, v, mask=None, *, causal=False, scale=None, softcap=None, window=None,
              alibi_slopes=None, sinks=None, return_weights=False, return_logits=None, return_lse=False,
              precision="f32"):
    arrays = (to_array(q, "q"), to_array(k, "k", quantized=True), to_array(v, "v", quantized=True))
    refuse_grad(alibi_slopes, "alibi_slopes", "attn computes no gradient for ALiBi's slopes")
    if precision != "f32":
        _core.precision_unit(precision)  # (a ValueError naming the choices, before any other)
        for x, name in ((q, "q"), (k, "k"), (v, "v"), (sinks, "sinks")):
            refuse_grad(x, name, f"precision={precision!r} is for the forward (attn's backward is float32)")
    options = dict(causal=causal, scale=scale, softcap=softcap, window=window,
                   alibi_slopes=to_array(alibi_slopes, "alibi_slopes"), sinks=to_array(sinks, "sinks"),
                   precision=precision)
    returns = dict(return_weights=return_weights, return_logits=return_logits, return_lse=return_lse)
    inputs = (q, k, v) + ((sinks,) if is_tensor(sinks) else ())  # learnable sinks get a gradient
    return _attention(inputs, arrays, mask, options, returns)


attention.__doc__ = _core.attention.__doc__ + """
Torch tensors (CPU) are read in place and give tensors back; with autograd on,
the output's grad_fn calls attention_backward (q, k, v and the sinks get their
gradients; the extras and the mask get none: backpropagating into them is an
error).
"""


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, softcap=None,
                     window=None, alibi_slopes=None, sinks=None, return_lse=False):
    inputs = (q, k, v, sinks)
    for x, name in zip(inputs, ("q", "k", "v", "sinks")):
        refuse_grad(x, name, "attention_varlen has no backward yet")
    arrays = [None if x is None else to_array(x, n, quantized=n in ("k", "v"))
              for x, n in zip(inputs, ("q", "k", "v", "sinks"))]
    r = _core.attention_varlen(*arrays[:3], to_array(cu_seqlens_q, "cu_seqlens_q"),
                               to_array(cu_seqlens_k, "cu_seqlens_k"), causal=causal, scale=scale,
                               softcap=softcap, window=window,
                               alibi_slopes=to_array(alibi_slopes, "alibi_slopes"), sinks=arrays[3],
                               return_lse=return_lse)
    if not any_tensor(q, k, v):
        return r
    dtype = result_dtype(q, k, v)
    return tuple(to_tensor(a, dtype) for a in r) if return_lse else to_tensor(r, dtype)


attention_varlen.__doc__ = _core.attention_varlen.__doc__


def latent_attention(q_nope, q_pe, ckv, kpe, *, scale, causal=False, return_lse=False):
    inputs = (q_nope, q_pe, ckv, kpe)
    names = ("q_nope", "q_pe", "ckv", "kpe")
    for x, name in zip(inputs, names):
        refuse_grad(x, name, "latent_attention has no backward")
    r = _core.latent_attention(*(to_array(x, n) for x, n in zip(inputs, names)), scale=scale, causal=causal,
                               return_lse=return_lse)
    if not any_tensor(*inputs):
        return r
    dtype = result_dtype(q_nope, q_pe)
    return tuple(to_tensor(a, dtype) for a in r) if return_lse else to_tensor(r, dtype)


latent_attention.__doc__ = _core.latent_attention.__doc__


def sparse_attention(q, *args, scale=None, softcap=None, sinks=None, return_lse=False, **named):
    paged = "cache" in named or (len(args) > 1 and isinstance(args[1], _core.PagedKVCache))
    names = ("qo_indptr", "cache", "seq_ids", "indices") if paged else ("k", "v", "indices")
    if len(args) > len(names):
        raise TypeError(f"sparse_attention takes (q, k, v, indices) or (q, qo_indptr, cache, seq_ids, indices), "
                        f"got {1 + len(args)} positional arguments")
    given = dict(zip(names, args))
    for key in named:
        if key not in names or key in given:
            raise TypeError(f"sparse_attention({', '.join(('q',) + names)}) got an unexpected or repeated "
                            f"argument {key!r}")
    given.update(named)
    missing = [name for name in names if name not in given]
    if missing:
        raise TypeError(f"sparse_attention({', '.join(('q',) + names)}) is missing {', '.join(missing)}")
    for x, name in ((q, "q"), (given.get("k"), "k"), (given.get("v"), "v"), (sinks, "sinks")):
        refuse_grad(x, name, "sparse_attention has no backward")
    options = dict(scale=scale, softcap=softcap, sinks=to_array(sinks, "sinks"), return_lse=return_lse)
    if paged:
        r = _core.sparse_attention_paged(to_array(q, "q"), to_array(given["qo_indptr"], "qo_indptr"), given["cache"],
                                         given["seq_ids"], to_array(given["indices"], "indices"), **options)
        if not is_tensor(q):
            return r
        return tuple(to_tensor(a) for a in r) if return_lse else to_tensor(r)
    k, v = given["k"], given["v"]
    r = _core.sparse_attention(to_array(q, "q"), to_array(k, "k"), to_array(v, "v"),
                               to_array(given["indices"], "indices"), **options)
    if not any_tensor(q, k, v):
        return r
    dtype = result_dtype(q, k, v)
    return tuple(to_tensor(a, dtype) for a in r) if return_lse else to_tensor(r, dtype)


sparse_attention.__doc__ = _core.sparse_attention.__doc__


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                             is_causal=False, scale=None, enable_gqa=False)

PyTorch's torch.nn.functional.scaled_dot_product_attention (2.5), computed by
attn: softmax(query @ key.T * scale + bias) @ value.

query (..., L, E), key (..., S, E), value (..., S, Ev); the leading axes
broadcast as torch.matmul broadcasts them (read in place, never expanded).
attn_mask: boolean, True = takes part; or float, added to the logits; it
broadcasts to (..., L, S). is_causal=True: query i attends keys j <= i (the
upper-left triangle), and attn_mask must be None. scale: default
1/sqrt(E). enable_gqa=True: key and value may have fewer heads (axis -3)
than query, a divisor of its count; query head h reads key/value head
h // (Hq // Hkv). Without it, heads broadcast like batch axes.

Differences from torch: dropout_p must be 0 (attn is for inference: a
ValueError names it); a query row with no allowed key gives zeros (torch: NaN
or zeros, by version and backend); errors are ValueError/TypeError naming
the argument. NumPy arrays or torch tensors, returned as given (float16 and
bfloat16 tensors are computed in float32 and returned in their dtype);
autograd as attn.attention.
"""
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p={dropout_p!r}: attn computes attention for inference and has "
                         "no dropout; pass dropout_p=0.0 (what nn.MultiheadAttention does in eval())")
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: attn_mask given with is_causal=True; "
                         "give one or the other, as torch requires")
    inputs = (query, key, value)
    names = ("query", "key", "value")
    # Keys and values stored as an attn.QuantizedTensor are read as they are:
    # they are never broadcast (the batch axes must be the query's).
    arrays = [to_array(x, n, quantized=n != "query") for x, n in zip(inputs, names)]
    arrays = [a if is_quantized(a) else np.asarray(a) for a in arrays]
    dtypes = [str(x.dtype).replace("torch.", "") if is_tensor(x) else str(a.dtype)
              for x, a in zip(inputs, arrays) if not is_quantized(a)]
    if len(set(dtypes)) != 1:
        raise TypeError("scaled_dot_product_attention: query, key and value must have the same "
                        f"dtype, got {', '.join(dtypes)}")
    for a, n in zip(arrays, names):
        if len(a.shape) < 2:
            raise ValueError(f"scaled_dot_product_attention: {n} must have at least 2 axes "
                             f"(..., seq, features), got shape {a.shape}")
    mask = to_array(attn_mask, "attn_mask")
    if mask is not None and np.asarray(mask).dtype.kind not in "bf":
        raise TypeError("scaled_dot_product_attention: attn_mask must be a bool or float array "
                        f"(as in torch), got dtype {np.asarray(mask).dtype}")
    mask_shape = () if mask is None else np.shape(mask)
    shapes = " ".join(f"{n} {a.shape}" for n, a in zip(names, arrays))
    q, k, v = arrays
    gqa = enable_gqa and min(len(a.shape) for a in arrays) >= 3
    own = 3 if gqa else 2  # trailing axes of each operand that do not broadcast
    if gqa and (k.shape[-3] != v.shape[-3] or q.shape[-3] % k.shape[-3]):
        raise ValueError("scaled_dot_product_attention: with enable_gqa, key and value need the "
                         "same number of heads (axis -3), a divisor of query's; got " + shapes)
    try:
        lead = np.broadcast_shapes(*(a.shape[:-own] for a in arrays), mask_shape[:-own])
    except ValueError:
        hint = "" if gqa else "; for fewer key/value heads than query heads pass enable_gqa=True"
        raise ValueError("scaled_dot_product_attention: the batch axes of " + shapes +
                         (f" attn_mask {mask_shape}" if mask is not None else "") +
                         " do not broadcast" + hint) from None
    for a, n in zip(arrays, names):
        if is_quantized(a) and a.shape[:-own] != lead:
            raise ValueError(f"scaled_dot_product_attention: {n}, an attn.QuantizedTensor, is read as it is "
                             f"stored and cannot broadcast: give it the batch axes {lead}, or pass "
                             f"{n}.dequantize(); got " + shapes)
    views = tuple(a if is_quantized(a) else np.broadcast_to(a, lead + a.shape[-own:]) for a in arrays)
    options = dict(causal="top_left" if is_causal else False, scale=scale, softcap=None, window=None)
    out = _attention(inputs, views, attn_mask, options,
                     dict(return_weights=False, return_logits=None, return_lse=False))
    if not is_tensor(out) and out.dtype != q.dtype and q.dtype.kind == "f":
        out = out.astype(q.dtype)  # float16 in, float16 out, as torch
    return out


def attention_backward(q, k, v, dout, mask=None, *, causal=False, scale=None, softcap=None,
                       window=None, alibi_slopes=None, sinks=None, out=None, lse=None):
    inputs = (q, k, v, dout)
    refuse_second = [x for x in inputs if wants_grad(x)]
    if refuse_second:
        raise RuntimeError("attention_backward has no backward (no second derivative); call it "
                           "under torch.no_grad() or on detached tensors")
    arrays = [to_array(x, n, quantized=n in ("k", "v")) for x, n in zip(inputs, ("q", "k", "v", "dout"))]
    grads = _core.attention_backward(*arrays, to_array(mask, "mask"), causal=causal, scale=scale,
                                     softcap=softcap, window=window,
                                     alibi_slopes=to_array(alibi_slopes, "alibi_slopes"),
                                     sinks=to_array(sinks, "sinks"), out=to_array(out, "out"),
                                     lse=to_array(lse, "lse"))
    if not any_tensor(*inputs, mask):
        return grads
    dtype = result_dtype(*inputs)
    return tuple(to_tensor(g, dtype) for g in grads)


attention_backward.__doc__ = _core.attention_backward.__doc__


class _Unary(Differentiable):
    """f(x) -> y as an autograd node; backward(dy) from `gradient`."""

    output_names = ("the output",)
    differentiable = 1

    def __init__(self, x, array, compute, gradient, dtype):
        self.inputs, self.array, self.compute, self.gradient, self.dtype = (x,), array, compute, gradient, dtype

    def forward(self):
        self.y = self.compute(self.array)
        return (to_tensor(self.y, self.dtype),)

    def backward(self, dy):
        return (self.gradient(self.array, self.y, dy),)


def _unary(x, name, compute, gradient):
    array = to_array(x, name)
    if not is_tensor(x):
        return compute(array)
    run = _Unary(x, array, compute, gradient, result_dtype(x))
    return (run.apply() if wants_grad(x) else run.forward())[0]


def softmax(a, axis=-1):
    def gradient(_, y, dy):
        return y * (dy - (dy * y).sum(axis=axis, keepdims=True))
    return _unary(a, "a", lambda x: _core.softmax(x, axis), gradient)


softmax.__doc__ = _core.softmax.__doc__


def multi_head(x, heads=4):
    def gradient(x, _, dy):
        # each head is attention(s, s, s) on its slice s: the three gradients add up
        def split(t):
            t = np.asarray(t)
            return t.reshape(t.shape[:-1] + (heads, t.shape[-1] // heads)).swapaxes(-2, -3)
        s = split(x)
        dq, dk, dv = _core.attention_backward(s, s, s, split(dy))
        return (dq + dk + dv).swapaxes(-2, -3).reshape(np.shape(x))
    return _unary(x, "x", lambda a: _core.multi_head(a, heads), gradient)


multi_head.__doc__ = _core.multi_head.__doc__


def _rope_options(positions, base, interleaved, rotary_dim, scaling, cos, sin, mrope_section):
    """rope's keyword arguments as _core takes them: arrays, the scaling as
    JSON. The tables get no gradient (it is an error to ask for one)."""
    for table, name in ((cos, "cos"), (sin, "sin")):
        refuse_grad(table, name, "attn computes no gradient for the cos/sin tables")
    return to_array(positions, "positions"), dict(
        base=base, interleaved=interleaved, rotary_dim=rotary_dim, scaling=scaling_json(scaling),
        cos=to_array(cos, "cos"), sin=to_array(sin, "sin"), mrope_section=mrope_section)


def rope(x, positions=None, *, base=10000.0, interleaved=False, rotary_dim=None, scaling=None,
         cos=None, sin=None, mrope_section=None):
    p, options = _rope_options(positions, base, interleaved, rotary_dim, scaling, cos, sin, mrope_section)
    return _unary(x, "x", lambda a: _core.rope(a, p, **options),
                  lambda _, __, dy: _core.rope_backward(dy, p, **options))


rope.__doc__ = _core.rope.__doc__


def rope_backward(dy, positions=None, *, base=10000.0, interleaved=False, rotary_dim=None,
                  scaling=None, cos=None, sin=None, mrope_section=None):
    refuse_grad(dy, "dy", "rope_backward has no backward")
    p, options = _rope_options(positions, base, interleaved, rotary_dim, scaling, cos, sin, mrope_section)
    out = _core.rope_backward(to_array(dy, "dy"), p, **options)
    return to_tensor(out, result_dtype(dy)) if is_tensor(dy) else out


rope_backward.__doc__ = _core.rope_backward.__doc__


def rope_frequencies(rotary_dim, *, base=10000.0, scaling=None, seq_len=None):
    return _core.rope_frequencies(rotary_dim, base=base, scaling=scaling_json(scaling), seq_len=seq_len)


rope_frequencies.__doc__ = _core.rope_frequencies.__doc__
alibi_slopes = _core.alibi_slopes


def positional_encoding(n, d, *, base=10000.0, dtype=np.float32):
    torch = _torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"positional_encoding: dtype must be float32 or float64, got {dtype}")
        table = _core.positional_encoding(n, d, base=base,
                                          dtype=np.float64 if dtype == torch.float64 else np.float32)
        return to_tensor(table)
    return _core.positional_encoding(n, d, base=base, dtype=dtype)


positional_encoding.__doc__ = _core.positional_encoding.__doc__ + """
dtype may also be torch.float32 or torch.float64: the table is then a tensor.
"""
