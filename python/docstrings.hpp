// Docstrings of the Python module (shown by help()).
#pragma once

namespace attn::python::docs {

inline constexpr const char* kModule = R"(attn._core: the compiled library over NumPy arrays.

Use the package: `import attn` (python/attn/), which takes NumPy arrays and
torch tensors alike.
)";

inline constexpr const char* kSoftmax = R"(softmax(a, axis=-1)

Numerically stable softmax along `axis`: exp(a - max) / sum(exp(a - max)).
A slice whose entries are all -inf (every choice masked) gives zeros, not NaN.
Returns an array of a's shape (float64 for float64 input, else float32).
)";

inline constexpr const char* kLatentAttention = R"(latent_attention(q_nope, q_pe, ckv, kpe, *, scale, causal=False,
                 return_lse=False) -> out, or (out, lse)

Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi K2) in its absorbed
form: MQA over a latent cache, keys [ckv | kpe] and values ckv, one KV head
for every query head. q_nope (n_q, H, r): the query's no-RoPE part with W_UK
folded in; q_pe (n_q, H, p): its rotated RoPE part; ckv (n_k, r): the
normalised latents; kpe (n_k, p): the rotated RoPE keys. Returns out
(n_q, H, r), the latent output before W_UV, and with return_lse the lse
(n_q, H). scale is the model's softmax scale (DeepSeek: 1/sqrt(qk_nope_head_dim
+ qk_rope_head_dim), YaRN's mscale applied), so it is required. causal:
bottom-right (the queries are the last n_q keys). When ckv and kpe are the
two parts of one (n_k, r + p) array (cache[:, :r], cache[:, r:]), its rows
are read in place; otherwise the keys are copied side by side first. float64
inputs are computed in float64; float16 ckv and kpe are read as float16.
)";

inline constexpr const char* kPagedLatent = R"(PagedKVCache.latent(num_pages, page_size, kv_lora_rank, rope_dim, *, dtype='f32')

MLA's latent cache in pages (vLLM's MLA cache; DeepSeek-V3: 512 + 64, one
KV head of 576): each token's row [c | k_pe] is its key, and the row's first
kv_lora_rank columns its value, read in place. append(seq_ids, rows, None,
append_indptr) with rows (nnz, 1, kv_lora_rank + rope_dim). dtype 'f32',
'bf16', 'f16' store whole rows; 'q8_0' stores c as q8_0 blocks and k_pe in
bfloat16, read through a float32 copy (latent_rows(seq)), so batch_attention,
sparse_attention and pages() refuse it. MultiHeadLatentAttention serves over
it: m(x, cache=..., seq_ids=..., cu_seqlens=...).
)";

inline constexpr const char* kSparseAttention = R"(sparse_attention(q, k, v, indices, *, scale=None, softcap=None, sinks=None,
                 return_lse=False) -> out, or (out, lse)

Top-k sparse attention (DeepSeek-V3.2's DSA): query row i attends only the
keys its row of indices names. q (..., Hq, n_q, D), k (..., Hkv, n_k, D),
v (..., Hkv, n_k, Dv), indices integers (..., Hkv or 1, n_q, topk): key
positions per KV head (or one row for all heads), -1 anywhere meaning none.
Equal to attention with the boolean mask the indices describe; the keys are
gathered as they are read, so time and memory grow with topk, not n_k.
scale, softcap and sinks as attention's; GQA as attention's. lse
(..., Hq, n_q), natural log; a row with no key gives zeros and lse -inf (the
sink's logit with sinks). ValueError naming indices for a value below -1 or
at or beyond n_k, or a key named twice in one row. float64 inputs are
computed in float64, the others in float32.

sparse_attention(q, qo_indptr, cache, seq_ids, indices, *, scale=None,
                 softcap=None, sinks=None, return_lse=False)

The same over a PagedKVCache (any storage dtype, read in place): request r
is sequence seq_ids[r], its queries rows qo_indptr[r]:qo_indptr[r + 1] of q
(nnz_q, Hq, D); indices (nnz_q, Hkv or 1, topk) are positions in that
sequence. out (nnz_q, Hq, Dv), lse (nnz_q, Hq); float32.
)";

inline constexpr const char* kAttention = R"(attention(q, k, v, mask=None, *, causal=False, scale=None, softcap=None,
          window=None, alibi_slopes=None, sinks=None, return_weights=False,
          return_logits=None, return_lse=False, precision='f32')

