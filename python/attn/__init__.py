"""attn: multi-head attention and positional encodings.

The system of the article "为什么要 Multi-head？attention 其实「不认顺序」":
attention as a soft lookup, multi-head attention on slices of the model
dimension, and the positional encodings (sinusoidal, RoPE with the scalings
real models use, M-RoPE, ALiBi) that give attention the word order it cannot
see on its own.

Every function and the layer take NumPy arrays or CPU torch tensors and return
the kind they were given. float32 runs the fast kernels; float64 is computed in
double precision (the reference path); other numeric dtypes are converted to
float32. Inputs are read in place when their dtype matches (any strides); the
GIL is released while computing. With torch autograd on, outputs carry a
grad_fn computed by attn's backward.

For code written for PyTorch: scaled_dot_product_attention has
torch.nn.functional's signature, MultiHeadAttention torch.nn.MultiheadAttention's
(and MultiHeadAttention.from_torch(module) copies a live one).
"""
from ._core import (KVCache, QuantizedTensor, __version__, decode_precision_unit,  # noqa: F401
                    max_num_threads, num_threads, precision_unit, quantize, set_num_threads)
from .functional import (alibi_slopes, attention, attention_backward, attention_varlen,  # noqa: F401
                         multi_head, positional_encoding, rope, rope_backward, rope_frequencies,
                         latent_attention, scaled_dot_product_attention, softmax, sparse_attention)
from .latent import LatentCache, MultiHeadLatentAttention  # noqa: F401
from .layer import MultiHeadAttention  # noqa: F401
from .serving import (BatchAttentionPlan, PagedKVCache, batch_attention, merge_state,  # noqa: F401
                      merge_state_in_place, merge_states)
from . import onnx  # noqa: F401

__all__ = ["attention", "attention_backward", "attention_varlen", "sparse_attention", "latent_attention",
           "scaled_dot_product_attention", "softmax",
           "multi_head", "positional_encoding", "rope", "rope_backward", "rope_frequencies",
           "alibi_slopes", "MultiHeadAttention", "MultiHeadLatentAttention", "LatentCache", "onnx", "merge_state", "merge_state_in_place", "merge_states",
           "PagedKVCache", "BatchAttentionPlan", "batch_attention",
           "KVCache", "QuantizedTensor", "quantize", "num_threads", "set_num_threads", "max_num_threads",
           "precision_unit", "decode_precision_unit", "__version__"]
