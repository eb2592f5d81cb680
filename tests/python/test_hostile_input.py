"""Inputs a careless or hostile user gives the Python module (docs/reliability.md):
thread counts, concurrent state-dict loads, integer masks, unsupported PyTorch
layers, overflowing positions, NumPy scalars, path-like objects, torch tensors."""
import os
import pathlib
import threading
import warnings

import numpy as np
import pytest
import torch

import attn

from util import PEAK_BYTES, run_python


def qkv(n=6, d=4, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(2, n, d)).astype(dtype) for _ in range(3)]


def test_thread_counts_outside_one_to_max_are_value_errors():
    top = attn.max_num_threads()
    assert top == min(1024, max(64, 4 * os.cpu_count()))
    saved = attn.num_threads()
    try:
        for n in (0, -1, top + 1, 100000, 2**70):
            with pytest.raises(ValueError, match=r"set_num_threads: n must (be in \[1, max_num_threads|fit in int64)"):
                attn.set_num_threads(n)
        attn.set_num_threads(np.int64(3))  # a NumPy integer is an integer
        assert attn.num_threads() == 3
        with pytest.raises(TypeError):
            attn.set_num_threads(True)
    finally:
        attn.set_num_threads(saved)


@pytest.mark.parametrize("value", ["2000", "0", "-3", "two", "4x", "99999999999999999999"])
def test_a_bad_ATTN_NUM_THREADS_is_a_clear_error(value):
    r = run_python("import attn, numpy as np\n"
                   "q = np.ones((1, 600, 8), np.float32)\n"
                   "try:\n    attn.attention(q, q, q)\nexcept ValueError as e:\n    print('ValueError:', e)\n",
                   env={"ATTN_NUM_THREADS": value})
    assert r.returncode == 0, r.stderr
    assert f"ATTN_NUM_THREADS must be an integer in [1, max_num_threads() = " in r.stdout
    assert f"got '{value}'" in r.stdout


def test_ATTN_NUM_THREADS_in_range_is_used():
    r = run_python("import attn; print(attn.num_threads())", env={"ATTN_NUM_THREADS": "5"})
    assert r.stdout.strip() == "5", r.stderr


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_load_state_dict_while_other_threads_run_forwards(dtype):
    """Each forward sees one parameter set whole: the result with A or with B."""
    m = attn.MultiHeadAttention(32, 4, num_kv_heads=2)  # q, k, v weights reallocated by a load
    sd_a = attn.MultiHeadAttention(32, 4, num_kv_heads=2, seed=1).state_dict()
    sd_b = attn.MultiHeadAttention(32, 4, num_kv_heads=2, seed=2).state_dict()
    x = np.random.default_rng(0).normal(size=(1, 300, 32)).astype(dtype)
    m.load_state_dict(sd_a)
    ya = m(x)[0]
    m.load_state_dict(sd_b)
    yb = m(x)[0]
    assert not np.array_equal(ya, yb)
    stop = threading.Event()
    bad, count = [], [0]

    def forwards():
        while not stop.is_set():
            y = m(x)[0]
            count[0] += 1
            if not (np.array_equal(y, ya) or np.array_equal(y, yb)):
                bad.append(y)

    threads = [threading.Thread(target=forwards) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(300):
        m.load_state_dict(sd_a if i % 2 else sd_b)
    stop.set()
    for t in threads:
        t.join()
    assert count[0] > 0 and not bad


def test_attention_refuses_integer_masks():
    q, k, v = qkv()
    allowed = np.ones((6, 6), bool)
    for dtype in (np.int64, np.int32, np.uint8):
        with pytest.raises(TypeError, match=r"mask must be a bool or float array, got dtype"):
            attn.attention(q, k, v, mask=allowed.astype(dtype))
    attn.attention(q, k, v, mask=allowed)  # bool and float stay accepted
    attn.attention(q, k, v, mask=np.zeros((6, 6), np.float16))


@pytest.mark.parametrize("which", ["attn_mask", "key_padding_mask"])
def test_layer_reads_uint8_masks_as_boolean_like_torch(which):
    rng = np.random.default_rng(5)
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    m = attn.MultiHeadAttention(16, 4)
    m.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    x = rng.normal(size=(2, 7, 16)).astype(np.float32)
    blocked = rng.random((7, 7) if which == "attn_mask" else (2, 7)) < 0.4
    blocked[..., 0] = False
    mask = blocked.astype(np.uint8)
    # torch 1.13 reads a uint8 attn_mask as bool (deprecated) and refuses a
    # uint8 key_padding_mask (older versions read it as bool): the reference
    # gets the uint8 mask where torch takes it, the bool one elsewhere.
    ref_mask = mask if which == "attn_mask" else blocked
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation warning for uint8
        ref = t(*[torch.from_numpy(x)] * 3, **{which: torch.from_numpy(ref_mask)})[0].numpy()
    out = m(x, **{which: mask})[0]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out, m(x, **{which: blocked})[0])
    with pytest.raises(TypeError, match=rf"{which} must be a bool or float array \(or uint8, read as bool\)"):
        m(x, **{which: blocked.astype(np.int64)})