Scaled dot-product attention: softmax(q @ k.T * scale + mask) @ v.

Shapes
    q (..., n_q, d), k (..., n_k, d), v (..., n_k, d_v), all of one rank.
    Rank 2 is a single head. At rank >= 3, axis -3 is heads: q has Hq heads,
    k and v have Hkv heads, and Hq must be a multiple of Hkv (GQA/MQA: query
    head h uses key/value head h // (Hq // Hkv)). Leading axes are batch axes
    and must match.
    Returns out (..., Hq, n_q, d_v); with extras asked for, the tuple
    (out, *extras), the extras in the order weights, logits, lse (only those
    asked for): weights and logits (..., Hq, n_q, n_k), lse (..., Hq, n_q).

mask
    Boolean: True where the query MAY attend (as PyTorch's
    scaled_dot_product_attention and ONNX Attention; the opposite of
    nn.MultiheadAttention's attn_mask); a disallowed key takes no part at
    all, even a NaN in its value row. Float: added to the scaled logits
    (-inf gives weight 0, but 0 * NaN is NaN). Integer masks are a TypeError
    (convert: mask.astype(bool)). Must broadcast to (..., Hq, n_q, n_k) under
    NumPy rules; a mask that does not is a ValueError, never padded.

causal
    False (default; also 'none'), True (= 'bottom_right'), 'top_left' or
    ('offset', k). 'bottom_right': query i attends key j iff
    j <= i + (n_k - n_q), which is what a KV cache needs (FlashAttention
    >= 2.1, llama.cpp). 'top_left': j <= i, PyTorch's is_causal. With
    n_q == n_k both are the ordinary lower triangle. ('offset', k): j <= i + k
    (ONNX's "past length + i" when the keys are longer than past + queries);
    the window and ALiBi then measure from p = i + k.

scale
    Multiplies q @ k.T; default 1/sqrt(d).

softcap
    c > 0: logits = c * tanh(logits / c) after scaling, before masks.
    None or 0: off. Negative: ValueError.

window
    (left, right) sliding window; -1 or None = unbounded on that side. With
    p = i + (n_k - n_q) (i + k with causal=('offset', k)), key j is allowed
    iff p - left <= j <= p + right.
    Combines with causal and mask by intersection.

alibi_slopes
    ALiBi: one slope per query head, shape (Hq,) (attn.alibi_slopes(Hq) gives
    BLOOM's); adds -slope[h] * (p - j) to the logits after softcap, with the
    masks, p as for window. Computed per tile, never as an (n_q, n_k) bias.

sinks
    Attention sinks (gpt-oss): one logit per query head, shape (Hq,), in
    every row's softmax denominator as a key of value zero: used as given
    (not scaled, not softcapped); the weights exclude it (rows sum below 1)
    and the log-sum-exp includes it.

return_weights, return_logits, return_lse
    return_weights=True: the softmax weights. return_logits: the logits
    before the softmax, 'scaled' (scale * q.k), 'softcapped' (then softcap;
    the same without one) or 'masked' (then plus the float mask and ALiBi's
    bias, -inf where a key is excluded: what the softmax takes).
    return_lse=True: each row's log-sum-exp, log(sum_j exp(masked logit)),
    -inf for a row with no allowed key. The lse costs nothing measurable;
    weights and logits are (n_q, n_k) per head by nature.

precision
    'f32' (default), 'bf16' or 'int8': with 'bf16' the float32 prefill
    rounds q, k, v and the softmax's weights to bfloat16 and sums their
    products in float32 (PyTorch's bf16 attention; relative error about
    3e-3 on N(0, 1) inputs). 'int8' quantizes each row of q, and of k less
    the mean of its head's keys, to int8 with one scale per row for q·kᵀ
    (SageAttention's recipe; about 9e-3), then p·v as 'bf16'. float32
    inputs only; the decode path (n_q <= 8 against long keys) stays
    float32, but for 'int8' over q8_0 keys, whose q·k takes q rounded to
    q8_0 and the keys' own codes (llama.cpp's vec_dot_q8_0_q8_0); the
    backward is float32, so tensors that require grad are a RuntimeError
    with either.

Compact k and v
    float16 k and v (both) are read as float16, in place; k and v as
    attn.QuantizedTensor (from attn.quantize or QuantizedTensor.from_buffer,
    one dtype for both: 'bf16', 'f16', 'q8_0' or 'q4_0') are read in place too. The
    kernels widen them to float32 tile by tile; q and the result are float32.

A query row with no allowed key (including n_k = 0) outputs zeros and zero
weights, never NaN.
)";

inline constexpr const char* kQuantize = R"(quantize(x, dtype, *, per=None) -> QuantizedTensor

x (any shape, converted to float32) stored as dtype: 'bf16' or 'f16' (round
to nearest even), or 'q8_0', GGUF's 8-bit blocks: each 32 consecutive values
of the last axis (whose length must be a multiple of 32) as an fp16 scale
d = max|x| / 127 and 32 int8 codes round(x / d), 34 bytes in all (ggml's
quantize_row_q8_0_ref); or 'q4_0', GGUF's 4-bit blocks: per 32 values an fp16
scale d = m / -8 (m the value of largest magnitude) and 32 4-bit codes
min(15, trunc(x / d + 8.5)), value d * (code - 8), 18 bytes in all (ggml's
quantize_row_q4_0_ref). q8_0 and q4_0 hold finite values only: NaN, inf, or a
block whose scale overflows fp16 (|x| > 65504 * 127, or * 8) is a ValueError.
Or 'int4', KIVI's 4-bit cache in GGUF's q4_1 blocks: per 32 values an fp16
scale d = (max - min) / 15 and minimum m = min, codes min(15, trunc((x - m) / d
+ 0.5)), value d * code + m, 20 bytes in all (ggml's quantize_row_q4_1_ref),
grouped as per says: per='channel' for keys (x of shape (..., n, d), a block
per channel and group of 32 tokens, so an outlier channel keeps its own
range), per='token' for values (along the last axis, a multiple of 32).
attn.attention is the one function that reads int4 keys and values.
)";

inline constexpr const char* kQuantizedTensor = R"(QuantizedTensor: keys or values stored as bf16, f16, q8_0, q4_0 or int4 (see
attn.quantize), read-only, for attn.attention(q, k, v). dtype is the name,
shape the logical shape (values, not blocks), per int4's grouping ('channel'
or 'token'; None for the others), nbytes the bytes stored (q8_0: 34 per 32
values, q4_0: 18, int4: 20); dequantize() returns the values as a float32 array,
and memoryview(t) its bytes (read-only; q8_0 and q4_0 in GGUF's block layout).
)";

inline constexpr const char* kFromBuffer = R"(QuantizedTensor.from_buffer(buffer, dtype, shape, *, per=None) -> QuantizedTensor

Wraps bytes another engine filled (a llama.cpp-style q8_0, q4_0 or fp16 cache, a
NumPy array, bytes, a memoryview) without copying them: buffer must be
C-contiguous, 2-byte aligned and hold exactly the bytes of dtype at shape
(q8_0, q4_0: shape[-1] a multiple of 32, blocks in GGUF's layout; int4 with
per as attn.quantize takes it). The buffer is kept alive, and must not change
while attention reads it.
)";

