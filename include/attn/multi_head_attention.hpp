// The learnable multi-head attention layer the article announces: Q, K, V
// are the inputs times learned weights Wq, Wk, Wv; the heads' outputs are
// concatenated and multiplied by Wo. A drop-in for PyTorch's
// nn.MultiheadAttention: the same options, parameter names and shapes, the
// same mask conventions, plus GQA/MQA, RoPE (with Hugging Face's scalings),
// ALiBi, attention sinks, output gates and a KV cache.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/half.hpp"
#include "attn/kv_cache.hpp"
#include "attn/paged_kv_cache.hpp"
#include "attn/mask.hpp"
#include "attn/rope_scaling.hpp"
#include "attn/tensor.hpp"

namespace attn {

// An output gate (Gated Attention, Qiu et al. 2025; Qwen3-Next): each head's
// output is multiplied by sigmoid(x W_g^T + b_g), x the query input, before
// the output projection. Headwise: one gate per head (W_g (num_heads, E)),
// broadcast over the head's slice; elementwise: one per element (W_g (E, E)).
enum class Gate { None, Headwise, Elementwise };
std::string gate_name(Gate gate);                  // "none", "headwise", "elementwise"
Gate parse_gate(const std::string& name);          // ValueError naming the three

struct MultiHeadAttentionConfig {
  int64_t embed_dim = 0;
  int64_t num_heads = 1;
  std::optional<int64_t> num_kv_heads;  // default num_heads; must divide it
  std::optional<int64_t> kdim, vdim;    // key / value input widths, default embed_dim
  bool bias = true;
  bool rope = false;                    // rotate q and k per head after projection
  double rope_base = 10000.0;
  bool rope_interleaved = false;
  // Hugging Face's rope_scaling (attn/rope_scaling.hpp), with rope: the
  // length-dependent types take the cache length after appending as the
  // sequence length; a cached key keeps the rotation it was stored with.
  RopeScaling rope_scaling;
  // ALiBi: attention gets alibi_slopes(num_heads) (BLOOM's), a bias on the
  // logits by distance from each query's position (cache length + row).
  bool alibi = false;
  // Attention sinks (gpt-oss): a learnable logit per query head, the
  // parameter `sinks` (num_heads,), initialised to 0 (attention's sinks).
  bool sinks = false;
  // The output gate, the parameters gate_proj.weight (num_heads or E, E)
  // and, with bias, gate_proj.bias; initialised as nn.Linear's weight, with
  // a zero bias as the layer's other biases.
  Gate gate = Gate::None;
  // nn.MultiheadAttention's options of the same names. add_bias_kv appends a
  // learned key bias_k and value bias_v to every sequence's keys and values,
  // add_zero_attn then a key and a value of zeros; both keys take part in
  // every row. batch_first=false reads and writes (n, batch, width).
  // dropout is kept (and saved) but never applied: attn runs the layer as
  // PyTorch's eval() mode does.
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  bool batch_first = true;
  double dropout = 0.0;

