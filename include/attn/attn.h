/* attn's C API: attention, positional encodings and the MultiHeadAttention
   layer for C99 and any language's foreign-function interface. A thin layer
   over the C++ API (attn/attn.hpp): the same checks, semantics and error
   messages (docs/semantics.md "The C API").

   Every function that can fail returns an attn_status (as int); no exception
   or crash crosses it. On failure attn_last_error() says why, naming the
   argument. Outputs are caller-allocated with the exact output shape. Only
   this C ABI is stable (the C++ ABI is not). */
#ifndef ATTN_ATTN_H
#define ATTN_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "attn/version.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ATTN_OK = 0,
  ATTN_ERROR_INVALID_ARGUMENT = 1, /* a NULL, a shape, a value or option refused */
  ATTN_ERROR_OUT_OF_MEMORY = 2,
  ATTN_ERROR_IO = 3,          /* a file could not be opened or read */
  ATTN_ERROR_UNSUPPORTED = 4, /* a dtype (combination) the function does not take */
  ATTN_ERROR_RUNTIME = 5      /* anything else, e.g. threads could not start */
} attn_status;

typedef enum {
  ATTN_F32 = 0,  /* float */
  ATTN_F64 = 1,  /* double */
  ATTN_BF16 = 2, /* bfloat16 bits in a uint16_t */
  ATTN_F16 = 3,  /* IEEE half bits in a uint16_t */
  ATTN_BOOL = 4, /* C99 _Bool (one byte holding 0 or 1) */
  ATTN_Q8_0 = 5, /* GGUF's q8_0 blocks: per 32 values of the last axis, an fp16
                    scale d then 32 int8 codes (34 bytes; value = d * code).
                    shape is the logical shape (its last axis a multiple of 32),
                    data the blocks, strides count blocks (NULL: C-contiguous) */
  ATTN_Q4_0 = 6, /* GGUF's q4_0 blocks, as Q8_0's: an fp16 scale d then 16 bytes,
                    byte j holding code j in its low 4 bits and code j + 16 in
                    its high 4 (18 bytes; value = d * (code - 8)) */
  ATTN_INT4 = 7  /* KIVI's int4 in GGUF's q4_1 blocks: an fp16 scale d, an fp16
                    minimum m, then q4_0's 16 bytes of codes (20 bytes; value
                    = d * code + m). shape is the logical shape; attn_attention's
                    k holds a block per channel and group of 32 keys, its data
                    (..., ceil(n / 32), d) blocks, and v a block per 32 values
                    of a row, as Q4_0's (the last axis a multiple of 32);
                    strides count blocks */
} attn_dtype;

/* A strided view of caller memory; never owned by attn. Ranks 0..16. */
typedef struct {
  void* data;             /* may be NULL only when the view has no element */
  attn_dtype dtype;
  int32_t rank;
  const int64_t* shape;   /* rank dimensions; may be NULL at rank 0 */
  const int64_t* strides; /* in elements (may be 0 or negative); NULL = C-contiguous;
                             reaching 2^57 bytes or more from data is an error */
} attn_tensor;

/* Attention options (attn::AttentionOptions). Set with attn_options_init,
   then change fields: size lets the struct grow without breaking the ABI
   (fields past a caller's size take their defaults). */
typedef struct {
  size_t size;          /* sizeof(attn_options) */
  int32_t causal;       /* 0 none, 1 bottom-right, 2 top-left, 3 offset (causal_offset) */
  double scale;         /* 0: 1/sqrt(d) */
  double softcap;       /* 0: off; > 0: logits = softcap * tanh(logits / softcap) */
  int64_t window_left;  /* -1: unbounded */
  int64_t window_right; /* -1: unbounded */
  /* ALiBi: one slope per query head, F64 or F32 of shape (Hq); NULL: none.
     Adds -slope[h] * (p - j) to the logits, p = i + (n_k - n_q), or
     i + causal_offset with causal 3. */
  const attn_tensor* alibi_slopes;
  /* causal 3: key j is allowed for query i iff j <= i + causal_offset
     (attn::Causal::offset; |causal_offset| <= 2^62). Windows and ALiBi then
     measure from p = i + causal_offset. */
  int64_t causal_offset;
  /* Attention sinks (gpt-oss): one logit per query head, F64 or F32 of shape
     (Hq), in every row's softmax denominator as a key of value zero; NULL:
     none. */
  const attn_tensor* sinks;
  /* The prefill's products (attn::Precision): 0 float32; 1 bf16, q, k, v and
     the softmax's weights rounded to bfloat16 and their products summed in
     float32, on the CPU's bf16 unit where it has one that outruns its
     float32 FMAs; 2 int8, each row of q and of k less the mean of its
     head's keys quantized to int8 with one scale per row for q·kᵀ, then
     as bf16 (F32 q only; decode stays float32, but for int8 over Q8_0 keys:
     q rounded to Q8_0, its codes against the keys'). */
  int32_t precision;
} attn_options;

