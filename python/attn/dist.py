"""Context-parallel attention over MPI: one attention problem whose sequence
is split across the ranks of an mpi4py communicator (docs/semantics.md
"Context parallelism", docs/scaling.md).

Each rank passes its own slices of q, k and v, shaped (..., H, n_local, d)
like attn.attention's, the sequence axis (-2) split over the ranks in rank
order (layout="contiguous": rank r holds the r-th run of positions, any
lengths; "zigzag": the sequence cut into 2W equal chunks, rank r holding
chunks r and 2W-1-r), and receives its rows of the output that attn.attention
would give on the whole sequence.

    ring_attention           K/V blocks pass around the ring, results merged exactly
    ring_attention_backward  its gradient, by the same ring
    ulysses_attention        an all-to-all from sequence slices to head slices and back

Every rank calls together. An argument that is wrong on any rank raises the
same error on every rank, naming that rank: never a hang. Importing this
module imports mpi4py (which initialises MPI).
"""
from . import _core
from ._interop import any_tensor, refuse_grad, result_dtype, to_array, to_tensor

try:
    from . import _dist
except ImportError as e:  # built only where Open MPI and mpi4py are (make test installs them)
    raise ImportError("attn.dist needs attn._dist, which is built when CMake finds Open MPI and "
                      f"mpi4py (Debian: libopenmpi-dev, python3-mpi4py): {e}") from e

__all__ = ["ring_attention", "ring_attention_backward", "ulysses_attention"]


def _arrays(comm, function, inputs, names, quantized=()):
    """The inputs as arrays; a conversion that fails on any rank fails on all.
    attn._dist holds its own copy of the library: it runs with attn's thread
    count (attn.set_num_threads)."""
    error, arrays = None, None
    try:
        for x, n in zip(inputs, names):
            refuse_grad(x, n, f"{function.__name__} has no autograd (ring_attention_backward is its gradient)")
        arrays = [None if x is None else to_array(x, n, quantized=n in quantized) for x, n in zip(inputs, names)]
        _dist.set_num_threads(_core.num_threads())
    except Exception as e:  # noqa: BLE001 - every rank must hear of it, whatever it is
        error = e
    _dist.check_collectively(comm, function.__name__, error)
    return arrays


def _call(function, q, k, v, comm, return_lse, **options):
    arrays = _arrays(comm, function, (q, k, v, options.pop("alibi_slopes", None), options.pop("sinks", None)),
                     ("q", "k", "v", "alibi_slopes", "sinks"), quantized=("k", "v"))
    r = function(*arrays[:3], comm, alibi_slopes=arrays[3], sinks=arrays[4], return_lse=return_lse, **options)
    if not any_tensor(q, k, v):
        return r
    dtype = result_dtype(q, k, v)
    return tuple(to_tensor(a, dtype) for a in r) if return_lse else to_tensor(r, dtype)


def ring_attention(q, k, v, comm, *, causal=False, layout="contiguous", scale=None, softcap=None,
                   window=None, alibi_slopes=None, sinks=None, return_lse=False, precision="f32"):
    """ring_attention(q, k, v, comm, *, causal=False, layout="contiguous", scale=None, softcap=None,
               window=None, alibi_slopes=None, sinks=None, return_lse=False, precision="f32")
    -> out | (out, lse)

Ring attention (Liu et al., 2023): each rank computes its queries against the
K/V block it holds while passing it on to the next rank, the partial results
merged exactly in a fixed order (bitwise reproducible for one world size and
layout). The options are attn.attention's, on the global sequence: causal
(either alignment, or ("offset", k)), window and ALiBi by global positions
(blocks wholly outside the mask and window are neither computed nor, where no
later rank needs them, sent); float16 k and v travel in half float32's bytes.
"""
    return _call(_dist.ring_attention, q, k, v, comm, return_lse, causal=causal, layout=layout, scale=scale,
                 softcap=softcap, window=window, alibi_slopes=alibi_slopes, sinks=sinks, precision=precision)


def ring_attention_backward(q, k, v, dout, out, lse, comm, *, causal=False, layout="contiguous", scale=None,
                            softcap=None, window=None, alibi_slopes=None, sinks=None):
    """ring_attention_backward(q, k, v, dout, out, lse, comm, *, causal=False, layout="contiguous", scale=None,
                        softcap=None, window=None, alibi_slopes=None, sinks=None)
    -> (dq, dk, dv) | (dq, dk, dv, dsinks)

The gradient of ring_attention with the same arguments: each rank passes its
slices, the gradient dout of its output, and the out and lse its
ring_attention(..., return_lse=True) returned; it receives dq, dk, dv for its
slices and, with sinks, dsinks (Hq,), summed over every rank's rows.
float32 or float64 (k and v of q's dtype).
"""
    names = ("q", "k", "v", "dout", "out", "lse", "alibi_slopes", "sinks")
    inputs = (q, k, v, dout, out, lse, alibi_slopes, sinks)
    arrays = _arrays(comm, _dist.ring_attention_backward, inputs, names)
    r = _dist.ring_attention_backward(*arrays[:6], comm, causal=causal, layout=layout, scale=scale,
                                      softcap=softcap, window=window, alibi_slopes=arrays[6], sinks=arrays[7])
    if not any_tensor(*inputs[:6]):
        return r
    dtype = result_dtype(q, k, v, dout)
    return tuple(to_tensor(a, dtype) for a in r)


def ulysses_attention(q, k, v, comm, *, causal=False, layout="contiguous", scale=None, softcap=None,
                      window=None, alibi_slopes=None, sinks=None, return_lse=False, precision="f32"):
    """ulysses_attention(q, k, v, comm, *, causal=False, layout="contiguous", scale=None, softcap=None,
                  window=None, alibi_slopes=None, sinks=None, return_lse=False, precision="f32")
    -> out | (out, lse)

DeepSpeed Ulysses: an all-to-all gives each rank whole sequences of Hq / W
query heads (and Hkv / W key/value heads; both must divide by the world size
W), attn.attention runs on them with every option, and a second all-to-all
returns each rank its rows of every head.
"""
    return _call(_dist.ulysses_attention, q, k, v, comm, return_lse, causal=causal, layout=layout, scale=scale,
                 softcap=softcap, window=window, alibi_slopes=alibi_slopes, sinks=sinks, precision=precision)
