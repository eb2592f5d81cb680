"""Serving many sequences (issue 48): merge_state and merge_states against
attention over the union of the keys, written here in float64 NumPy, and
FlashInfer's layouts and conventions."""
import numpy as np
import pytest

import attn


def dense_state(q, k, v):
    """float64 attention of q (n, H, d) over k, v (m, H, ·): v (n, H, d_v), lse (n, H)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("nhd,mhd->hnm", q, k) / np.sqrt(q.shape[-1])
    if s.shape[-1] == 0:
        return np.zeros(q.shape[:2] + v.shape[-1:]), np.full(q.shape[:2], -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - top)
    out = np.einsum("hnm,mhd->nhd", e / e.sum(-1, keepdims=True), v)
    return out, (top[..., 0] + np.log(e.sum(-1))).T


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_merge_state_of_two_parts_is_attention_over_both(dtype):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((5, 3, 8)), rng.standard_normal((13, 3, 8)), rng.standard_normal((13, 3, 4))
    whole = dense_state(q, k, v)
    a, b = dense_state(q, k[:6], v[:6]), dense_state(q, k[6:], v[6:])
    out, lse = attn.merge_state(*(x.astype(dtype) for x in (*a, *b)))
    assert out.dtype == lse.dtype == dtype and out.shape == (5, 3, 4) and lse.shape == (5, 3)
    tol = 1e-13 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(out, whole[0], atol=tol)
    np.testing.assert_allclose(lse, whole[1], atol=tol)

    v_acc, s_acc = (x.astype(dtype).copy() for x in a)
    attn.merge_state_in_place(v_acc, s_acc, *b)
    np.testing.assert_allclose(v_acc, whole[0], atol=tol)
    np.testing.assert_allclose(s_acc, whole[1], atol=tol)


def test_merge_states_in_order_with_an_empty_part():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((4, 2, 8)), rng.standard_normal((10, 2, 8)), rng.standard_normal((10, 2, 3))
    cuts = [0, 4, 4, 10]  # the middle part has no key: lse -inf and zeros, which change nothing
    parts = [dense_state(q, k[a:b], v[a:b]) for a, b in zip(cuts, cuts[1:])]
    vs, ss = np.stack([p[0] for p in parts], axis=1), np.stack([p[1] for p in parts], axis=1)
    out, lse = attn.merge_states(vs, ss)
    whole = dense_state(q, k, v)
    np.testing.assert_allclose(out, whole[0], atol=1e-13)
    np.testing.assert_allclose(lse, whole[1], atol=1e-13)


def test_merge_state_torch_and_flashinfers_base_2():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((3, 2, 8)), rng.standard_normal((9, 2, 8)), rng.standard_normal((9, 2, 8))
    a, b = dense_state(q, k[:5], v[:5]), dense_state(q, k[5:], v[5:])
    # FlashInfer's lse is base 2: times ln 2 it is attn's natural log.
    a2, b2 = a[1] / np.log(2), b[1] / np.log(2)
    out, lse = attn.merge_state(torch.tensor(a[0], dtype=torch.float32), torch.tensor(a2 * np.log(2)),
                                torch.tensor(b[0], dtype=torch.float32), torch.tensor(b2 * np.log(2)))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64  # one float64 input
    np.testing.assert_allclose(out.numpy(), dense_state(q, k, v)[0], atol=1e-6)
    v_t, s_t = torch.tensor(a[0]), torch.tensor(a[1])
    attn.merge_state_in_place(v_t, s_t, b[0], b[1])
    np.testing.assert_allclose(s_t.numpy(), lse.numpy(), atol=1e-6)
    with pytest.raises(TypeError, match="v must be float32 or float64"):
        attn.merge_state_in_place(v_t.bfloat16(), s_t, b[0], b[1])


def test_merge_state_refuses_bad_input():
    v, s = np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"v_b must have shape \(2, 3, 4\)"):
        attn.merge_state(v, s, v[:1], s[:1])
    with pytest.raises(ValueError, match="vs must be"):
        attn.merge_states(v, s)
    with pytest.raises(ValueError, match="must be writable"):
        ro = v.copy()
        ro.flags.writeable = False
        attn.merge_state_in_place(ro, s, v, s)


# ---------------------------------------------------------------------------
# PagedKVCache against a plain model of what each sequence holds.

def gathered(cache, seq):
    """seq's keys and values read back from the float32 pools through its page table."""
    indptr, indices, last = cache.page_table([seq])
    k_pages, v_pages = cache.pages()
    n = cache.length(seq)
    if cache.layout == "HND":
        k_pages, v_pages = k_pages.transpose(0, 2, 1, 3), v_pages.transpose(0, 2, 1, 3)
    k = k_pages[indices].reshape(-1, *k_pages.shape[2:])[:n]
    v = v_pages[indices].reshape(-1, *v_pages.shape[2:])[:n]
    return k, v