def test_rope_positions_outside_int64_are_refused():
    x = np.ones((3, 4))
    with pytest.raises(ValueError, match="rope: positions must fit in int64, got 9223372036854775813"):
        attn.rope(x, positions=np.uint64(2**63 + 5))
    with pytest.raises(ValueError, match="fit in int64"):
        attn.rope(x, positions=np.array([0, 1, 2**64 - 1], np.uint64))
    # the largest int64 is a position like any other
    big = np.uint64(2**63 - 1)
    np.testing.assert_array_equal(attn.rope(x, positions=big), attn.rope(x, positions=np.int64(big)))


def test_positional_encoding_is_written_once():
    """The table goes straight into the NumPy array: peak memory one table, not two."""
    r = run_python("import attn\n" + PEAK_BYTES +
                   "before = peak_bytes()\n"
                   "pe = attn.positional_encoding(2**21, 32)\n"  # 256 MiB
                   "print((peak_bytes() - before) / pe.nbytes)\n", timeout=120)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) < 1.3  # a copy made it 2.0


def test_numpy_scalars_and_path_like_objects_are_accepted(tmp_path):
    q, k, v = qkv(n=8)
    np.testing.assert_array_equal(attn.attention(q, k, v, causal=np.bool_(True)),
                                  attn.attention(q, k, v, causal=True))
    np.testing.assert_array_equal(attn.attention(q, k, v, window=(np.int64(2), 0)),
                                  attn.attention(q, k, v, window=(2, 0)))
    np.testing.assert_array_equal(attn.rope(q, rotary_dim=np.int64(2)), attn.rope(q, rotary_dim=2))
    m = attn.MultiHeadAttention(8, np.int64(2), num_kv_heads=np.int32(1), kdim=np.int64(8))
    x = np.ones((1, 3, 8), np.float32)
    np.testing.assert_array_equal(m(x, need_weights=np.bool_(True))[1], m(x, need_weights=True)[1])
    path = tmp_path / "layer.safetensors"
    m.save(path)
    m.save(os.fsencode(str(tmp_path / "bytes.safetensors")))
    m2 = attn.MultiHeadAttention.load(pathlib.PurePath(path))
    np.testing.assert_array_equal(m2(x)[0], m(x)[0])
    for bad in (1.5, "2", np.float64(2.0)):
        with pytest.raises(TypeError, match="rotary_dim must be an integer"):
            attn.rope(q, rotary_dim=bad)
    with pytest.raises(TypeError, match="window sizes"):
        attn.attention(q, k, v, window=(True, 0))
    with pytest.raises(TypeError, match="path must be a str, bytes or path-like object"):
        m.save(3)


def test_a_torch_tensor_that_requires_grad_is_read_and_gets_a_gradient():
    t = torch.ones(2, 3, 4, requires_grad=True)
    out = attn.attention(t, t, t)
    assert isinstance(out, torch.Tensor) and out.grad_fn is not None
    np.testing.assert_allclose(out.detach().numpy(), np.ones((2, 3, 4)), rtol=1e-6)
    out.sum().backward()
    assert t.grad is not None and t.grad.shape == t.shape


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("float_attn_mask", [False, True])
def test_a_padded_key_takes_no_part_even_when_nan(dtype, float_attn_mask):
    """key_padding_mask excludes a key: a NaN in its input (so in its key and
    value rows) reaches no output, with or without a float attn_mask beside it.
    The reference is the same layer with that key removed."""
    rng = np.random.default_rng(8)
    m = attn.MultiHeadAttention(16, 4)
    q = rng.normal(size=(2, 5, 16)).astype(dtype)
    kv = rng.normal(size=(2, 7, 16)).astype(dtype)
    am = rng.normal(size=(5, 7)).astype(dtype) if float_attn_mask else None
    kv[1, 3] = np.nan
    pad = np.zeros((2, 7), bool)
    pad[1, 3] = True
    out = m(q, kv, kv, key_padding_mask=pad, attn_mask=am)[0]
    assert np.isfinite(out).all()
    kept = np.delete(kv[1:], 3, axis=1)
    ref = m(q[1:], kept, kept, attn_mask=None if am is None else np.delete(am, 3, axis=1))[0]
    np.testing.assert_allclose(out[1:], ref, rtol=1e-5, atol=1e-6)