/* The defaults: no causal mask, scale 1/sqrt(d), no softcap, no window, no ALiBi. */
void attn_options_init(attn_options* options);

/* softmax(q kᵀ · scale + mask) v into out (..., Hq, n_q, d_v), as
   attn::attention: q (..., Hq, n_q, d), k (..., Hkv, n_k, d), v (..., Hkv,
   n_k, d_v). q and out F32 with k, v F32, BF16, F16, Q8_0 or Q4_0 (read in place,
   widened as the kernels go); or all F64. mask: NULL
   for none; BOOL (1 = may attend) or F32/F64 (added to the logits),
   broadcasting to (..., Hq, n_q, n_k). options: NULL for the defaults. */
int attn_attention(const attn_tensor* q, const attn_tensor* k, const attn_tensor* v,
                   const attn_tensor* mask, const attn_options* options, attn_tensor* out);

/* attn_attention with its extras (attn::AttentionExtras), each NULL when not
   wanted, of q's dtype: weights and logits (..., Hq, n_q, n_k), the logits at
   logits_stage 0 (scaled), 1 (softcapped) or 2 (masked: -inf where a key is
   excluded), and lse (..., Hq, n_q), each row's log-sum-exp. */
int attn_attention_extras(const attn_tensor* q, const attn_tensor* k, const attn_tensor* v,
                          const attn_tensor* mask, const attn_options* options, attn_tensor* out,
                          attn_tensor* weights, attn_tensor* logits, int32_t logits_stage,
                          attn_tensor* lse);

/* The sinusoidal table (n, d) into out (F32 or F64, shape (n, d)). */
int attn_sinusoidal_encoding(int64_t n, int64_t d, double base, attn_tensor* out);

/* RoPE of x (..., n, d) into out (same shape and dtype, F32 or F64; may be
   x itself). positions: n integers (row t at positions[t]), NULL for
   0..n-1. interleaved: 0 pairs (i, i + r/2), 1 pairs (2i, 2i+1). rotary_dim:
   rotate the first r features, 0 for all. */
int attn_rope(const attn_tensor* x, const int64_t* positions, double base, int32_t interleaved,
              int64_t rotary_dim, attn_tensor* out);

/* RoPE's frequencies (attn::rope_frequencies): rotary_dim / 2 doubles into
   inv_freq and the factor cos and sin are multiplied by into
   attention_factor, for base and rope_scaling, a Hugging Face rope_scaling
   dict as JSON text ("{\"rope_type\": \"llama3\", ...}"; NULL: none).
   seq_len: the sequence length the dynamic and longrope types depend on;
   negative: the original context. */
int attn_rope_frequencies(int64_t rotary_dim, double base, const char* rope_scaling, int64_t seq_len,
                          double* inv_freq, double* attention_factor);

/* ALiBi's slopes for num_heads heads into slopes (num_heads doubles):
   BLOOM's for max_bias 8 (attn::alibi_slopes). */
int attn_alibi_slopes(int64_t num_heads, double max_bias, double* slopes);

/* attn::MultiHeadAttention<float>, and its KV cache. */
typedef struct attn_mha attn_mha;
typedef struct attn_cache attn_cache;

/* Loads a layer saved by MultiHeadAttention::save (or `attn mha`): a
   safetensors file whose __metadata__ holds the configuration. */
int attn_mha_load(const char* safetensors_path, attn_mha** layer);

/* Self-attention forward of x (batch, n, E) ((n, batch, E) for a layer saved
   with batch_first=false) or (n, E), F32, into out (the shape of x). cache: NULL, or one from attn_cache_new that this call
   appends to and attends over. options: NULL for the defaults. Calls with
   different caches may run at once from many threads. */
int attn_mha_forward(attn_mha* layer, const attn_tensor* x, attn_cache* cache,
                     const attn_options* options, attn_tensor* out);

/* An empty KV cache for layer, storing float32 keys and values. */
int attn_cache_new(const attn_mha* layer, attn_cache** cache);
/* The same, storing them as dtype: F32, BF16, F16, Q8_0, Q4_0 or INT4 (the
   layer's head_dim a multiple of 32 for the last three), converted as tokens
   are appended. */