def snapshot(cache, model):
    return {s: (cache.length(s), *(x.copy() for x in gathered(cache, s))) for s in model}, cache.free_pages()


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cache_against_a_model_of_its_sequences(layout):
    rng = np.random.default_rng(3)
    page_size, heads, d, dv = 4, 2, 3, 5
    cache = attn.PagedKVCache(24, page_size, heads, d, value_head_dim=dv, layout=layout)
    model = {}  # id -> (keys, values) as lists of (heads, ·) rows
    counter = 0

    def check():
        for s, (ks, vs) in model.items():
            assert cache.length(s) == len(ks)
            assert list(cache.positions(s)) == list(range(len(ks)))
            k, v = gathered(cache, s)
            np.testing.assert_array_equal(k, np.array(ks).reshape(-1, heads, d))
            np.testing.assert_array_equal(v, np.array(vs).reshape(-1, heads, dv))
        indptr, indices, last = cache.page_table(list(model))
        assert cache.pages_in_use() == len(set(indices.tolist())) == 24 - cache.free_pages()
        bytes_per_token = heads * (d + dv) * 4
        assert cache.nbytes == cache.pages_in_use() * page_size * bytes_per_token
        assert cache.nbytes <= sum(len(ks) + page_size - 1 for ks, _ in model.values()) * bytes_per_token
        for s, n_last in zip(model, last):
            n = len(model[s][0])
            assert n_last == (0 if n == 0 else (n - 1) % page_size + 1)

    for step in range(300):
        op = rng.choice(["add", "append", "append", "fork", "truncate", "remove", "refused"])
        ids = list(model)
        if op == "add" or not ids:
            model[cache.add_sequence()] = ([], [])
        elif op == "append":
            chosen = list(rng.choice(ids, size=min(len(ids), rng.integers(1, 4)), replace=False))
            counts = rng.integers(0, 6, size=len(chosen))
            k = rng.standard_normal((counts.sum(), heads, d)).astype(np.float32)
            v = rng.standard_normal((counts.sum(), heads, dv)).astype(np.float32)
            indptr = np.concatenate([[0], np.cumsum(counts)])
            before = snapshot(cache, model)
            try:
                cache.append(chosen, k, v, indptr)
            except RuntimeError as e:  # the pool is full: nothing appended
                assert "pages" in str(e) and "free" in str(e)
                after = snapshot(cache, model)
                assert after[1] == before[1] and all(
                    np.array_equal(a, b) for s in model for a, b in zip(before[0][s][1:], after[0][s][1:]))
            else:
                for s, a, b in zip(chosen, indptr, indptr[1:]):
                    model[s][0].extend(k[a:b])
                    model[s][1].extend(v[a:b])
        elif op == "fork":
            parent = rng.choice(ids)
            child = cache.fork(parent)
            model[child] = (list(model[parent][0]), list(model[parent][1]))
        elif op == "truncate":
            s = rng.choice(ids)
            n = int(rng.integers(0, len(model[s][0]) + 1))
            cache.truncate(s, n)
            del model[s][0][n:], model[s][1][n:]
        elif op == "remove":
            s = rng.choice(ids)
            cache.remove(s)
            del model[s]
        else:  # refused calls change nothing
            before = snapshot(cache, model)
            unknown = max(ids) + 1000
            with pytest.raises(KeyError):
                cache.length(unknown)
            with pytest.raises(KeyError):
                cache.append([ids[0], unknown], np.zeros((2, heads, d), np.float32),
                             np.zeros((2, heads, dv), np.float32), [0, 1, 2])
            with pytest.raises(ValueError, match="length must be in"):
                cache.truncate(ids[0], len(model[ids[0]][0]) + 1)
            with pytest.raises(ValueError, match="append_indptr"):
                cache.append([ids[0]], np.zeros((2, heads, d), np.float32), np.zeros((2, heads, dv), np.float32), [0, 1])
            after = snapshot(cache, model)
            assert after[1] == before[1]
            for s in model:
                assert before[0][s][0] == after[0][s][0]
                for a, b in zip(before[0][s][1:], after[0][s][1:]):
                    np.testing.assert_array_equal(a, b)
        counter += 1
        check()
    assert counter == 300


