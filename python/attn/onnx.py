"""ONNX's Attention (opsets 23, 24 and 25) and RotaryEmbedding (opset 23)
operators, exactly: their inputs, attributes, layouts, defaults and edge
cases, computed by attn (attn.attention and attn.rope; no second kernel).
docs/semantics.md "ONNX operators" lists where attn's answer differs from
ONNX's specification or its reference implementation. NumPy arrays or CPU
torch tensors in; the kind Q (X) is out."""
from . import _core
from ._interop import is_tensor, refuse_grad, to_array, to_tensor

__all__ = ["attention", "rotary_embedding"]


def _arrays(named):
    for x, name in named:
        refuse_grad(x, name, "attn.onnx computes no gradients")
    return tuple(None if x is None else to_array(x, name) for x, name in named)


def attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
              is_causal=0, kv_num_heads=0, q_num_heads=0, qk_matmul_output_mode=0, scale=None,
              softcap=0.0, softmax_precision=None, left_window_size=-1, right_window_size=-1, opset=25,
              qk_matmul_output=True):
    arrays = _arrays(((Q, "Q"), (K, "K"), (V, "V"), (attn_mask, "attn_mask"), (past_key, "past_key"),
                      (past_value, "past_value"), (nonpad_kv_seqlen, "nonpad_kv_seqlen")))
    out = _core.onnx_attention(*arrays, is_causal=is_causal, kv_num_heads=kv_num_heads,
                               q_num_heads=q_num_heads, qk_matmul_output_mode=qk_matmul_output_mode,
                               scale=scale, softcap=softcap, softmax_precision=softmax_precision,
                               left_window_size=left_window_size, right_window_size=right_window_size,
                               opset=opset, qk_matmul_output=qk_matmul_output)
    # Every output is of ONNX's T, Q's dtype (bfloat16, which NumPy lacks, was computed in float32).
    return tuple(to_tensor(a, Q.dtype) for a in out) if is_tensor(Q) else out  # (to_tensor(None) is None)


attention.__doc__ = _core.onnx_attention.__doc__


def rotary_embedding(X, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0,
                     rotary_embedding_dim=0):
    arrays = _arrays(((X, "X"), (cos_cache, "cos_cache"), (sin_cache, "sin_cache"),
                      (position_ids, "position_ids")))
    y = _core.onnx_rotary_embedding(*arrays, interleaved=interleaved, num_heads=num_heads,
                                    rotary_embedding_dim=rotary_embedding_dim)
    return to_tensor(y, X.dtype) if is_tensor(X) else y


rotary_embedding.__doc__ = _core.onnx_rotary_embedding.__doc__