int attn_cache_new_dtype(const attn_mha* layer, attn_dtype dtype, attn_cache** cache);
/* The bytes the cached tokens' keys and values take. */
int attn_cache_bytes(const attn_cache* cache, int64_t* bytes);
/* Free what the functions above made; NULL does nothing. */
void attn_cache_free(attn_cache* cache);
void attn_mha_free(attn_mha* layer);

/* attn::MultiHeadLatentAttention (DeepSeek-V2/V3's multi-head latent
   attention), and its latent cache. */
typedef struct attn_mla attn_mla;
typedef struct attn_latent_cache attn_latent_cache;

/* The layer of a Hugging Face config (config.json's text: DeepseekV3Config's
   names, others ignored) with its tensors under Hugging Face's keys from a
   safetensors file, below prefix (NULL or "": none; a checkpoint's
   "model.layers.0.self_attn."). */
int attn_mla_load(const char* config_json, const char* safetensors_path, const char* prefix, attn_mla** layer);
/* Causal forward of x (batch, n, hidden_size) or (n, hidden_size), F32, into
   out (x's shape). cache: NULL, or one from attn_latent_cache_new that this
   call appends to and attends over (the absorbed form after a prompt). */
int attn_mla_forward(attn_mla* layer, const attn_tensor* x, attn_latent_cache* cache, attn_tensor* out);
/* An empty latent cache for layer storing dtype: F32, BF16, F16, or Q8_0
   (the latent in q8_0 blocks, k_pe in bfloat16). */
int attn_latent_cache_new(const attn_mla* layer, attn_dtype dtype, attn_latent_cache** cache);
/* The bytes the cached tokens take. */
int attn_latent_cache_bytes(const attn_latent_cache* cache, int64_t* bytes);
void attn_latent_cache_free(attn_latent_cache* cache);
void attn_mla_free(attn_mla* layer);

/* Serving many sequences (attn::PagedKVCache, attn::BatchAttentionPlan;
   docs/serving.md): one pool of pages for many sequences, and attention for
   a batch of requests over pages with FlashInfer's int32 metadata. An
   unknown sequence id is ATTN_ERROR_INVALID_ARGUMENT; too few free pages
   ATTN_ERROR_RUNTIME, naming the pages needed and free. A refused call
   changes nothing. */
typedef struct attn_paged_cache attn_paged_cache;
typedef struct attn_batch_plan attn_batch_plan;

/* num_pages pages of page_size tokens, each kv_heads x head_dim for keys and
   kv_heads x value_head_dim (0: head_dim) for values, stored as dtype (F32,
   BF16, F16, Q8_0, Q4_0, or INT4 with page_size a multiple of 32: keys per
   channel in groups of 32 tokens, docs/semantics.md); layout 0: NHD pages
   (page_size, kv_heads, D), 1: HND (kv_heads, page_size, D). */
int attn_paged_cache_new(int64_t num_pages, int64_t page_size, int64_t kv_heads, int64_t head_dim,
                         int64_t value_head_dim, attn_dtype dtype, int32_t layout, attn_paged_cache** cache);
int attn_paged_cache_add_sequence(attn_paged_cache* cache, int64_t* seq);
int attn_paged_cache_remove(attn_paged_cache* cache, int64_t seq);
/* A new sequence sharing seq's pages (the partial last one copied on write). */
int attn_paged_cache_fork(attn_paged_cache* cache, int64_t seq, int64_t* child);
int attn_paged_cache_truncate(attn_paged_cache* cache, int64_t seq, int64_t length);
/* Appends to seq_ids[i] the tokens append_indptr[i] .. append_indptr[i + 1]
   of k (nnz, kv_heads, head_dim) and v (nnz, kv_heads, value_head_dim), F32
   (a latent cache: its rows as k, v NULL); append_indptr has num_seqs + 1
   entries. */
int attn_paged_cache_append(attn_paged_cache* cache, const int64_t* seq_ids, int64_t num_seqs,
                            const attn_tensor* k, const attn_tensor* v, const int64_t* append_indptr);
int attn_paged_cache_length(const attn_paged_cache* cache, int64_t seq, int64_t* length);
int attn_paged_cache_pages_in_use(const attn_paged_cache* cache, int64_t* pages);
/* FlashInfer's page table of num_seqs sequences: kv_indptr (num_seqs + 1),
   kv_last_page_len (num_seqs), and kv_indices (capacity entries; *count
   gets how many it needs, ATTN_ERROR_INVALID_ARGUMENT when over capacity,
   nothing then written). */
