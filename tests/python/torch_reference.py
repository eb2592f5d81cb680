"""docs/semantics.md "Attention" from plain torch ops: the reference that
test_torch.py (forward) and test_backward.py (through torch.autograd) share."""
import math

import numpy as np
import torch


def torch_attention(q, k, v, mask=None, causal=False, scale=None, softcap=None, window=None):
    """q, k, v: arrays or (differentiable) float64 tensors. Returns (out, weights) as
    tensors. Rows with no allowed key give zero weights (attn's rule; torch's softmax
    would give NaN there, so it is kept off them)."""
    q, k, v = (t if torch.is_tensor(t) else torch.from_numpy(np.asarray(t, dtype=np.float64))
               for t in (q, k, v))
    if q.dim() >= 3 and q.shape[-3] != k.shape[-3]:  # GQA: repeat each kv head
        rep = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = s.shape[-2:]
    ones = torch.ones(n_q, n_k, dtype=torch.bool)
    allowed = ones.clone()
    if causal is True or causal == "bottom_right":
        allowed &= ones.tril(diagonal=n_k - n_q)
    elif causal == "top_left":
        allowed &= ones.tril(diagonal=0)
    if window is not None:
        left, right = window
        if left >= 0:
            allowed &= ones.triu(diagonal=n_k - n_q - left)
        if right >= 0:
            allowed &= ones.tril(diagonal=n_k - n_q + right)
    if mask is not None:
        m = torch.from_numpy(np.asarray(mask))
        if m.dtype == torch.bool:
            allowed = allowed & m
        else:
            s = s + m.double()
    allowed = allowed.expand(s.shape)
    s = s.masked_fill(~allowed, -math.inf)
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)
    w = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return w @ v, w