  int64_t head_dim() const { return embed_dim / num_heads; }
  int64_t kv_heads() const { return num_kv_heads.value_or(num_heads); }
  int64_t key_dim() const { return kdim.value_or(embed_dim); }
  int64_t value_dim() const { return vdim.value_or(embed_dim); }
  // Keys appended to every sequence by add_bias_kv and add_zero_attn.
  int64_t extra_keys() const { return int64_t(add_bias_kv) + int64_t(add_zero_attn); }
  // The gate's width: num_heads (headwise), embed_dim (elementwise) or 0.
  int64_t gate_width() const {
    return gate == Gate::Headwise ? num_heads : gate == Gate::Elementwise ? embed_dim : 0;
  }
  // PyTorch packs q, k, v weights into in_proj_weight only in this case.
  bool packed() const {
    return !num_kv_heads && key_dim() == embed_dim && value_dim() == embed_dim;
  }
  // Throws ValueError naming the offending field.
  void validate() const;
  // The state_dict's names and shapes for this configuration, nothing
  // allocated (load checks a file's tensors against them before building).
  std::map<std::string, Shape> state_dict_shapes() const;
};

// The configuration as the safetensors __metadata__ that save() writes (all
// strings), and back: `source` (a path) names it in the ValueError for a
// key that is missing or not of its kind. The configuration is not
// validated here (MultiHeadAttention's constructor does).
std::map<std::string, std::string> to_metadata(const MultiHeadAttentionConfig& config);
MultiHeadAttentionConfig from_metadata(const std::string& source, const std::map<std::string, std::string>& metadata);

// Masks in nn.MultiheadAttention's convention (the opposite of attention()'s
// boolean convention, by history):
//   attn_mask: boolean true = NOT allowed, or float added to the logits;
//              (n_q, n_k), or per head (batch * num_heads, n_q, n_k).
//   key_padding_mask: (batch, n_k) ((n_k) unbatched); boolean true = padding
//              (ignored), or float added.
// A blocked or padded key takes no part at all. Both masks are read in place
// (broadcast views), never expanded to (batch, heads, n_q, n_k). They cover
// the keys given (n_k); the keys add_bias_kv and add_zero_attn append take
// part in every row, as PyTorch's zero-padded masks make them.
// `attention` holds every option of attention() (causal, window, softcap,
// scale), with the same meanings.
// What a forward keeps for its backward, when asked (save_for_backward): the
// projections, the attention's output and log-sum-exp, and the parameter set
// it used. It refers to the forward's inputs and masks, which must outlive it.
template <class T>
struct MhaSaved;

template <class T>
struct MhaForwardOptions {
  Mask attn_mask;
  Mask key_padding_mask;
  AttentionOptions attention;
  bool need_weights = false;
  bool average_attn_weights = true;  // weights (batch, n_q, n_k) instead of per head
  KVCache<T>* cache = nullptr;       // append this call's keys/values and attend all
  bool save_for_backward = false;    // fill MhaOutput::saved (no cache)
};

template <class T>
struct MhaOutput {
  Tensor<T> out;                     // query's shape: (batch, n_q, E), (n_q, batch, E), (n_q, E)
  std::optional<Tensor<T>> weights;  // (batch, [heads,] n_q, n_k + extra_keys) when need_weights
  std::shared_ptr<const MhaSaved<T>> saved;  // with save_for_backward, for backward(dout, saved)
};

template <class T>
struct MhaGradients {
  // dL/d inputs, the shapes of query, key and value. key (value) is empty
  // when it defaulted to query (key): its gradient is summed into that one.
  Tensor<T> query, key, value;
  // dL/d parameters, in the order of MultiHeadAttention::parameters().
  std::vector<Tensor<T>> parameters;
};

// Threads: forward and backward may run from many threads at once, each with
// its own KVCache, and load_state_dict may replace the parameters meanwhile:
// every call works on the parameter set current when it started (shared,
// never freed under it), so a load is wholly before or after each forward.
// In-place changes through parameters() (an optimizer's step) are not
// synchronized: make them while no forward or backward runs.
template <class T>
class MultiHeadAttention {
 public:
  // Weights Xavier-uniform, biases zero, out_proj.weight uniform(±1/sqrt(E)):
  // PyTorch's initialisation, drawn reproducibly from `seed`.
  explicit MultiHeadAttention(const MultiHeadAttentionConfig& config, uint64_t seed = 0);
  // A copy owns its own parameters (a deep copy). A moved-from layer may
  // only be assigned to or destroyed.
  MultiHeadAttention(const MultiHeadAttention& other);
  MultiHeadAttention(MultiHeadAttention&& other) noexcept;
  MultiHeadAttention& operator=(const MultiHeadAttention& other);
  MultiHeadAttention& operator=(MultiHeadAttention&& other) noexcept;

  const MultiHeadAttentionConfig& config() const { return config_; }

  // query (batch, n_q, E) ((n_q, batch, E) when !batch_first) or unbatched
  // (n_q, E); key (.., kdim) defaults to query, value (.., vdim) to key. With
  // RoPE, q and k are rotated at positions cache length + 0..n-1.
  MhaOutput<T> forward(TensorView<const T> query, TensorView<const T> key = {},
                       TensorView<const T> value = {},
                       const MhaForwardOptions<T>& options = {}) const;

  // Serving many sequences at once (docs/serving.md): x (total, E) packs the
  // new tokens of len(seq_ids) sequences of `cache`, sequence i's rows
  // cu_seqlens[i] .. cu_seqlens[i + 1]. Each chunk is projected, rotated
  // (RoPE) at its sequence's positions from its length in the cache on,
  // appended to that sequence, and attends all it holds (batch_attention:
  // causal bottom-right; windows and ALiBi from each token's position; the
  // layer's sinks). Returns (total, E). For self-attention layers (no kdim,
  // vdim, add_bias_kv or add_zero_attn) in float32; attention.causal is
  // None or BottomRight. A call that fails its checks appends nothing.
  Tensor<T> forward(TensorView<const T> x, PagedKVCache& cache, const std::vector<int64_t>& seq_ids,
                    TensorView<const int64_t> cu_seqlens, const AttentionOptions& attention = {}) const;

