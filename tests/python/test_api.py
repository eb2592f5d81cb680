"""The Python API's own contract: dtypes, zero-copy, strides, the GIL, errors, docs."""
import threading
import time
import tracemalloc

import numpy as np
import pytest

import attn
from util import rel_err


def test_dtypes():
    x32 = np.random.rand(4, 8).astype(np.float32)
    assert attn.multi_head(x32, 2).dtype == np.float32
    assert attn.multi_head(x32.astype(np.float64), 2).dtype == np.float64
    # other numeric input is converted to float32
    xi = np.arange(32).reshape(4, 8)
    assert attn.multi_head(xi, 2).dtype == np.float32
    assert attn.softmax(np.float16([1, 2, 3])).dtype == np.float32
    assert attn.rope(np.ones((3, 4), dtype=np.int8)).dtype == np.float32
    assert rel_err(attn.multi_head(xi, 2), attn.multi_head(xi.astype(np.float64), 2)) <= 2e-5
    # lists work too
    assert attn.softmax([0.0, 0.0]).tolist() == [0.5, 0.5]


def test_non_contiguous_input_gives_the_same_result():
    rng = np.random.default_rng(1)
    base = rng.normal(size=(6, 2, 5, 16)).astype(np.float32)
    q = base.transpose(1, 2, 0, 3)[:, :, :, ::2]  # (2, 5, 6, 8), strided everywhere
    k = base[::-1].transpose(1, 2, 0, 3)[:, :, :, 1::2]
    v = np.asfortranarray(rng.normal(size=(2, 5, 6, 3)).astype(np.float32))
    expected = attn.attention(np.ascontiguousarray(q), np.ascontiguousarray(k),
                              np.ascontiguousarray(v))
    np.testing.assert_array_equal(attn.attention(q, k, v), expected)
    x = base[:, 0, 0, :]
    np.testing.assert_array_equal(attn.rope(x[::-1]), attn.rope(np.ascontiguousarray(x[::-1])))
    np.testing.assert_array_equal(attn.multi_head(x.T, 2), attn.multi_head(x.T.copy(), 2))


def test_contiguous_float32_input_is_not_copied():
    # numpy reports its allocations to tracemalloc: the only array attention()
    # may allocate is its output (8 MiB), never copies of q, k, v (8 MiB each).
    rng = np.random.default_rng(2)
    q, k, v = (rng.random((1, 8, 2048, 128), dtype=np.float32) for _ in range(3))
    mib = 1 << 20
    tracemalloc.start()
    try:
        attn.attention(q, k, v)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * mib + mib, f"peak {peak / mib:.1f} MiB: inputs were copied"
    # float16 queries are converted to float32, a copy of 8 MiB: the same
    # measure sees it, so the bound above is sound
    q16 = q.astype(np.float16)
    tracemalloc.start()
    try:
        attn.attention(q16, k, v)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak >= 16 * mib


def test_gil_is_released_while_computing():
    # While one thread runs a long attention call, the main thread keeps
    # running Python code: its longest pause stays far below the call's length.
    rng = np.random.default_rng(3)
    q, k, v = (rng.random((4, 1024, 64), dtype=np.float64) for _ in range(3))
    start = time.perf_counter()
    attn.attention(q, k, v)
    call = time.perf_counter() - start
    if call < 0.05:
        q, k, v = (np.concatenate([a] * int(np.ceil(0.05 / call) + 1)) for a in (q, k, v))
    worker = threading.Thread(target=attn.attention, args=(q, k, v))
    worker.start()
    begin = last = time.perf_counter()
    longest = 0.0
    while worker.is_alive():
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
    total = time.perf_counter() - begin
    worker.join()
    assert longest < 0.5 * total, f"main thread paused {longest:.3f}s of {total:.3f}s"


def test_errors_are_value_and_type_errors():
    x = np.ones((5, 8), dtype=np.float32)
    with pytest.raises(ValueError, match=r"heads \(3\) must divide the model dimension d \(8\)"):
        attn.multi_head(x, 3)
    with pytest.raises(ValueError, match=r"q \(5, 8\), k \(4, 7\)"):
        attn.attention(x, np.ones((4, 7)), np.ones((4, 7)))
    with pytest.raises(ValueError, match=r"mask of shape \(5, 5\) does not broadcast to \(5, 6\)"):
        attn.attention(x, np.ones((6, 8)), np.ones((6, 8)), mask=np.ones((5, 5), dtype=bool))
    with pytest.raises(ValueError, match=r"multiple of key/value heads"):
        attn.attention(np.ones((3, 2, 4)), np.ones((2, 2, 4)), np.ones((2, 2, 4)))
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        attn.rope(x, rotary_dim=3)
    with pytest.raises(ValueError, match="pass an even rotary_dim"):
        attn.rope(np.ones((3, 5)))
    with pytest.raises(ValueError, match="softcap"):
        attn.attention(x, x, x, softcap=-1.0)
    with pytest.raises(ValueError, match="causal must be"):
        attn.attention(x, x, x, causal="diagonal")
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        attn.softmax(x, axis=2)
    with pytest.raises(ValueError, match="refusing to allocate"):
        attn.positional_encoding(1 << 40, 1 << 40)
    with pytest.raises(TypeError, match="causal must be"):
        attn.attention(x, x, x, causal=2)
    with pytest.raises(TypeError, match="window must be None or a pair"):
        attn.attention(x, x, x, window=3)
    with pytest.raises(TypeError, match="q must be a numeric array, got dtype <U1"):
        attn.attention(np.array(["a"]), x, x)
    with pytest.raises(TypeError, match="positions must be an integer array"):
        attn.rope(x, positions=np.arange(5) * 0.5)
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        attn.positional_encoding(3, 4, dtype=np.int32)
    with pytest.raises(TypeError):
        attn.attention(x, x)  # missing v


def test_keywords_are_keyword_only():
    x = np.ones((3, 4), dtype=np.float32)
    with pytest.raises(TypeError):
        attn.attention(x, x, x, None, True)
    with pytest.raises(TypeError):
        attn.positional_encoding(3, 4, 100.0)


@pytest.mark.parametrize("name,words", [
    ("attention", ["True where the query MAY attend", "bottom_right", "top_left", "GQA",
                   "(..., Hq, n_q, d_v)"]),
    ("multi_head", ["heads", "(5, 8)"]),
    ("positional_encoding", ["10000", "sin", "cos"]),
    ("rope", ["rotate_half", "interleaved", "rotary_dim", "positions"]),
    ("softmax", ["-inf"]),
])
def test_docstrings(name, words):
    doc = getattr(attn, name).__doc__
    for w in words:
        assert w in doc, (name, w)