inline constexpr const char* kAttentionBackward = R"(attention_backward(q, k, v, dout, mask=None, *, causal=False, scale=None,
                   softcap=None, window=None, alibi_slopes=None, sinks=None,
                   out=None, lse=None)
    -> (dq, dk, dv), or (dq, dk, dv, dsinks) with sinks

The gradient of attention(q, k, v, mask, ...) with respect to q, k and v,
given dout = dL/dout of the output's shape (..., Hq, n_q, d_v). Takes the same
arguments and options as attention() and returns arrays of q's, k's and v's
shapes. With GQA, a key/value head's gradient sums over the query heads that
share it. A row with no allowed key contributes zero gradient (never NaN).
The mask gets no gradient; the sinks get dsinks (Hq,), summed over the batch
and the rows.

out and lse: what attention(..., return_lse=True) returned for the same
inputs, both or neither; given, the gradient is taken from them (P =
exp(logits - lse), and dout . out), so the forward does not run again.

float32 runs the fused kernel (FlashAttention-2's backward: the weights
recomputed tile by tile from the log-sum-exp, memory O(n), bitwise the same
for any thread count); float64 (any of q, k, v, dout float64) runs the
double-precision reference, as does float32 input holding a NaN or an
infinity.
)";

inline constexpr const char* kAttentionVarlen = R"(attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None,
                 softcap=None, window=None, alibi_slopes=None, sinks=None,
                 return_lse=False)

