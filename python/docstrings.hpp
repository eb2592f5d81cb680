// Docstrings of the Python module (shown by help()).
#pragma once

namespace attn::python::docs {

inline constexpr const char* kModule = R"(attn: multi-head attention and positional encodings.

The system of the article "为什么要 Multi-head？attention 其实「不认顺序」":
attention as a soft lookup, multi-head attention on slices of the model
dimension, and the positional encodings (sinusoidal, RoPE) that give attention
the word order it cannot see on its own.

float32 arrays run the fast kernels; float64 arrays are computed in double
precision (the reference path). Other numeric dtypes are converted to float32.
Arrays are read in place when their dtype matches (any strides); the GIL is
released while computing.
)";

inline constexpr const char* kSoftmax = R"(softmax(a, axis=-1)

Numerically stable softmax along `axis`: exp(a - max) / sum(exp(a - max)).
A slice whose entries are all -inf (every choice masked) gives zeros, not NaN.
Returns an array of a's shape (float64 for float64 input, else float32).
)";

inline constexpr const char* kAttention = R"(attention(q, k, v, mask=None, *, causal=False, scale=None, softcap=None,
          window=None, return_weights=False)

Scaled dot-product attention: softmax(q @ k.T * scale + mask) @ v.

Shapes
    q (..., n_q, d), k (..., n_k, d), v (..., n_k, d_v), all of one rank.
    Rank 2 is a single head. At rank >= 3, axis -3 is heads: q has Hq heads,
    k and v have Hkv heads, and Hq must be a multiple of Hkv (GQA/MQA: query
    head h uses key/value head h // (Hq // Hkv)). Leading axes are batch axes
    and must match.
    Returns out (..., Hq, n_q, d_v), or (out, weights) with weights
    (..., Hq, n_q, n_k) when return_weights=True.

mask
    Boolean: True where the query MAY attend (as PyTorch's
    scaled_dot_product_attention and ONNX Attention; the opposite of
    nn.MultiheadAttention's attn_mask). Float: added to the scaled logits
    (-inf forbids). Must broadcast to (..., Hq, n_q, n_k) under NumPy rules;
    a mask that does not is a ValueError, never padded.

causal
    False (default), True (= 'bottom_right') or 'top_left'.
    'bottom_right': query i attends key j iff j <= i + (n_k - n_q), which is
    what a KV cache needs (FlashAttention >= 2.1, llama.cpp).
    'top_left': j <= i, PyTorch's is_causal. With n_q == n_k both are the
    ordinary lower triangle.

scale
    Multiplies q @ k.T; default 1/sqrt(d).

softcap
    c > 0: logits = c * tanh(logits / c) after scaling, before masks.
    None or 0: off. Negative: ValueError.

window
    (left, right) sliding window; -1 or None = unbounded on that side. With
    p = i + (n_k - n_q), key j is allowed iff p - left <= j <= p + right.
    Combines with causal and mask by intersection.

A query row with no allowed key (including n_k = 0) outputs zeros and zero
weights, never NaN.
)";

inline constexpr const char* kMultiHead = R"(multi_head(x, heads=4)

The article's multi-head attention: split the last axis of x (..., n, d) into
`heads` slices of d // heads, run attention(s, s, s) on each slice (the slice is
its own query, key and value; no projections), concatenate. Returns an array of
x's shape. d must be divisible by heads (ValueError otherwise; the article's
NumPy code silently drops the remainder columns).

>>> attn.multi_head(numpy.random.rand(5, 8), 4).shape
(5, 8)
)";

inline constexpr const char* kPositionalEncoding = R"(positional_encoding(n, d, *, base=10000.0, dtype=numpy.float32)

The article's sinusoidal table, shape (n, d):
    angle[p, i] = p / base ** (2 * (i // 2) / d)
    pe[p, i] = sin(angle) for even i, cos(angle) for odd i.
Any n >= 0 and d >= 1 (odd d too); angles computed in double. dtype is
float32 or float64. Add it to the word vectors: x + positional_encoding(n, d).
)";

inline constexpr const char* kRope = R"(rope(x, positions=None, *, base=10000.0, interleaved=False, rotary_dim=None)

Rotary position embedding of x (..., n, d): the first rotary_dim features
(default all of d; must be even) are rotated in pairs, pair i by the angle
pos * base ** (-2 * i / rotary_dim); the rest pass through unchanged.

interleaved=False pairs features (i, i + rotary_dim/2), the "rotate_half" form
of GPT-NeoX and LLaMA in Hugging Face; interleaved=True pairs (2i, 2i + 1), as
GPT-J and Meta's original LLaMA.

positions: None (0 .. n-1) or an integer array broadcastable to (..., n); any
integers, negative too (offsets for a KV cache). Angles are computed in double,
so position 1,000,000 is still accurate. Returns an array of x's shape.
)";

}  // namespace attn::python::docs