def test_cache_ids_dtypes_copies_and_pickles():
    import copy
    import pickle
    for alias, name in (("float32", "f32"), ("bfloat16", "bf16"), ("float16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0")):
        assert attn.PagedKVCache(2, 4, 1, 32, dtype=alias).dtype == name
    cache = attn.PagedKVCache(8, 4, 1, 2)
    a = cache.add_sequence()
    cache.append([np.int32(a)], np.ones((5, 1, 2)), np.ones((5, 1, 2)), np.array([0, 5], np.uint8))
    b = cache.fork(np.int64(a))
    assert cache.pages_in_use() == 2  # a fork adds no page until it appends
    cache.append([b], np.zeros((1, 1, 2)), np.zeros((1, 1, 2)), [0, 1])
    assert cache.pages_in_use() == 3  # its first append adds one: the partial page, copied
    for clone in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        clone.append([a], np.full((3, 1, 2), 7.0), np.full((3, 1, 2), 7.0), [0, 3])
        clone.remove(b)
        assert cache.length(a) == 5 and cache.length(b) == 6 and cache.pages_in_use() == 3
        np.testing.assert_array_equal(gathered(cache, a)[0], np.ones((5, 1, 2)))
    cache.remove(a)
    with pytest.raises(KeyError, match=f"no sequence {a}"):
        cache.fork(a)
    with pytest.raises(TypeError, match="this cache stores bf16"):
        attn.PagedKVCache(2, 4, 1, 2, dtype="bf16").pages()
    with pytest.raises(ValueError, match="unknown K/V dtype 'int3'"):
        attn.PagedKVCache(2, 4, 1, 2, dtype="int3")
    with pytest.raises(ValueError, match="page_size must be a multiple of 32, got 16"):
        attn.PagedKVCache(2, 16, 1, 32, dtype="int4")
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        attn.PagedKVCache(2, 0, 1, 2)
    k_pages, _ = cache.pages()
    assert not k_pages.flags.writeable


def test_cache_readers_at_once_and_a_writer_alone():
    import threading
    import time
    cache = attn.PagedKVCache(4096, 16, 8, 128)
    s = cache.add_sequence()
    x = np.ones((16001, 8, 128), np.float32)
    cache.append([s], x[:16000], x[:16000], [0, 16000])
    q = np.ones((1, 32, 128), np.float32)
    stop, reads, errors = threading.Event(), [], []

    def read():  # readers overlap each other freely; one that meets the writer is refused
        while not stop.is_set():
            try:
                reads.append(attn.batch_attention(q, [0, 1], cache, [s]).shape)
            except RuntimeError as e:
                if "PagedKVCache is in use by another thread" not in str(e):
                    errors.append(e)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    refused, deadline = 0, time.monotonic() + 20
    while refused == 0 and time.monotonic() < deadline:
        try:
            cache.append([s], x[:1], x[:1], [0, 1])
            cache.truncate(s, 16000)
        except RuntimeError as e:
            assert "PagedKVCache is in use by another thread" in str(e)
            refused += 1
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors
    assert refused > 0, "a writer beside three readers never overlapped one in 20 s"
    assert len(reads) >= 3 and cache.length(s) in (16000, 16001)


# ---------------------------------------------------------------------------
# batch_attention against float64 NumPy per request.

