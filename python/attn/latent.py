"""MultiHeadLatentAttention: DeepSeek-V2/V3's attention block with Hugging
Face's configuration names and state_dict keys, over attn's latent cache."""
import json

from . import _core
from ._interop import is_tensor, scaling_json, to_array, to_tensor

LatentCache = _core.LatentCache


def _json_value(v):
    """NumPy and torch scalars and arrays in a config, as JSON numbers and lists."""
    if hasattr(v, "tolist"):
        return v.tolist()
    raise TypeError(f"from_config: {v!r} is not a value a config.json can hold")


class MultiHeadLatentAttention:
    """MultiHeadLatentAttention(hidden_size, num_attention_heads, *, q_lora_rank, kv_lora_rank,
        qk_nope_head_dim, qk_rope_head_dim, v_head_dim, rope_theta=10000.0, rope_scaling=None,
        rope_interleave=True, attention_bias=False, rms_norm_eps=1e-6, seed=0)

Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) as Hugging Face's
DeepseekV3Attention computes it: q through q_a_proj, RMSNorm and q_b_proj (or
q_proj when q_lora_rank is None); one latent per token from
kv_a_proj_with_mqa, split into c (RMSNorm'd, kv_lora_rank) and k_pe; RoPE on
the rope parts (YaRN's mscale and mscale_all_dim included); per head keys
[c W_UKᵀ | k_pe] and values c W_UVᵀ from kv_b_proj; causal attention with
softmax_scale; o_proj. state_dict() has Hugging Face's keys. The parameters
are float32.

m(x, positions=None, cache=None, form="auto"): x (batch, n, hidden_size) or
(n, hidden_size); positions (n,) or (batch, n) for RoPE (default: the cache
length + 0..n-1). A cache from new_cache(dtype) keeps the latent rows; form
"absorbed" attends them as MQA (W_UK folded into the query, W_UV into the
output), "expanded" per head as Hugging Face does; "auto" expands a prompt
(an empty cache) and absorbs the decode.

m(x, cache=paged, seq_ids=ids, cu_seqlens=cu): serving over a paged latent
cache from new_paged_cache(num_pages, page_size, dtype): x (total,
hidden_size) packs many sequences' new tokens (sequence ids[i]'s rows
cu[i]:cu[i + 1]), each at its sequence's next positions, appended, and
attended in the absorbed form by one batch_attention over the pages. See
docs/semantics.md.
"""

    def __init__(self, hidden_size, num_attention_heads, *, q_lora_rank, kv_lora_rank, qk_nope_head_dim,
                 qk_rope_head_dim, v_head_dim, rope_theta=10000.0, rope_scaling=None, rope_interleave=True,
                 attention_bias=False, rms_norm_eps=1e-6, seed=0):
        self._layer = _core.MultiHeadLatentAttention(
            hidden_size, num_attention_heads, q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank,
            qk_nope_head_dim=qk_nope_head_dim, qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim,
            rope_theta=rope_theta, rope_scaling=scaling_json(rope_scaling), rope_interleave=rope_interleave,
            attention_bias=attention_bias, rms_norm_eps=rms_norm_eps, seed=seed)

    @classmethod
    def from_config(cls, config):
        """from_config(config): the layer of a Hugging Face config (a dict, or an
        object with to_dict()): DeepseekV3Config's names; other keys are ignored.
        rope_scaling may name its type "type" or "rope_type"; transformers v5's
        rope_parameters (with rope_theta inside) is read too. YaRN's factor is
        rope_scaling["factor"] when given, else max_position_embeddings /
        original_max_position_embeddings."""
        if hasattr(config, "to_dict"):
            config = config.to_dict()
        if not isinstance(config, dict):
            raise TypeError(f"from_config: expected a config dict, got {type(config).__name__}")
        self = cls.__new__(cls)
        self._layer = _core.MultiHeadLatentAttention.from_config_json(json.dumps(config, default=_json_value))
        return self

    def forward(self, x, positions=None, cache=None, form="auto", *, seq_ids=None, cu_seqlens=None):
        out = self._layer.forward(to_array(x, "x"), positions=positions, cache=cache, form=form, seq_ids=seq_ids,
                                  cu_seqlens=cu_seqlens)
        return to_tensor(out) if is_tensor(x) else out

    __call__ = forward

    def new_cache(self, dtype="f32"):
        """new_cache(dtype="f32"): an empty latent cache storing 'f32', 'bf16',
        'f16' or 'q8_0' rows (q8_0: the latent in q8_0 blocks, k_pe in bfloat16).
        cache.nbytes counts the tokens held; cache.bytes_per_token one token."""
        return self._layer.new_cache(dtype)

    def new_paged_cache(self, num_pages, page_size, dtype="f32"):
        """new_paged_cache(num_pages, page_size, dtype="f32"): an empty
        PagedKVCache.latent of this layer's rows (kv_lora_rank + qk_rope_head_dim,
        one KV head) for serving many sequences: see PagedKVCache.latent."""
        return self._layer.new_paged_cache(num_pages, page_size, dtype)

    def state_dict(self):
        return self._layer.state_dict()

    def load_state_dict(self, state_dict):
        """Every key of state_dict() with its shape and no other (NumPy arrays or torch tensors)."""
        self._layer.load_state_dict({k: to_array(v, f"state_dict[{k!r}]") for k, v in state_dict.items()})

    def load_safetensors(self, path, prefix=""):
        """The layer's tensors from a safetensors file, under `prefix` (a
        checkpoint's "model.layers.0.self_attn.")."""
        self._layer.load_safetensors(path, prefix)

    def __repr__(self):
        names = ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                 "qk_rope_head_dim", "v_head_dim")
        return "attn.MultiHeadLatentAttention(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in names) + ")"


for _name in ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim", "rope_theta", "rope_interleave", "attention_bias", "softmax_scale"):
    setattr(MultiHeadLatentAttention, _name, property(lambda self, n=_name: getattr(self._layer, n)))
MultiHeadLatentAttention.rope_scaling = property(
    lambda self: None if self._layer.rope_scaling is None else json.loads(self._layer.rope_scaling),
    doc="The rope_scaling dict (rope_type and every key set), or None.")
del _name