Attention over a packed batch of variable-length sequences, FlashAttention's
varlen layout (flash_attn_varlen_func): q (total_q, Hq, d), k (total_k, Hkv,
d), v (total_k, Hkv, d_v); cu_seqlens_q and cu_seqlens_k (batch + 1,) integer
offsets from 0 to total_q and total_k (non-decreasing: empty sequences are
allowed). Sequence b's queries q[cu_seqlens_q[b]:cu_seqlens_q[b+1]] attend
only its keys k[cu_seqlens_k[b]:cu_seqlens_k[b+1]]; every option is that of
attention(), applied within each sequence (causal=True: bottom-right within
the sequence). Returns out (total_q, Hq, d_v), or (out, lse) with lse
(Hq, total_q) when return_lse=True. No work is spent on padding.
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

inline constexpr const char* kRopeBackward = R"(rope_backward(dy, positions=None, *, base=10000.0, interleaved=False, rotary_dim=None,
              scaling=None, cos=None, sin=None, mrope_section=None)

The gradient of rope(x, positions, ...) for dy = dL/d rope(x): RoPE rotates
each pair of features (times the attention factor of the scaling), so this
is the rotation by the opposite angle, times the same factor. Takes rope()'s
options and returns an array of dy's shape.
)";

inline constexpr const char* kRope = R"(rope(x, positions=None, *, base=10000.0, interleaved=False, rotary_dim=None,
     scaling=None, cos=None, sin=None, mrope_section=None)

Rotary position embedding of x (..., n, d): the first rotary_dim features
(default all of d, or int(d * partial_rotary_factor) of the scaling; must be
even) are rotated in pairs, pair k by the angle pos * inv_freq[k], where
inv_freq = rope_frequencies(rotary_dim, base=base, scaling=scaling) (by
default base ** (-2k / rotary_dim)); the rest pass through unchanged.

interleaved=False pairs features (k, k + rotary_dim/2), the "rotate_half" form
of GPT-NeoX and LLaMA in Hugging Face; interleaved=True pairs (2k, 2k + 1), as
GPT-J and Meta's original LLaMA.

positions: None (0 .. n-1) or an integer array broadcastable to (..., n); any
integers, negative too (offsets for a KV cache). Angles are computed in double,
so position 1,000,000 is still accurate. Returns an array of x's shape.

scaling: Hugging Face's rope_scaling dict ({"rope_type": "llama3", "factor":
8.0, ...}; types default, linear, dynamic, yarn, longrope, llama3, with their
keys and defaults; see rope_frequencies). cos and sin are multiplied by its
attention factor. dynamic and longrope take max(positions) + 1 as the
sequence length.

cos, sin: explicit tables (ONNX RotaryEmbedding's cos_cache and sin_cache),
used as given instead of computed angles, in x's dtype: (max_position + 1,
rotary_dim / 2) indexed by positions (a position outside them is a
ValueError), or without positions (..., n, rotary_dim / 2) broadcast against
x's rows. rotary_dim defaults to twice their width; scaling must be None.

mrope_section: M-RoPE (Qwen2-VL), e.g. [16, 24, 24] summing to rotary_dim / 2:
positions then have shape (3, ..., n), and the pairs of section s turn by
position row s (both pairings).
)";

inline constexpr const char* kRopeFrequencies = R"(rope_frequencies(rotary_dim, *, base=10000.0, scaling=None, seq_len=None)
    -> (inv_freq, attention_factor)

RoPE's inverse frequencies, float64 of shape (rotary_dim / 2,), and the factor
that multiplies cos and sin: the pair Hugging Face's rope init functions
(ROPE_INIT_FUNCTIONS) return, computed in double. scaling is a rope_scaling
dict with "rope_type" (or the legacy "type"):
    default   base ** (-2k / rotary_dim)
    linear    factor: inv_freq / factor
    dynamic   factor, original_max_position_embeddings: the base grows as
              base * (factor * s / orig - (factor - 1)) ** (r / (r - 2)) for
              s = max(seq_len, orig)
    yarn      factor, original_max_position_embeddings; optional beta_fast
              (32), beta_slow (1), attention_factor (0.1 ln(factor) + 1, or
              the mscale / mscale_all_dim ratio), truncate (True)
    longrope  short_factor, long_factor (rotary_dim / 2 each; long when
              seq_len > orig), original_max_position_embeddings; optional
              factor (else max_position_embeddings / orig), attention_factor
              (sqrt(1 + ln(factor) / ln(orig)))
    llama3    factor, low_freq_factor, high_freq_factor,
              original_max_position_embeddings