def test_internals_never_leak_into_messages():
    """Each of these named a C++ internal (precision_unit()'s signature,
    std::vector's max_size(), std::bad_alloc) or failed to allocate with no
    hint; each now names the argument, its range and what to do."""
    x = np.ones((2, 3, 4), np.float32)
    for precision in (None, 1, b"bf16"):
        with pytest.raises(TypeError, match=r"precision must be 'f32', 'bf16' or 'int8', got "):
            attn.attention(x, x, x, precision=precision)
    with pytest.raises(ValueError, match=r"precision"):
        attn.attention(x, x, x, precision="fp8")
    for heads in (2**62, 10**9):
        with pytest.raises(ValueError, match=rf"alibi_slopes: num_heads must be in \[1, 16777216\], got {heads}"):
            attn.alibi_slopes(heads)
    with pytest.raises(ValueError, match=r"rotary_dim must be even and in \[0, 16777216\] .* got 1099511627776"):
        attn.rope_frequencies(2**40)
    # Weights (1, 4, n, n) of float32 just larger than this machine's memory.
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    n = int((memory / 16) ** 0.5) + 1024
    layer = attn.MultiHeadAttention(8, 4)
    with pytest.raises(MemoryError, match=rf"the attention weights \(1, 4, {n}, {n}\) would take [0-9.]+ GiB, "
                                          r"more than this machine's [0-9.]+ GiB of memory: pass need_weights=False"):
        layer(np.zeros((1, n, 8), np.float32))


def test_layers_caches_and_quantized_tensors_pickle_and_deepcopy():
    """copy.deepcopy(model) failed for a drop-in: none of the three could be
    pickled or copied. Each now round-trips whole, and a copy shares nothing
    with the original (changing one leaves the other as it was)."""
    import copy
    import pickle
    rng = np.random.default_rng(3)
    layer = attn.MultiHeadAttention(64, 2, num_kv_heads=1, rope=True, sinks=True,
                                    rope_scaling={"rope_type": "linear", "factor": 2.0}, seed=4)
    x = rng.standard_normal((1, 7, 64)).astype(np.float32)
    for twin in (pickle.loads(pickle.dumps(layer)), copy.deepcopy(layer)):
        assert type(twin) is attn.MultiHeadAttention and repr(twin) == repr(layer)
        np.testing.assert_array_equal(twin(x, causal=True)[0], layer(x, causal=True)[0])
        sd = twin.state_dict()
        sd["out_proj.weight"][:] = 0
        twin.load_state_dict(sd)
        assert np.abs(layer.state_dict()["out_proj.weight"]).sum() > 0
    for options in (dict(), dict(dtype="bf16"), dict(dtype="q8_0", sink_tokens=2, window=4),
                    dict(sink_tokens=1, window=3, positions="cache")):
        for inputs in (x, x.astype(np.float64)) if not options.get("dtype") else (x,):
            cache = layer.new_cache(**options)
            empty = copy.deepcopy(cache)
            layer(inputs[:, :5], cache=cache, causal=True)
            for twin in (pickle.loads(pickle.dumps(cache)), copy.deepcopy(cache)):
                assert (len(twin), twin.seen, twin.dtype, twin.nbytes) == (len(cache), cache.seen, cache.dtype,
                                                                            cache.nbytes)
                a = layer(inputs[:, 5:], cache=twin, causal=True)[0]  # the copy moves on ...
                assert len(twin) != len(cache) or twin.seen != cache.seen
                b = layer(inputs[:, 5:], cache=copy.deepcopy(cache), causal=True)[0]
                np.testing.assert_array_equal(a, b)  # ... as the original would have
            assert len(empty) == 0
    k = rng.standard_normal((2, 6, 64)).astype(np.float32)
    raw = np.frombuffer(memoryview(attn.quantize(k, "q8_0")), np.uint8).copy()
    wrapped = attn.QuantizedTensor.from_buffer(raw, "q8_0", k.shape)
    for twin in (pickle.loads(pickle.dumps(wrapped)), copy.deepcopy(wrapped)):
        assert (twin.dtype, twin.shape, twin.nbytes) == (wrapped.dtype, wrapped.shape, wrapped.nbytes)
        np.testing.assert_array_equal(twin.dequantize(), wrapped.dequantize())
    before = twin.dequantize()
    raw[:] = 0  # the wrapped buffer changes; the copy owns its bytes
    np.testing.assert_array_equal(twin.dequantize(), before)
    assert not wrapped.dequantize().any()