int attn_paged_cache_page_table(const attn_paged_cache* cache, const int64_t* seq_ids, int64_t num_seqs,
                                int32_t* kv_indptr, int32_t* kv_indices, int64_t capacity,
                                int32_t* kv_last_page_len, int64_t* count);
void attn_paged_cache_free(attn_paged_cache* cache);

/* MLA over pages: an empty latent paged cache of layer's rows (kv_lora_rank
   + qk_rope_head_dim, one KV head; the values are the rows' first
   kv_lora_rank columns, read in place), storing dtype (Q8_0: c in q8_0
   blocks, k_pe in bfloat16). attn_paged_cache_append takes its rows as k,
   (nnz, 1, kv_lora_rank + qk_rope_head_dim), and NULL for v. */
int attn_mla_paged_cache_new(const attn_mla* layer, int64_t num_pages, int64_t page_size, attn_dtype dtype,
                             attn_paged_cache** cache);
/* Serving: x (total, hidden_size) F32 packs num_seqs sequences' new tokens,
   sequence seq_ids[i]'s rows cu_seqlens[i] .. cu_seqlens[i + 1]
   (num_seqs + 1 entries); each at its sequence's next positions, appended,
   and attended causally in the absorbed form, into out (total, hidden_size) F32. */
int attn_mla_forward_paged(attn_mla* layer, const attn_tensor* x, attn_paged_cache* cache, const int64_t* seq_ids,
                           int64_t num_seqs, const int64_t* cu_seqlens, attn_tensor* out);

/* A batch's metadata validated once (attn::BatchAttentionPlan): batch
   requests, request r's queries rows qo_indptr[r] .. qo_indptr[r + 1] of q,
   its keys the pages kv_indices[kv_indptr[r] .. kv_indptr[r + 1]] with
   kv_last_page_len[r] tokens in the last (the arrays batch + 1, batch + 1,
   kv_indptr[batch] and batch entries long). options: causal 0 (none) or 1
   (bottom-right per request), window, softcap, scale, alibi_slopes, sinks,
   precision; NULL for the defaults. custom_mask: NULL, or BOOL 1-D, every request's
   (qo_len, kv_len) block concatenated (1 = may attend). layout as above;
   value_head_dim 0: head_dim. */
int attn_batch_plan_new(const int32_t* qo_indptr, const int32_t* kv_indptr, const int32_t* kv_indices,
                        const int32_t* kv_last_page_len, int64_t batch, int64_t num_qo_heads,
                        int64_t num_kv_heads, int64_t head_dim, int64_t value_head_dim, int64_t page_size,
                        int32_t layout, const attn_options* options, const attn_tensor* custom_mask,
                        attn_batch_plan** plan);
/* q (nnz_q, num_qo_heads, head_dim) F32 over pools k_pages and v_pages
   (num_pages, ...) by layout, F32, BF16, F16, Q8_0, Q4_0 or INT4 (k_pages' shape
   the logical pool's, page_size a multiple of 32, its pages' keys stored a
   block per channel and group of 32), into out (nnz_q,
   num_qo_heads, value_head_dim) F32 and lse (nnz_q, num_qo_heads) F32, the
   natural log (NULL: not wanted). */
int attn_batch_plan_run(const attn_batch_plan* plan, const attn_tensor* q, const attn_tensor* k_pages,
                        const attn_tensor* v_pages, attn_tensor* out, attn_tensor* lse);
/* The same over a cache's pools (the plan made from its page table). */
int attn_batch_plan_run_cache(const attn_batch_plan* plan, const attn_tensor* q, const attn_paged_cache* cache,
                              attn_tensor* out, attn_tensor* lse);
void attn_batch_plan_free(attn_batch_plan* plan);
/* One call over a cache: request r is sequence seq_ids[r]. */
int attn_batch_attention(const attn_tensor* q, const int32_t* qo_indptr, int64_t batch,
                         const attn_paged_cache* cache, const int64_t* seq_ids, const attn_options* options,
                         const attn_tensor* custom_mask, attn_tensor* out, attn_tensor* lse);

/* The number of threads of the kernels: 1 <= n <= the library's maximum. */
int attn_set_num_threads(int32_t n);

/* ATTN_VERSION of the library linked ("MAJOR.MINOR.PATCH"). */
const char* attn_version(void);

/* The message of the calling thread's last call that returned a status: ""
   when it returned ATTN_OK; the C++ exception's text otherwise. Valid until
   that thread's next call. */
const char* attn_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_ATTN_H */