max_position_embeddings stands in for an absent original_max_position_embeddings;
partial_rotary_factor and mrope_section are accepted (rope() and the layer use
them). An unknown rope_type, a missing or unknown key, or a bad value is a
ValueError naming it.
)";

inline constexpr const char* kAlibiSlopes = R"(alibi_slopes(num_heads, *, max_bias=8.0) -> float64 array (num_heads,)

ALiBi's slopes (BLOOM's build_alibi_tensor, ggml's max_bias): with c the
largest power of 2 <= num_heads, head h < c gets 2 ** (-max_bias * (h + 1) / c)
and the others the odd powers of 2 ** (-max_bias / (2c)): 1, 3, 5, ...
Pass them to attention(..., alibi_slopes=...).
)";

}  // namespace attn::python::docs

namespace attn::python::docs {

inline constexpr const char* kMhaBackward = R"(backward(dout, query, key=None, value=None, *, key_padding_mask=None,
         attn_mask=None, causal=False, window=None, softcap=None, scale=None)
         -> (dquery, dkey, dvalue, gradients)

The gradients of forward(query, key, value, ...) for dout = dL/dout (the
output's shape): of the inputs (dkey is None when key defaulted to query, dvalue
when value defaulted to key: their gradients are summed into the input they
defaulted to), and of every parameter, a dict with state_dict()'s names and
shapes. The forward is recomputed; no cache.
)";

inline constexpr const char* kKVCache = R"(KVCache: the keys and values a MultiHeadAttention has seen, for incremental
decoding. Make one with MultiHeadAttention.new_cache(); len(cache) is the number
of cached positions, seen the tokens appended (more than len(cache) once a
streaming cache has evicted some), dtype how they are stored, nbytes the bytes
they take.
An 'f32' cache takes the dtype of its first input (float32 or float64).
)";

inline constexpr const char* kNewCache = R"(new_cache(dtype='f32', *, sink_tokens=None, window=None, positions='original')
    -> KVCache: an empty key/value cache for forward(..., cache=c).

dtype: how keys and values are stored: 'f32' (the input's own float type),
'bf16', 'f16', 'q8_0' or 'q4_0' (GGUF's 8- and 4-bit blocks), or 'int4' (KIVI's:
keys per channel in groups of 32 tokens, values per token; not streaming), for
float32 input, head_dim a multiple of 32 for the last three. Tokens are
converted as they are appended, the chunk's own keys and values included, so
feeding a sequence chunk by chunk equals one causal forward over the same
stored keys and values, whatever the chunking (int4: its last group of keys,
kept in float32 until it fills, is quantized again over all its tokens at
each append, so a chunk sees that group as its tokens so far give it).

sink_tokens=S, window=W: StreamingLLM's cache, which keeps the stream's first
S tokens and its last W, so a stream of any length runs in bounded memory:
token t attends key j iff j <= t and (j < S or j > t - W). forward must then
be causal=True (no window, no masks, no ALiBi). positions='original' keeps
each key's rotation as stored (the same as a dense mask over the whole
history); 'cache' turns q and every cached key by its slot in the cache, as
StreamingLLM and Hugging Face's SinkCache do to run past the trained length
(dtype 'f32' only).
)";

inline constexpr const char* kStateDict = R"(state_dict() -> dict of float32 numpy arrays with PyTorch's names:
in_proj_weight (3E, E) (or q_proj_weight, k_proj_weight, v_proj_weight when kdim/vdim
differ from E or num_kv_heads is given), in_proj_bias, out_proj.weight, out_proj.bias,
and bias_k, bias_v with add_bias_kv.
)";

inline constexpr const char* kLoadStateDict = R"(load_state_dict(state_dict): load parameters by PyTorch's names. Every expected
name must be present with its shape, and no other (ValueError naming the key).
Accepts numpy arrays or anything numpy.asarray accepts (e.g. CPU torch tensors).
)";

