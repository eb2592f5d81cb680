"""attn.MultiHeadAttention: the learnable layer with torch.nn.MultiheadAttention's
constructor, call and state dict, over attn._core.MultiHeadAttention."""
import json

import numpy as np

from . import _core
from ._interop import (Differentiable, any_tensor, result_dtype, scaling_json, to_array, to_tensor,
                       wants_grad, refuse_grad, _torch)

__all__ = ["MultiHeadAttention"]


class _Forward(Differentiable):
    """One forward of the layer as an autograd node over query, key, value;
    its backward is the layer's (the parameters are attn's, not torch's, and
    get no torch gradient)."""

    output_names = ("the output", "the attention weights")
    differentiable = 1

    def __init__(self, layer, inputs, arrays, masks, options, call, dtype):
        self.layer, self.inputs, self.arrays = layer, inputs, arrays
        self.masks, self.options, self.call, self.dtype = masks, options, call, dtype

    def forward(self):
        out, weights = self.layer.forward(*self.arrays, **self.masks, **self.options, **self.call)
        return to_tensor(out, self.dtype), to_tensor(weights, self.dtype)

    def backward(self, dout):
        dq, dk, dv, _ = self.layer.backward(dout, *self.arrays, **self.masks, **self.options)
        return dq, dk, dv


def _checked_device_and_dtype(device, dtype):
    if device is not None and str(device) != "cpu":
        raise ValueError(f"device={device!r}: attn runs on the CPU (device=None or 'cpu')")
    if dtype is None:
        return
    torch = _torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        float32 = dtype == torch.float32
    else:
        float32 = np.dtype(dtype) == np.float32
    if not float32:
        raise ValueError(f"dtype={dtype!r}: attn keeps the layer's parameters in float32 "
                         "(float64 input is still computed in float64)")


def _length(x, batch_first):
    """The sequence length of a layer input."""
    return np.shape(x)[-2] if batch_first or np.ndim(x) == 2 else np.shape(x)[0]