def reference_request(q, k, v, causal=False, window=None, softcap=None, scale=None, alibi=None, sinks=None,
                      mask=None):
    """float64: q (n_q, Hq, d), k (n_k, Hkv, d), v (n_k, Hkv, dv); bottom-right positions."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n_q, hq, d = q.shape
    n_k, hkv = k.shape[:2]
    group = hq // hkv
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("ihd,jhd->hij", q, k) * (1 / np.sqrt(d) if scale is None else scale)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    p = np.arange(n_q)[:, None] + n_k - n_q
    j = np.arange(n_k)[None, :]
    allowed = np.ones((n_q, n_k), bool)
    if causal:
        allowed &= j <= p
    if window is not None:
        left, right = window
        if left >= 0:
            allowed &= j >= p - left
        if right >= 0:
            allowed &= j <= p + right
    if mask is not None:
        allowed &= mask
    if alibi is not None:
        s = s - np.asarray(alibi)[:, None, None] * (p - j)[None]
    s = np.where(allowed[None], s, -np.inf)
    sink = np.full(hq, -np.inf) if sinks is None else np.asarray(sinks, np.float64)
    top = np.maximum(s.max(-1) if n_k else np.full((hq, n_q), -np.inf), sink[:, None])
    safe = np.where(np.isfinite(top), top, 0)
    e = np.exp(s - safe[..., None])
    denom = e.sum(-1) + np.exp(sink[:, None] - safe)
    w = np.where(denom[..., None] > 0, e / np.where(denom > 0, denom, 1)[..., None], 0)
    out = np.einsum("hij,jhd->ihd", w, v)
    lse = np.where(denom > 0, safe + np.log(np.where(denom > 0, denom, 1)), -np.inf).T
    return out, lse


def paged_batch(rng, qo_lens, kv_lens, page_size, hq, hkv, d, dv, layout="NHD"):
    cache = attn.PagedKVCache(sum(-(-n // page_size) for n in kv_lens) + 2, page_size, hkv, d, value_head_dim=dv,
                              layout=layout)
    ids = [cache.add_sequence() for _ in kv_lens]
    ks = [rng.standard_normal((n, hkv, d)).astype(np.float32) for n in kv_lens]
    vs = [rng.standard_normal((n, hkv, dv)).astype(np.float32) for n in kv_lens]
    for s, k, v in zip(reversed(ids), reversed(ks), reversed(vs)):  # pages out of order
        cache.append([s], k, v, [0, len(k)])
    q = rng.standard_normal((sum(qo_lens), hq, d)).astype(np.float32)
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    return cache, ids, ks, vs, q, qo_indptr


OPTIONS = [dict(), dict(causal=True), dict(causal=True, window=(6, -1), softcap=3.0), dict(window=(20, 3)),
           dict(causal=True, alibi_slopes=attn.alibi_slopes(6)), dict(causal=True, sinks=[0.5, -1, 2, 0, 1, -2]),
           dict(scale=0.2)]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("options", OPTIONS, ids=range(len(OPTIONS)))
def test_batch_attention_per_request_against_float64(layout, options):
    rng = np.random.default_rng(5)
    qo, kv = [1, 8, 12, 1, 0, 3], [1, 700, 40, 0, 5, 3]
    cache, ids, ks, vs, q, qo_indptr = paged_batch(rng, qo, kv, 8, 6, 2, 16, 8, layout)
    out, lse = attn.batch_attention(q, qo_indptr, cache, ids, return_lse=True, **options)
    assert out.shape == (sum(qo), 6, 8) and lse.shape == (sum(qo), 6) and lse.dtype == np.float32
    ref = {k: v for k, v in options.items() if k != "alibi_slopes" and k != "sinks"}
    for r, (a, b) in enumerate(zip(qo_indptr, qo_indptr[1:])):
        want, want_lse = reference_request(q[a:b], ks[r], vs[r], alibi=options.get("alibi_slopes"),
                                           sinks=options.get("sinks"), **ref)
        np.testing.assert_allclose(out[a:b], want, atol=2e-5, err_msg=f"request {r}")
        np.testing.assert_allclose(lse[a:b], want_lse, atol=2e-5, err_msg=f"request {r}")
    # The raw form over the same pages, and the plan: bitwise the same.
    kv_indptr, kv_indices, last = cache.page_table(ids)
    raw = attn.batch_attention(q, qo_indptr, cache.pages(), kv_indptr=kv_indptr, kv_indices=kv_indices,
                               kv_last_page_len=last, layout=layout, **options)
    np.testing.assert_array_equal(raw, out)
    plan = attn.BatchAttentionPlan(qo_indptr, kv_indptr, kv_indices, last, 6, 2, 16, 8, value_head_dim=8,
                                   layout=layout, **options)
    np.testing.assert_array_equal(plan.run(q, cache), out)
    np.testing.assert_array_equal(plan.run(q, cache.pages()), out)


def test_batch_attention_empty_rows_masks_and_torch():
    rng = np.random.default_rng(6)
    qo, kv = [4, 3, 2], [2, 0, 9]
    cache, ids, ks, vs, q, qo_indptr = paged_batch(rng, qo, kv, 4, 4, 1, 8, 8)
    out, lse = attn.batch_attention(q, qo_indptr, cache, ids, causal=True, return_lse=True)
    # causal with kv_len < qo_len: rows i < qo_len - kv_len see no key; kv_len 0: every row.
    assert not out[0:2].any() and np.all(lse[0:2] == -np.inf) and np.all(lse[4:7] == -np.inf)
    assert np.all(np.isfinite(lse[2:4]))
    with_sinks = attn.batch_attention(q, qo_indptr, cache, ids, causal=True, sinks=[1, 2, 3, 4], return_lse=True)
    # (the sink's logit through the kernels' base-2 units and back: float32's rounding)
    np.testing.assert_allclose(with_sinks[1][4:7], np.tile([1, 2, 3, 4], (3, 1)), rtol=1e-6)
    assert not with_sinks[0][4:7].any()
    # A tree mask, dense and packed: bitwise the same; the causal triangle as a mask is causal.
    blocks = [rng.random((a, b)) < 0.6 for a, b in zip(qo, kv)]
    dense = np.concatenate([b.ravel() for b in blocks])
    packed = [np.packbits(b.ravel(), bitorder="little") for b in blocks]
    mask_indptr = np.concatenate([[0], np.cumsum([len(p) for p in packed])])
    a = attn.batch_attention(q, qo_indptr, cache, ids, custom_mask=dense)
    b = attn.batch_attention(q, qo_indptr, cache, ids, packed_custom_mask=np.concatenate(packed),
                             mask_indptr=mask_indptr)
    np.testing.assert_array_equal(a, b)
    for r, (lo, hi) in enumerate(zip(qo_indptr, qo_indptr[1:])):
        np.testing.assert_allclose(a[lo:hi], reference_request(q[lo:hi], ks[r], vs[r], mask=blocks[r])[0], atol=2e-5)
    tri = np.concatenate([(np.arange(b)[None] <= np.arange(a)[:, None] + b - a).ravel() for a, b in zip(qo, kv)])
    np.testing.assert_allclose(attn.batch_attention(q, qo_indptr, cache, ids, custom_mask=tri), out, atol=1e-6)
    torch = pytest.importorskip("torch")
    t = attn.batch_attention(torch.from_numpy(q), torch.from_numpy(qo_indptr), cache, ids, causal=True)
    assert isinstance(t, torch.Tensor)
    np.testing.assert_array_equal(t.numpy(), out)


def test_batch_attention_quantized_pages_and_bad_metadata():
    rng = np.random.default_rng(7)
    cache, ids, ks, vs, q, qo_indptr = paged_batch(rng, [1, 2], [5, 40], 16, 2, 1, 32, 32)
    k_pages, v_pages = cache.pages()
    kv_indptr, kv_indices, last = cache.page_table(ids)
    meta = dict(kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last)
    f16 = attn.batch_attention(q, qo_indptr, (k_pages.astype(np.float16), v_pages.astype(np.float16)), **meta)
    f32 = attn.batch_attention(q, qo_indptr, (k_pages.astype(np.float16).astype(np.float32),
                                              v_pages.astype(np.float16).astype(np.float32)), **meta)
    np.testing.assert_allclose(f16, f32, atol=1e-6)
    q8 = attn.batch_attention(q, qo_indptr, (attn.quantize(k_pages, "q8_0"), attn.quantize(v_pages, "q8_0")), **meta)
    np.testing.assert_allclose(q8, attn.batch_attention(q, qo_indptr, (k_pages, v_pages), **meta), atol=0.05)
    kq4, vq4 = attn.quantize(k_pages, "q4_0"), attn.quantize(v_pages, "q4_0")  # read as stored: float32 rounding
    np.testing.assert_allclose(attn.batch_attention(q, qo_indptr, (kq4, vq4), **meta),
                               attn.batch_attention(q, qo_indptr, (kq4.dequantize(), vq4.dequantize()), **meta),
                               rtol=1e-5, atol=1e-6)
    far = kv_indices.copy()
    far[-1] = 99
    bad = [(dict(kv_indices=far), "kv_indices must be below num_pages = 6, got page 99"),
           (dict(kv_indptr=np.array([0, 3, 1], np.int32)), "kv_indptr must not decrease"),
           (dict(kv_last_page_len=np.array([0, 8], np.int32)), r"kv_last_page_len\[0\] must be in \[1, page_size = 16\]"),
           (dict(kv_last_page_len=np.array([5, 17], np.int32)), r"kv_last_page_len\[1\]")]
    for change, message in bad:
        with pytest.raises(ValueError, match=message):
            attn.batch_attention(q, qo_indptr, (k_pages, v_pages), **{**meta, **change})
    with pytest.raises(ValueError, match="qo_indptr must not decrease"):
        attn.batch_attention(q, [0, 2, 1], cache, ids)
    with pytest.raises(KeyError):
        attn.batch_attention(q, qo_indptr, cache, [ids[0], 12345])


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [3, 16])
def test_batch_attention_int8_over_q8_0_pages_rounds_the_queries(layout, page_size):
    """precision="int8" over q8_0 pages: decode's q·k takes q rounded to q8_0, as
    attention's does, through page runs of any length: the float64 attention of the
    rounded queries to float32 rounding, which float32 precision is not."""
    rng = np.random.default_rng(8)
    hq, hkv, d = 8, 2, 64
    qo, kv = [1, 2, 1], [1300, 700, 40]
    pages = [-(-n // page_size) for n in kv]
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    kv_indices = rng.permutation(sum(pages)).astype(np.int32)
    last = np.array([n - (p - 1) * page_size for n, p in zip(kv, pages)], np.int32)
    shape = (sum(pages), page_size, hkv, d) if layout == "NHD" else (sum(pages), hkv, page_size, d)
    kq, vq = (attn.quantize(rng.standard_normal(shape).astype(np.float32), "q8_0") for _ in range(2))
    q = rng.standard_normal((sum(qo), hq, d)).astype(np.float32)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    meta = dict(kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last, layout=layout, causal=True)
    out = attn.batch_attention(q, qo_indptr, (kq, vq), precision="int8", **meta)
    f32 = attn.batch_attention(q, qo_indptr, (kq, vq), **meta)
    rounded = attn.quantize(q, "q8_0").dequantize()
    pools = [x.dequantize() if layout == "NHD" else x.dequantize().transpose(0, 2, 1, 3) for x in (kq, vq)]
    f32_off = 0.0
    for r, (a, b) in enumerate(zip(qo_indptr, qo_indptr[1:])):
        k, v = (x[kv_indices[kv_indptr[r]:kv_indptr[r + 1]]].reshape(-1, hkv, d)[:kv[r]] for x in pools)
        want = reference_request(rounded[a:b], k, v, causal=True)[0]
        np.testing.assert_allclose(out[a:b], want, atol=2e-6, err_msg=f"request {r}")
        f32_off = max(f32_off, np.abs(f32[a:b] - want).max())
    assert f32_off > 1e-4


# ---------------------------------------------------------------------------
# The layer serving N requests through one paged cache.

@pytest.mark.parametrize("config", [dict(rope=True), dict(alibi=True, num_kv_heads=2), dict(sinks=True, rope=True)])
def test_layer_serves_requests_as_each_alone(config):
    rng = np.random.default_rng(8)
    m = attn.MultiHeadAttention(32, 4, seed=1, **config)
    kv_heads = config.get("num_kv_heads", 4)
    cache = attn.PagedKVCache(128, 8, kv_heads, 8, dtype="f32")
    prompts = [rng.standard_normal((n, 32)).astype(np.float32) for n in (7, 1, 20, 12)]
    ids = [cache.add_sequence() for _ in prompts]
    alone = [m.new_cache() for _ in prompts]
    # Chunked prefill: two chunks of every prompt, then decode steps with
    # requests finishing and a new one arriving.
    feeds = [[p[: len(p) // 2], p[len(p) // 2:]] for p in prompts]
    for step in range(5):
        active = [i for i in range(len(ids)) if not (step >= 3 and i == 1)]  # request 1 finishes after step 2
        chunks = [feeds[i][step] if step < 2 else rng.standard_normal((1, 32)).astype(np.float32) for i in active]
        cu = np.concatenate([[0], np.cumsum([len(c) for c in chunks])])
        out, weights = m(np.concatenate(chunks), cache=cache, seq_ids=[ids[i] for i in active], cu_seqlens=cu,
                         causal=True, need_weights=False)
        assert weights is None
        for i, c, a, b in zip(active, chunks, cu, cu[1:]):
            want, _ = m(c, cache=alone[i], causal=True, need_weights=False)
            np.testing.assert_allclose(out[a:b], want, atol=2e-5, err_msg=f"step {step} request {i}")
        if step == 2:
            cache.remove(ids[1])
    assert cache.length(ids[0]) == 7 + 3 and cache.pages_in_use() == sum(-(-cache.length(s) // 8) for s in
                                                                          (ids[0], ids[2], ids[3]))


def test_layer_serves_int4_pages_as_each_sequence_over_its_own_int4_cache():
    rng = np.random.default_rng(9)
    m = attn.MultiHeadAttention(128, 4, num_kv_heads=2, rope=True, seed=1)
    cache = attn.PagedKVCache(32, 32, 2, 32, dtype="int4", layout="HND")
    prompts = [rng.standard_normal((n, 128)).astype(np.float32) for n in (40, 1, 33)]
    ids = [cache.add_sequence() for _ in prompts]
    alone = [m.new_cache(dtype="int4") for _ in prompts]
    for step in range(4):  # the prompts, then decode steps across groups' ends
        chunks = [p if step == 0 else rng.standard_normal((1, 128)).astype(np.float32) for p in prompts]
        cu = np.concatenate([[0], np.cumsum([len(c) for c in chunks])])
        out, _ = m(np.concatenate(chunks), cache=cache, seq_ids=ids, cu_seqlens=cu, causal=True, need_weights=False)
        for i, (c, a, b) in enumerate(zip(chunks, cu, cu[1:])):
            want, _ = m(c, cache=alone[i], causal=True, need_weights=False)
            np.testing.assert_allclose(out[a:b], want, atol=2e-5, err_msg=f"step {step} request {i}")


def test_layer_serving_refuses():
    m = attn.MultiHeadAttention(16, 2)
    cache = attn.PagedKVCache(4, 4, 2, 8)
    s = cache.add_sequence()
    x = np.zeros((3, 16), np.float32)
    with pytest.raises(ValueError, match="need_weights must be False"):
        m(x, cache=cache, seq_ids=[s], cu_seqlens=[0, 3])
    with pytest.raises(ValueError, match="cu_seqlens gives"):
        m(x, cache=cache, seq_ids=[s], need_weights=False)
    with pytest.raises(TypeError, match="seq_ids go with cache=attn.PagedKVCache"):
        m(x, cache=m.new_cache(), seq_ids=[s], cu_seqlens=[0, 3], need_weights=False)
    with pytest.raises(RuntimeError, match="needs 5 pages, 4 free"):
        m(np.zeros((17, 16), np.float32), cache=cache, seq_ids=[s], cu_seqlens=[0, 17], need_weights=False)
    assert cache.length(s) == 0


def test_cascade_equals_dense():
    """A shared prefix attended once by every request's queries, each suffix apart, merged."""
    rng = np.random.default_rng(9)
    cache = attn.PagedKVCache(64, 4, 2, 16)
    prefix = cache.add_sequence()
    p = rng.standard_normal((21, 2, 16)).astype(np.float32)
    cache.append([prefix], p, p, [0, 21])
    suffixes, wholes, qo = [], [], [3, 1, 5]
    for n in (6, 2, 9):
        s, w = cache.add_sequence(), cache.add_sequence()
        t = rng.standard_normal((n, 2, 16)).astype(np.float32)
        cache.append([s, w], np.concatenate([t, p, t]), np.concatenate([t, p, t]), [0, n, 2 * n + 21])
        suffixes.append(s), wholes.append(w)
    q = rng.standard_normal((sum(qo), 6, 16)).astype(np.float32)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)])
    shared, s_shared = attn.batch_attention(q, [0, sum(qo)], cache, [prefix], return_lse=True)
    own, s_own = attn.batch_attention(q, qo_indptr, cache, suffixes, causal=True, return_lse=True)
    out, lse = attn.merge_state(shared, s_shared, own, s_own)
    dense, dense_lse = attn.batch_attention(q, qo_indptr, cache, wholes, causal=True, return_lse=True)
    np.testing.assert_allclose(out, dense, atol=2e-6)
    np.testing.assert_allclose(lse, dense_lse, atol=2e-6)