inline constexpr const char* kSave = R"(save(path): write the parameters and configuration to a safetensors file.)";

inline constexpr const char* kLoad = R"(MultiHeadAttention.load(path): a layer from a safetensors file written by save()
or tools/export_torch_mha.py.)";

inline constexpr const char* kOnnxAttention = R"(attention(Q, K, V, attn_mask=None, past_key=None, past_value=None,
          nonpad_kv_seqlen=None, *, is_causal=0, kv_num_heads=0, q_num_heads=0,
          qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
          left_window_size=-1, right_window_size=-1, opset=25, qk_matmul_output=True)
    -> (Y, present_key, present_value, qk_matmul_output)

ONNX's Attention operator (opsets 23, 24 and 25: opset picks the version),
with its inputs, attributes, layouts and defaults, computed by attn.attention.

Q (B, Hq, S, D), K (B, Hkv, L, D), V (B, Hkv, L, Dv); or all 3-D (B, S, H*D)
with q_num_heads and kv_num_heads (Y is then 3-D too). float16 inputs are
computed in float32 and rounded back; the other inputs take Q's dtype.
attn_mask: boolean (True = takes part) or float (added), broadcastable to
(B, Hq, S, P + L); a last axis shorter than P + L is padded with False / -inf.
past_key, past_value (B, Hkv, P, D|Dv): present_* = past_* then K, V.
nonpad_kv_seqlen (B,): keys j >= nonpad_kv_seqlen[b] take no part.
is_causal=1: query i sees keys j <= i + offset, offset = P with a past,
nonpad_kv_seqlen[b] - S with nonpad_kv_seqlen (never with a past), else 0
(top-left). left_window_size, right_window_size (opset 25): query i sees keys
p - left .. p + right, p = offset + i (-1: that side open), with or without
is_causal. From opset 25, q_num_heads and kv_num_heads are for 3-D inputs only.
qk_matmul_output (B, Hq, S, P + L): 0 the scaled logits, 1 after softcap, 2
after the mask (-inf where excluded), 3 the softmax weights; softcap comes
before the mask. qk_matmul_output=False: not computed (None in its place), as
when a graph does not ask for that output; a decode step (S of a few queries
against a long cache) then runs the split-KV kernel. softmax_precision 11
(DOUBLE) computes in float64; the others in float32 (float64 for float64
inputs).
A row with no allowed key gives zeros (Y and mode 3), never NaN.
)";

inline constexpr const char* kOnnxRotaryEmbedding = R"(rotary_embedding(X, cos_cache, sin_cache, position_ids=None, *, interleaved=0,
                 num_heads=0, rotary_embedding_dim=0) -> Y

ONNX's RotaryEmbedding operator (opset 23), computed by attn.rope with
explicit tables. X (B, H, S, D), or 3-D (B, S, H*D) with num_heads.
cos_cache, sin_cache (max_position + 1, r/2) indexed by position_ids (B, S),
or without position_ids (B, S, r/2). rotary_embedding_dim r (0: D) features
of each head turn: pairs (i, i + r/2), or (2i, 2i+1) with interleaved=1; the
rest pass through. float16 is computed in float32 and rounded back.
)";

inline constexpr const char* kMergeState = R"(merge_state(v_a, s_a, v_b, s_b) -> (v, s)

Two partial attention results over disjoint sets of keys combined into the
result over their union, by their log-sum-exps (FlashInfer's merge_state):
s = log(e^s_a + e^s_b), v = e^(s_a - s) v_a + e^(s_b - s) v_b.
v_a, v_b (n, H, D); s_a, s_b (n, H), natural log (attention's lse; FlashInfer's
is base 2: multiply it by ln 2 first). A state with s = -inf (no key) changes
nothing; +inf takes all the weight, two +inf give NaN. float64 when every
input is, else float32; weights computed in double.
)";

inline constexpr const char* kMergeStateInPlace = R"(merge_state_in_place(v, s, v_other, s_other)

merge_state into v (n, H, D) and s (n, H) themselves: writable arrays of one
dtype, float32 or float64 (v_other and s_other are converted to it).
)";

inline constexpr const char* kMergeStates = R"(merge_states(vs, ss) -> (v, s)

num_states partial results per row and head merged in order (FlashInfer's
merge_states): vs (n, num_states, H, D), ss (n, num_states, H). Returns v
(n, H, D) and s (n, H); no state at all gives zeros and -inf.
)";