  // The backward of forward(query, key, value, options) for dout = dL/dout
  // (the output's shape): the gradients of the inputs and of every
  // parameter. It recomputes the forward (nothing is kept between calls);
  // need_weights is ignored and a KV cache is refused.
  MhaGradients<T> backward(TensorView<const T> dout, TensorView<const T> query,
                           TensorView<const T> key = {}, TensorView<const T> value = {},
                           const MhaForwardOptions<T>& options = {}) const;
  // The same from what a forward of this layer saved (save_for_backward),
  // without recomputing it. The parameter set is the forward's: a later
  // load_state_dict does not change it; in-place changes through
  // parameters() do, so make them after the backward (as a training step).
  MhaGradients<T> backward(TensorView<const T> dout, const MhaSaved<T>& saved) const;

  // The learnable tensors: Wq, Wk, Wv, Wo, then (with bias) bq, bk, bv, bo,
  // then (with add_bias_kv) bias_k, bias_v, then (with sinks) sinks, then
  // (with a gate) the gate's weight and (with bias) its bias; matrices
  // (out, in) as nn.Linear. For optimizers and gradient checks; the
  // pointers stay valid until the next load_state_dict or assignment.
  std::vector<Tensor<T>*> parameters();
  std::vector<const Tensor<T>*> parameters() const;

  // An empty cache for forward(): tokens stored as T, or (float32 layers)
  // bf16, f16, q8_0 or q4_0 (head_dim a multiple of 32 for these two); with
  // `streaming`, StreamingLLM's (attn/kv_cache.hpp): forward then attends
  // causally (causal = BottomRight, no window, no masks, no ALiBi) by the
  // streaming rule, in stream positions, and evicts after each call. With
  // positions Cache, RoPE turns q and every cached key by its cache slot.
  KVCache<T> new_cache(KVDtype dtype = KVDtype::F32, const StreamingCache& streaming = {}) const {
    return KVCache<T>(dtype, streaming);
  }

  // PyTorch's names: in_proj_weight (3E, E) / q_proj_weight, k_proj_weight,
  // v_proj_weight; in_proj_bias; out_proj.weight; out_proj.bias; bias_k,
  // bias_v (1, 1, dkv); and attn's sinks (num_heads,), gate_proj.weight
  // and gate_proj.bias.
  std::map<std::string, Tensor<T>> state_dict() const;
  // backward()'s parameter gradients under the same names and shapes.
  std::map<std::string, Tensor<T>> gradient_dict(const MhaGradients<T>& gradients) const;
  // Every expected name must be present with its shape, and no other. The
  // new set replaces the old one atomically (see "Threads" above).
  void load_state_dict(const std::map<std::string, Tensor<T>>& state);

  // safetensors with the configuration in __metadata__.
  void save(const std::string& path, StorageDtype dtype = StorageDtype::F32) const;
  static MultiHeadAttention load(const std::string& path);

 private:
  struct Parameters {
    Tensor<T> wq, wk, wv, wo;  // (out, in), as nn.Linear
    Tensor<T> bq, bk, bv, bo;  // empty when !bias
    Tensor<T> bias_k, bias_v;  // (1, 1, dkv); empty when !add_bias_kv
    Tensor<T> sinks;           // (num_heads,); empty when !sinks
    Tensor<T> wg, bg;          // (gate_width, E), (gate_width,); empty without a gate (or bias)
    std::vector<const Tensor<T>*> list(const MultiHeadAttentionConfig& c) const;  // parameters()' order
  };
  // A parameter set (or its gradients) under PyTorch's names.
  std::map<std::string, Tensor<T>> named(const Parameters& w) const;
  friend struct MhaSaved<T>;
  struct Activations;  // what forward computes before the output projection
  Activations forward_activations(const Parameters& w, TensorView<const T> query,
                                  TensorView<const T> key, TensorView<const T> value,
                                  const MhaForwardOptions<T>& options) const;
  bool seq_first(const Activations& a) const;  // batched with batch_first=false
  TensorView<T> ctx_heads(Tensor<T>& t, const Activations& a) const;
  TensorView<const T> ctx_heads(const Tensor<T>& t, const Activations& a) const;
  MhaGradients<T> gradients(const Parameters& w, const Activations& a, TensorView<const T> dout) const;
  // The current parameter set, kept alive for the caller.
  std::shared_ptr<const Parameters> snapshot() const;

  MultiHeadAttentionConfig config_;
  // This layer's identity for saved forwards: new at construction and at
  // each assignment (a saved state holds the config and shapes of its time).
  uint64_t id_;
  mutable std::mutex mutex_;            // guards the pointer params_, not the tensors
  std::shared_ptr<Parameters> params_;  // shared with the calls running on it
};

extern template class MultiHeadAttention<float>;
extern template class MultiHeadAttention<double>;

}  // namespace attn
