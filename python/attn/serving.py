"""Serving on NumPy arrays or torch tensors: a paged KV cache, batch
attention over pages (FlashInfer's metadata), and partial attention results
merged by their log-sum-exps (FlashInfer's merge_state, merge_state_in_place
and merge_states). The computing is attn._core's."""
from . import _core
from ._interop import any_tensor, is_tensor, refuse_grad, result_dtype, to_array, to_tensor, _torch

from ._core import BatchAttentionPlan, PagedKVCache  # noqa: F401

__all__ = ["PagedKVCache", "BatchAttentionPlan", "batch_attention", "merge_state", "merge_state_in_place",
           "merge_states"]


def _arrays(values, names):
    for x, name in zip(values, names):
        refuse_grad(x, name, "merge_state has no backward")
    return [to_array(x, name) for x, name in zip(values, names)]


def _results(r, inputs):
    if not any_tensor(*inputs):
        return r
    dtype = result_dtype(*inputs)
    return tuple(to_tensor(a, dtype) for a in r)


def batch_attention(q, qo_indptr, kv, seq_ids=None, **options):
    refuse_grad(q, "q", "batch_attention has no backward")
    if isinstance(kv, (tuple, list)):
        kv = tuple(to_array(x, name, quantized=True) for x, name in zip(kv, ("k_pages", "v_pages")))
    arrays = {key: to_array(value, key) for key, value in options.items()
              if key in ("alibi_slopes", "sinks", "custom_mask", "packed_custom_mask", "mask_indptr", "kv_indptr",
                         "kv_indices", "kv_last_page_len")}
    r = _core.batch_attention(to_array(q, "q"), to_array(qo_indptr, "qo_indptr"), kv, seq_ids,
                              **{**options, **arrays})
    if not is_tensor(q):
        return r
    return tuple(to_tensor(a) for a in r) if isinstance(r, tuple) else to_tensor(r)


def merge_state(v_a, s_a, v_b, s_b):
    inputs = (v_a, s_a, v_b, s_b)
    return _results(_core.merge_state(*_arrays(inputs, ("v_a", "s_a", "v_b", "s_b"))), inputs)


def merge_states(vs, ss):
    return _results(_core.merge_states(*_arrays((vs, ss), ("vs", "ss"))), (vs, ss))


def merge_state_in_place(v, s, v_other, s_other):
    torch = _torch()
    for x, name in ((v, "v"), (s, "s")):
        # (to_array reads other dtypes through a float32 copy: the writes would be lost.)
        if is_tensor(x) and x.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"merge_state_in_place: {name} must be float32 or float64 (it is written in "
                            f"place), got dtype {x.dtype}")
    _core.merge_state_in_place(*_arrays((v, s, v_other, s_other), ("v", "s", "v_other", "s_other")))


batch_attention.__doc__ = _core.batch_attention.__doc__
merge_state.__doc__ = _core.merge_state.__doc__
merge_state_in_place.__doc__ = _core.merge_state_in_place.__doc__
merge_states.__doc__ = _core.merge_states.__doc__