inline constexpr const char* kPagedKVCache = R"(PagedKVCache(num_pages, page_size, kv_heads, head_dim, *, value_head_dim=None,
             dtype="f32", layout="NHD")

One pool of num_pages pages of page_size tokens for many sequences (vLLM's
PagedAttention, FlashInfer's paged KV cache). dtype: f32, bf16, f16, q8_0, q4_0
(or float32, bfloat16, float16), or int4 (KIVI's: values per token, keys per
channel in groups of 32 tokens, page_size a multiple of 32; each sequence's
last partial group also kept in float32 and quantized again at each append);
layout NHD: pages (num_pages, page_size, kv_heads, D), or HND: (num_pages,
kv_heads, page_size, D).

add_sequence() -> id; append(seq_ids, k, v, append_indptr) writes the tokens
append_indptr[i]:append_indptr[i + 1] of k (nnz, kv_heads, head_dim) and v
(nnz, kv_heads, value_head_dim) to seq_ids[i]; fork(seq) -> id shares seq's
pages (a shared partial last page is copied when either appends);
truncate(seq, length) (int4: the group length ends inside is quantized again,
from its float32 keys or, inside a full group, from its int4 values); remove(seq).
length(seq), positions(seq) (0 .. length - 1), pages_in_use(), free_pages(),
nbytes (pages in use x the bytes of a page, and int4's float32 tails),
page_table(seq_ids) -> (kv_indptr, kv_indices,
kv_last_page_len) int32, pages() -> read-only views of the float32 pools.
An unknown id is a KeyError; too few free pages a RuntimeError naming the
pages needed and free. A refused call changes nothing. Any number of
threads may read at once; a writer (add_sequence, append, fork, truncate,
remove) overlapping any call raises RuntimeError. copy.deepcopy and pickle
give a cache that shares nothing.
)";

inline constexpr const char* kBatchAttention = R"(batch_attention(q, qo_indptr, kv, seq_ids=None, *, kv_indptr=None, kv_indices=None,
                kv_last_page_len=None, layout="NHD", causal=False, window=None,
                softcap=None, scale=None, alibi_slopes=None, sinks=None,
                custom_mask=None, packed_custom_mask=None, mask_indptr=None,
                return_lse=False, precision="f32")

Attention for a batch of requests of different lengths over paged keys and
values. q (nnz_q, Hq, head_dim); request r's queries are rows
qo_indptr[r]:qo_indptr[r + 1], its last qo_len positions (causal is
bottom-right; window (left, right) and ALiBi measure from i + kv_len -
qo_len). kv: a PagedKVCache with seq_ids (request r is seq_ids[r]), or a
pair (k_pages, v_pages) of pools (float32, float16, or attn.QuantizedTensor;
int4 in HND pages of a multiple of 32 tokens: attn.quantize(k_pages, "int4",
per="channel") groups each page's keys) with FlashInfer's int32 kv_indptr,
kv_indices and kv_last_page_len.
custom_mask: bool, True = may attend, the requests' (qo_len, kv_len) blocks
flattened and concatenated; or packed_custom_mask, np.packbits(block.ravel(),
bitorder="little") per request padded to whole bytes, with mask_indptr in
bytes. Returns out (nnz_q, Hq, value_head_dim), and with return_lse the
log-sum-exp (nnz_q, Hq) in natural log (FlashInfer's is base 2: lse / ln 2).
A row with no allowed key gives zeros and lse -inf (the sink with sinks).
precision is attention's: "int8" over q8_0 pages makes decode's q·k integer
(q rounded to q8_0, its codes against the keys', as llama.cpp's).
)";

inline constexpr const char* kBatchAttentionPlan = R"(BatchAttentionPlan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads,
                   num_kv_heads, head_dim, page_size, *, value_head_dim=None,
                   layout="NHD", causal=False, window=None, softcap=None, scale=None,
                   alibi_slopes=None, sinks=None, custom_mask=None,
                   packed_custom_mask=None, mask_indptr=None, precision="f32")

batch_attention's metadata validated once (FlashInfer's plan/run): every
layer of a step calls plan.run(q, kv, return_lse=False), kv a PagedKVCache
whose page_table gave the metadata or a pair (k_pages, v_pages). run is
bitwise batch_attention's.
)";

}  // namespace attn::python::docs
