"""NumPy arrays and torch tensors at the package's edge.

Every public function takes NumPy arrays or CPU torch tensors and returns the
kind it was given. torch is never imported here: a torch tensor can only be
passed once the caller has imported torch, so `sys.modules` is where it is
found. Tensors are read through `Tensor.numpy()` (no copy, any strides);
results are the library's fresh arrays, wrapped by `torch.from_numpy`, so they
share no memory with any input.

With autograd on and an input that requires grad, the result carries a
`grad_fn`: `differentiable` runs the forward and backward that the caller
gives inside a `torch.autograd.Function`. A gradient the library does not
compute (of a mask, of the attention weights, a second derivative) is an
error, never silently zero.
"""
import collections.abc
import functools
import json
import math
import sys

import numpy as np

from . import _core


def _torch():
    return sys.modules.get("torch")


def is_tensor(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def any_tensor(*xs):
    return any(is_tensor(x) for x in xs)


def is_quantized(x):
    return isinstance(x, _core.QuantizedTensor)


def to_array(x, name, quantized=False):
    """x as a NumPy array: a CPU torch tensor without copying (bfloat16, which
    NumPy lacks, as float32); anything else as numpy.asarray reads it (the
    library then refuses what is not numeric, naming `name`). An
    attn.QuantizedTensor passes as it is where `quantized` (the keys and
    values of the attention functions), and is a TypeError elsewhere: its
    buffer is its bytes, not its values."""
    if is_quantized(x):
        if quantized:
            return x
        raise TypeError(f"{name} is an attn.QuantizedTensor ({x.dtype}, shape {x.shape}), read quantized "
                        "only as the keys and values of attention, attention_backward, attention_varlen, "
                        f"scaled_dot_product_attention and attn.dist: pass {name}.dequantize() for its "
                        "float32 values")
    if not is_tensor(x):
        return x
    torch = _torch()
    if x.device.type != "cpu":
        raise TypeError(f"{name} is a tensor on {x.device}; attn runs on the CPU: pass {name}.cpu()")
    if x.layout != torch.strided:
        raise TypeError(f"{name} is a {x.layout} tensor; attn reads dense tensors: pass {name}.to_dense()")
    if x.is_complex():
        raise TypeError(f"{name} must be a real tensor, got dtype {x.dtype}")
    x = x.detach().resolve_neg()
    if x.dtype == torch.bfloat16:
        x = x.float()
    return x.numpy()


def to_tensor(a, dtype=None):
    """A library result as a torch tensor (of `dtype` when given)."""
    if a is None:
        return None
    t = _torch().from_numpy(np.asarray(a))
    return t if dtype is None or t.dtype == dtype else t.to(dtype)


def result_dtype(*xs):
    """The dtype a torch result takes: float64 if any input is float64, else
    float32, except that inputs all of one other float dtype (float16,
    bfloat16) get it back, computed in float32."""
    torch = _torch()
    dtypes = {x.dtype for x in xs if is_tensor(x)}
    if torch.float64 in dtypes:
        return torch.float64
    if len(dtypes) == 1 and next(iter(dtypes)) in (torch.float16, torch.bfloat16):
        return next(iter(dtypes))
    return torch.float32


def wants_grad(*xs):
    torch = _torch()
    return torch is not None and torch.is_grad_enabled() and any(
        is_tensor(x) and x.requires_grad for x in xs)


def refuse_grad(x, name, why):
    """An error when x would need a gradient the library does not compute."""
    if wants_grad(x):
        raise RuntimeError(f"{name} requires grad, but {why}; pass {name}.detach() "
                           "(or call under torch.no_grad())")


@functools.lru_cache(maxsize=None)
def _function_class():
    torch = _torch()

    class Function(torch.autograd.Function):
        """forward(ctx, run, *tensors): run.forward() gives the outputs (the
        first `run.differentiable` of them with gradients) and
        run.backward(*grads) the inputs' gradients as arrays (or None)."""

        @staticmethod
        def forward(ctx, run, *tensors):
            ctx.run = run
            ctx.set_materialize_grads(False)
            # Every output stays differentiable, so that a gradient reaching one
            # the library cannot differentiate is an error in backward, not dropped.
            return tuple(run.forward())

        @staticmethod
        def backward(ctx, *grads):
            # autograd runs a backward with grad mode on exactly when a graph
            # of it is asked for (create_graph=True: hessian, a gradient
            # penalty). The library's backward is not differentiable, and
            # torch's once_differentiable only refuses when a gradient coming
            # in requires grad, not when the saved inputs do: the second
            # derivative came out silently zero.
            if torch.is_grad_enabled():
                raise RuntimeError("attn computes no second derivative (double backward is unsupported): "
                                   "call torch.autograd.grad without create_graph=True, or compute this "
                                   "part with torch ops")
            run = ctx.run
            for g, name in zip(grads[run.differentiable:], run.output_names[run.differentiable:]):
                if g is not None:
                    raise RuntimeError(f"attn computes no gradient through {name}; use it "
                                       "detached, or compute it with torch ops")
            if all(g is None for g in grads[:run.differentiable]):
                return (None,) * (1 + len(run.inputs))
            grads = [to_array(g, "grad") if g is not None else None for g in grads[:run.differentiable]]
            input_grads = run.backward(*grads)
            return (None,) + tuple(
                to_tensor(g, x.dtype) if g is not None and is_tensor(x) and x.requires_grad else None
                for g, x in zip(input_grads, run.inputs))

    return Function


class Differentiable:
    """A call whose outputs take part in autograd. Subclasses set `inputs`
    (the tensors the outputs depend on, in order), `output_names`,
    `differentiable` (how many leading outputs get gradients) and define
    forward() -> tuple of torch tensors and backward(*grad arrays) -> tuple of
    arrays or None, one per input."""

    def apply(self):
        return _function_class().apply(self, *self.inputs)


def sum_to_shape(a, shape):
    """a summed over the axes NumPy broadcasting added or stretched to reach
    a.shape from `shape` (the gradient of a broadcast)."""
    lead = a.ndim - len(shape)
    a = a.sum(axis=tuple(range(lead))) if lead else a
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and a.shape[i] != 1)
    return a.sum(axis=stretched, keepdims=True) if stretched else a


def scaling_json(scaling):
    """Hugging Face's rope_scaling dict as the JSON text the library parses
    (None stays None). NumPy and torch scalars and arrays become numbers and
    lists; a value that is not finite is a ValueError naming its key (JSON
    cannot carry it)."""
    if scaling is None:
        return None
    if not isinstance(scaling, collections.abc.Mapping):
        raise TypeError(f"scaling must be a rope_scaling dict (Hugging Face's form) or None, got {scaling!r}")

    def plain(value):
        if is_tensor(value):
            value = value.detach().cpu().numpy()
        return value.tolist() if hasattr(value, "tolist") else value

    out = {}
    for key, value in scaling.items():
        value = plain(value)
        if isinstance(value, (list, tuple)):
            value = [plain(v) for v in value]
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"rope_scaling: {key!r} must be finite, got {v}")
        out[key] = value
    try:
        return json.dumps(out)
    except TypeError as e:
        raise TypeError(f"rope_scaling: values must be numbers, strings, booleans or lists ({e})") from None