def test_int4_cache_serves_the_values_it_holds_and_pickles_its_tails():
    import pickle
    rng = np.random.default_rng(12)
    cache = attn.PagedKVCache(16, 32, 2, 32, dtype="int4", layout="HND")
    a, b = cache.add_sequence(), cache.add_sequence()
    keys = {a: rng.standard_normal((45, 2, 32)), b: rng.standard_normal((7, 2, 32))}
    values = {s: rng.standard_normal(k.shape) for s, k in keys.items()}
    cache.append([a, b], np.concatenate([keys[a], keys[b]]), np.concatenate([values[a], values[b]]), [0, 45, 52])
    q = rng.standard_normal((13, 4, 32)).astype(np.float32)
    got = attn.batch_attention(q, [0, 1, 13], cache, [a, b], causal=True)
    for s, rows in ((a, slice(0, 1)), (b, slice(1, 13))):
        # What int4 holds: attn.quantize's blocks, checked against NumPy's q4_1 in test_kv_storage.
        held = [attn.quantize(np.float32(x).transpose(1, 0, 2), "int4", per=per).dequantize().transpose(1, 0, 2)
                for x, per in ((keys[s], "channel"), (values[s], "token"))]
        np.testing.assert_allclose(got[rows], reference_request(q[rows], *held, causal=True)[0], atol=2e-5)
    assert cache.nbytes == 3 * (32 // 32 * 32 + 32 * 32 // 32) * 2 * 20 + (13 + 7) * 2 * 32 * 4
    clone = pickle.loads(pickle.dumps(cache))  # with b's float32 tail: its next append quantizes the same group
    more = rng.standard_normal((3, 2, 32))
    for c in (cache, clone):
        c.append([b], more, more, [0, 3])
    np.testing.assert_array_equal(attn.batch_attention(q, [0, 1, 13], clone, [a, b]),
                                  attn.batch_attention(q, [0, 1, 13], cache, [a, b]))
    with pytest.raises(TypeError, match="sparse_attention reads keys token by token"):
        attn.sparse_attention(q[:1], [0, 1], cache, [a], np.zeros((1, 2, 1), np.int32))


def test_int4_pools_in_hnd_pages_are_quantized_per_page_and_read_as_they_hold():
    rng = np.random.default_rng(13)
    hq, hkv, d, page = 4, 2, 64, 32
    kv_lens, qo_lens = [70, 1, 40], [1, 12, 3]
    kv_indptr = np.concatenate([[0], np.cumsum([-(-n // page) for n in kv_lens])]).astype(np.int32)
    pages = int(kv_indptr[-1])
    kv_indices = rng.permutation(pages + 1)[:pages].astype(np.int32)
    last = np.array([n - (-(-n // page) - 1) * page for n in kv_lens], np.int32)
    k_pool = rng.standard_normal((pages + 1, hkv, page, d)).astype(np.float32)  # HND
    v_pool = rng.standard_normal((pages + 1, hkv, page, d)).astype(np.float32)
    kq, vq = attn.quantize(k_pool, "int4", per="channel"), attn.quantize(v_pool, "int4", per="token")
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    q = rng.standard_normal((qo_indptr[-1], hq, d)).astype(np.float32)
    out = attn.batch_attention(q, qo_indptr, (kq, vq), kv_indptr=kv_indptr, kv_indices=kv_indices,
                               kv_last_page_len=last, layout="HND", causal=True)
    k_held, v_held = kq.dequantize(), vq.dequantize()  # each page's groups of 32 keys, per channel
    for r, n in enumerate(kv_lens):
        rows = kv_indices[kv_indptr[r]:kv_indptr[r + 1]]
        k = np.concatenate([k_held[p].transpose(1, 0, 2) for p in rows])[:n]
        v = np.concatenate([v_held[p].transpose(1, 0, 2) for p in rows])[:n]
        want = reference_request(q[qo_indptr[r]:qo_indptr[r + 1]], k, v, causal=True)[0]
        np.testing.assert_allclose(out[qo_indptr[r]:qo_indptr[r + 1]], want, atol=2e-5, err_msg=f"request {r}")
    with pytest.raises(ValueError, match=r"k_pages must be int4 key groups \(num_pages, page_size / 32"):
        attn.batch_attention(q, qo_indptr, (attn.quantize(k_pool.transpose(0, 2, 1, 3), "int4", per="channel"),
                                            attn.quantize(v_pool.transpose(0, 2, 1, 3), "int4", per="token")),
                             kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last, layout="NHD")