class MultiHeadAttention:
    """MultiHeadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                   add_zero_attn=False, kdim=None, vdim=None, batch_first=True,
                   device=None, dtype=None, *, num_kv_heads=None, rope=False,
                   rope_base=10000.0, rope_interleaved=False, rope_scaling=None,
                   alibi=False, sinks=False, gate="none", seed=0)

The learnable multi-head attention layer: q = query Wqᵀ + bq, k = key Wkᵀ + bk,
v = value Wvᵀ + bv, split into heads, attention per head, heads concatenated,
out = concat Woᵀ + bo (with a gate: out = (concat * sigmoid(query Wgᵀ + bg)) Woᵀ + bo). torch.nn.MultiheadAttention's constructor, call and
state dict, so code and weights written for it run unchanged; the differences
are listed in docs/semantics.md ("Differences from PyTorch").

PyTorch's arguments, in its order: dropout is kept but never applied (the
layer always runs as torch's does in eval()); add_bias_kv appends learned
keys and values bias_k, bias_v to every sequence, add_zero_attn then a zero
key and value; kdim, vdim: widths of key and value inputs; batch_first=False
reads and writes (seq, batch, feature). attn's default is batch_first=True.
device must be None or 'cpu', dtype None or float32 (parameters are float32;
float64 input is computed in float64).

attn's own, keyword-only: num_kv_heads (GQA; 1 = MQA; must divide num_heads),
rope (rotate q and k per head after projection, at positions cache length +
0..n-1; not with add_bias_kv or add_zero_attn), rope_base, rope_interleaved,
rope_scaling (Hugging Face's rope_scaling dict, as attn.rope takes it; with a
KV cache the length-dependent types see the cache length after appending,
and cached keys keep the rotation they were stored with), alibi (ALiBi:
attention with attn.alibi_slopes(num_heads); not with add_bias_kv or
add_zero_attn), sinks (attention sinks, gpt-oss's: a learnable logit per
head in every row's softmax denominator, the parameter `sinks` (num_heads,),
initialised to 0), gate ("none", "headwise" or "elementwise": the output
gate of Gated Attention and Qwen3-Next, the parameters gate_proj.weight
(num_heads, E) or (E, E) and, with bias, gate_proj.bias; a headwise gate is
broadcast over its head's slice), and seed: weights are initialised as PyTorch does
(Xavier-uniform, zero biases, bias_k and bias_v Xavier-normal), reproducibly
from it.

Inputs and outputs are NumPy arrays or CPU torch tensors (returned as given).
With autograd on, the output of torch inputs carries a grad_fn whose backward
is the layer's; gradients reach the inputs (the layer's parameters are attn's
own: `backward()` returns theirs).
"""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=True, device=None,
                 dtype=None, *, num_kv_heads=None, rope=False, rope_base=10000.0,
                 rope_interleaved=False, rope_scaling=None, alibi=False, sinks=False, gate="none",
                 seed=0):
        _checked_device_and_dtype(device, dtype)
        self._layer = _core.MultiHeadAttention(
            embed_dim, num_heads, dropout=dropout, bias=bias, add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim, batch_first=batch_first,
            num_kv_heads=num_kv_heads, rope=rope, rope_base=rope_base,
            rope_interleaved=rope_interleaved, rope_scaling=scaling_json(rope_scaling),
            alibi=alibi, sinks=sinks, gate=gate, seed=seed)

    @classmethod
    def _of(cls, layer):
        self = cls.__new__(cls)
        self._layer = layer
        return self

    @classmethod
    def load(cls, path):
        return cls._of(_core.MultiHeadAttention.load(path))

    load.__func__.__doc__ = _core.MultiHeadAttention.load.__doc__

    @classmethod
    def from_torch(cls, module):
        """MultiHeadAttention.from_torch(module): the layer of a live
        torch.nn.MultiheadAttention, with its options (batch_first included) and a
        copy of its parameters. A module on another device than the CPU or with
        parameters other than float32 is refused with a ValueError naming it."""
        torch = _torch()
        if torch is None or not isinstance(module, torch.nn.MultiheadAttention):
            raise TypeError("from_torch: expected a torch.nn.MultiheadAttention, got "
                            f"{type(module).__name__}")
        for name, p in module.named_parameters():
            if p.device.type != "cpu":
                raise ValueError(f"from_torch: parameter {name} is on {p.device}; "
                                 "move the module to the CPU first (module.cpu())")
            if p.dtype != torch.float32:
                raise ValueError(f"from_torch: parameter {name} is {p.dtype}; attn keeps float32 "
                                 "parameters: convert the module first (module.float())")
        layer = cls(module.embed_dim, module.num_heads, dropout=module.dropout,
                    bias=module.in_proj_bias is not None, add_bias_kv=module.bias_k is not None,
                    add_zero_attn=module.add_zero_attn, kdim=module.kdim, vdim=module.vdim,
                    batch_first=module.batch_first)
        layer.load_state_dict(module.state_dict())
        return layer

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False, *, causal=False,
                window=None, softcap=None, scale=None, cache=None, seq_ids=None, cu_seqlens=None):
        """forward(query, key=None, value=None, key_padding_mask=None, need_weights=True,
        attn_mask=None, average_attn_weights=True, is_causal=False, *, causal=False,
        window=None, softcap=None, scale=None, cache=None, seq_ids=None,
        cu_seqlens=None) -> (out, weights)

torch.nn.MultiheadAttention.forward's arguments, in its order and with its
defaults, then attn's keyword-only extras.

query (batch, n_q, embed_dim) ((n_q, batch, embed_dim) with batch_first=False)
or unbatched (n_q, embed_dim); key (.., kdim) defaults to query and value
(.., vdim) to key (self-attention).

Masks use nn.MultiheadAttention's convention (the opposite of attn.attention's
boolean convention): attn_mask: boolean True = NOT allowed, or float added to
the logits; (n_q, n_k) or per head (batch * num_heads, n_q, n_k).
key_padding_mask: (batch, n_k) ((n_k,) unbatched); boolean True = padding.
uint8 masks read as boolean. A blocked or padded key takes no part at all,
even a NaN in its input. Both are read in place, never expanded.

is_causal=True: with attn_mask, a hint that it is causal (the mask is used,
as in torch); without one, the top-left causal mask (torch requires the mask).
causal, window, softcap, scale: as in attn.attention (causal: False, True
(= 'bottom_right') or 'top_left'); not with add_bias_kv or add_zero_attn,
whose keys take part in every row. A query row with no allowed key gets zero
attention output, so only the output projection's bias (torch gives NaN).

cache: from new_cache(); this call's keys and values are appended and the
queries attend to everything cached. Feeding a sequence chunk by chunk with
causal=True equals one causal forward over the whole sequence.

Serving many sequences: cache an attn.PagedKVCache, seq_ids its sequences,
query packed (total, embed_dim) with sequence i's new tokens at rows
cu_seqlens[i]:cu_seqlens[i + 1]. Each is rotated at its sequence's positions,
appended to it, and attends all it holds (causal=True: bottom-right per
sequence); need_weights must be False, and weights is None.

Returns (out, weights): out like query; weights (batch, n_q, n_k) averaged over
heads, or (batch, num_heads, n_q, n_k) with average_attn_weights=False, when
need_weights=True, else None. n_k counts the keys add_bias_kv and
add_zero_attn append.
"""
        if seq_ids is not None:
            return self._serve(query, key, value, key_padding_mask, need_weights, attn_mask, is_causal,
                               causal, window, softcap, scale, cache, seq_ids, cu_seqlens)
        if cu_seqlens is not None:
            raise ValueError("forward: cu_seqlens goes with seq_ids and a PagedKVCache")
        if is_causal:
            if causal is not False:
                raise ValueError("forward: give is_causal=True or causal=..., not both")
            if attn_mask is None:
                if self.add_bias_kv or self.add_zero_attn:  # the appended keys stay visible
                    n_q = _length(query, self.batch_first)
                    n_k = _length(query if key is None else key, self.batch_first)
                    attn_mask = np.triu(np.ones((n_q, n_k), bool), 1)  # True: blocked
                else:
                    causal = "top_left"
        masks = dict(key_padding_mask=to_array(key_padding_mask, "key_padding_mask"),
                     attn_mask=to_array(attn_mask, "attn_mask"))
        options = dict(causal=causal, window=window, softcap=softcap, scale=scale)
        call = dict(need_weights=need_weights, average_attn_weights=average_attn_weights,
                    cache=cache)
        inputs = (query, key, value)
        arrays = tuple(None if x is None else to_array(x, n)
                       for x, n in zip(inputs, ("query", "key", "value")))
        if not any_tensor(*inputs, key_padding_mask, attn_mask):
            return self._layer.forward(*arrays, **masks, **options, **call)
        for m, name in ((key_padding_mask, "key_padding_mask"), (attn_mask, "attn_mask")):
            refuse_grad(m, name, "attn computes no gradient for masks")
        given = [x for x in inputs if x is not None]
        run = _Forward(self._layer, inputs, arrays, masks, options, call, result_dtype(*given))
        if not wants_grad(*given):
            return run.forward()
        if cache is not None:
            raise RuntimeError("forward: autograd with a KV cache is not supported (the backward "
                               "trains on whole sequences); call under torch.no_grad()")
        return run.apply()

    __call__ = forward

    def _serve(self, x, key, value, key_padding_mask, need_weights, attn_mask, is_causal, causal, window,
               softcap, scale, cache, seq_ids, cu_seqlens):
        if not isinstance(cache, _core.PagedKVCache):
            raise TypeError(f"forward: seq_ids go with cache=attn.PagedKVCache(...), got cache={cache!r}")
        if need_weights:
            raise ValueError("forward: with seq_ids, need_weights must be False (batch attention returns no weights)")
        if cu_seqlens is None:
            raise ValueError("forward: with seq_ids, cu_seqlens gives each sequence's rows of the packed input")
        for given, name in ((key, "key"), (value, "value"), (key_padding_mask, "key_padding_mask"),
                            (attn_mask, "attn_mask")):
            if given is not None:
                raise ValueError(f"forward: with seq_ids the layer attends itself over the cache: pass no {name}")
        if is_causal:
            causal = True
        refuse_grad(x, "query", "autograd over a PagedKVCache is not supported (serving is inference)")
        out = self._layer.serve(to_array(x, "query"), cache, seq_ids, to_array(cu_seqlens, "cu_seqlens"),
                                causal=causal, window=window, softcap=softcap, scale=scale)
        return (to_tensor(out, result_dtype(x)) if any_tensor(x) else out), None

    def backward(self, dout, query, key=None, value=None, *, key_padding_mask=None,
                 attn_mask=None, causal=False, window=None, softcap=None, scale=None):
        arrays = [None if x is None else to_array(x, n)
                  for x, n in ((dout, "dout"), (query, "query"), (key, "key"), (value, "value"))]
        return self._layer.backward(
            *arrays, key_padding_mask=to_array(key_padding_mask, "key_padding_mask"),
            attn_mask=to_array(attn_mask, "attn_mask"), causal=causal, window=window,
            softcap=softcap, scale=scale)

    backward.__doc__ = _core.MultiHeadAttention.backward.__doc__

    def state_dict(self):
        return self._layer.state_dict()

    state_dict.__doc__ = _core.MultiHeadAttention.state_dict.__doc__

    def load_state_dict(self, state_dict, strict=True):
        """load_state_dict(state_dict, strict=True): load parameters by PyTorch's
        names from NumPy arrays or torch tensors (Parameters too). strict=True:
        every expected name must be present with its shape, and no other
        (ValueError naming the key). strict=False: other names are ignored and
        missing ones keep their values, as in torch."""
        state = {str(k): to_array(v, f"state_dict['{k}']") for k, v in state_dict.items()}
        if not strict:
            current = self._layer.state_dict()
            state = {**current, **{k: v for k, v in state.items() if k in current}}
        self._layer.load_state_dict(state)

    def new_cache(self, dtype="f32", *, sink_tokens=None, window=None, positions="original"):
        return self._layer.new_cache(dtype, sink_tokens=sink_tokens, window=window, positions=positions)

    new_cache.__doc__ = _core.MultiHeadAttention.new_cache.__doc__

    def save(self, path):
        self._layer.save(path)

    save.__doc__ = _core.MultiHeadAttention.save.__doc__

    def eval(self):
        """eval() -> self: attn's layer always runs as torch's does in eval()."""
        return self

    def train(self, mode=True):
        """train(mode=True): only mode=False, or a layer without dropout, since
        attn applies no dropout."""
        if mode and self.dropout > 0:
            raise ValueError(f"train(): this layer has dropout={self.dropout}, which attn never "
                             "applies; it runs in eval mode only")
        return self

    training = property(lambda self: False, doc="False: attn's layer runs in eval mode.")

    def __repr__(self):
        names = ("embed_dim", "num_heads", "num_kv_heads", "kdim", "vdim", "bias", "add_bias_kv",
                 "add_zero_attn", "batch_first", "dropout", "rope", "alibi", "sinks", "gate")
        return "attn.MultiHeadAttention(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in names) + ")"


for _name in ("embed_dim", "num_heads", "num_kv_heads", "head_dim", "kdim", "vdim", "bias",
              "add_bias_kv", "add_zero_attn", "batch_first", "dropout", "rope", "rope_base",
              "rope_interleaved", "alibi", "sinks", "gate"):
    setattr(MultiHeadAttention, _name,
            property(lambda self, n=_name: getattr(self._layer, n)))
MultiHeadAttention.rope_scaling = property(
    lambda self: None if self._layer.rope_scaling is None else json.loads(self._layer.rope_scaling),
    doc="The rope_scaling dict (rope_type and every key set), or None.")
