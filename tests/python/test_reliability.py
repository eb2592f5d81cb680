"""docs/semantics.md "Numeric edge cases" through the Python module, and calls from many Python threads."""
import threading

import numpy as np
import pytest

import attn

from util import run_python


def rows(n, d, seed):
    return np.random.default_rng(seed).uniform(-1, 1, (n, d))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_k", [50, 1100])  # 1100 keys and few queries: the decode kernel
def test_edge_cases(dtype, n_k):
    q, k, v = rows(4, 8, 1).astype(dtype), rows(n_k, 8, 2).astype(dtype), rows(n_k, 3, 3).astype(dtype)
    clean = attn.attention(q, k, v)
    # NaN in query row 2: that row is NaN, the others unchanged (bitwise).
    q_nan = q.copy()
    q_nan[2, 5] = np.nan
    got = attn.attention(q_nan, k, v)
    assert np.isnan(got[2]).all()
    np.testing.assert_array_equal(np.delete(got, 2, 0), np.delete(clean, 2, 0))
    # +inf logits share the weight: two keys at +inf along feature 0, a query
    # looking their way gets their values' mean.
    k_inf = k.copy()
    k_inf[[7, 9]] = 0
    k_inf[[7, 9], 0] = np.inf
    q_pos = q.copy()
    q_pos[:, 0] = 1
    np.testing.assert_allclose(attn.attention(q_pos, k_inf, v), np.tile(v[[7, 9]].mean(0), (4, 1)),
                               rtol=1e-6)
    # A row with every key masked, and no keys at all: zeros.
    mask = np.ones((4, n_k), bool)
    mask[1] = False
    out = attn.attention(q, k, v, mask=mask)
    assert (out[1] == 0).all()
    np.testing.assert_allclose(np.delete(out, 1, 0), np.delete(clean, 1, 0), rtol=1e-5, atol=1e-6)
    assert (attn.attention(q, k[:0], v[:0]) == 0).all()
    # d = 0: every logit is 0, each row the mean of the values.
    np.testing.assert_allclose(attn.attention(q[:, :0], k[:, :0], v), np.tile(v.mean(0), (4, 1)),
                               rtol=1e-5)
    # Logits of 1e30: the best key's value.
    best = np.argmax(q.astype(np.float64) @ k.T.astype(np.float64), axis=1)
    np.testing.assert_array_equal(attn.attention(q, k, v, scale=1e30), v[best])


def test_eight_python_threads_get_the_serial_results():
    problems = [(rows(5 + t, 16, t), rows(600 + 40 * t, 16, t + 10), rows(600 + 40 * t, 4, t + 20))
                for t in range(8)]
    problems = [tuple(a.astype(np.float32) for a in p) for p in problems]
    serial = [attn.attention(*p, causal=True) for p in problems]
    layer = attn.MultiHeadAttention(16, 4, num_kv_heads=2, rope=True, seed=3)
    xs = [rows(30 + t, 16, 40 + t).astype(np.float32)[None] for t in range(8)]

    def by_chunks(x):
        cache = layer.new_cache()
        return np.concatenate([layer(x[:, i:i + 7], cache=cache, causal=True)[0]
                               for i in range(0, x.shape[1], 7)], axis=1)

    serial_layer = [by_chunks(x) for x in xs]
    results = [None] * 8

    def work(t):
        results[t] = [(attn.attention(*problems[t], causal=True), by_chunks(xs[t])) for _ in range(3)]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in range(8):
        for out, layer_out in results[t]:
            np.testing.assert_array_equal(out, serial[t])
            np.testing.assert_array_equal(layer_out, serial_layer[t])


# A process that ran attn (its threads started), then forked: the child's
# calls hung for ever, waiting for threads a child does not have. Each way
# Python forks, in a fresh interpreter that a hang cannot stall (timeout).
FORK_CHILD = """
import multiprocessing, os, sys
import numpy as np
import attn
attn.set_num_threads(2)
q = np.random.default_rng(0).normal(size=(4, 300, 32)).astype(np.float32)
layer = attn.MultiHeadAttention(128, 4, seed=1)
x = q.transpose(1, 0, 2).reshape(1, 300, 128)
packed, cu = np.ascontiguousarray(q.transpose(1, 0, 2)), np.array([0, 100, 300])

def every_entry_point():
    # Each runs on the library's threads: attention, its backward, packed
    # sequences, and the layer (its projections and attention).
    return (attn.attention(q, q, q, causal=True), *attn.attention_backward(q, q, q, q, causal=True),
            attn.attention_varlen(packed, packed, packed, cu, cu, causal=True),
            layer(x, causal=True, need_weights=False)[0])

expected = every_entry_point()  # the pool starts here

def same(_=None):
    return all((a == b).all() for a, b in zip(every_entry_point(), expected))

def same_after_setting_threads(n):
    attn.set_num_threads(n)
    return same()
"""


@pytest.mark.parametrize("how", [
    "pid = os.fork()\n"
    "if pid == 0:\n    os._exit(0 if same() else 1)\n"
    "_, status = os.waitpid(pid, 0)\nprint('ok' if status == 0 else f'child status {status}')\n",
    "with multiprocessing.get_context('fork').Pool(2) as p:\n"
    "    print('ok' if all(p.map(same, range(4))) else 'wrong')\n",
    "with multiprocessing.get_context('fork').Pool(2) as p:\n"
    "    print('ok' if all(p.map(same_after_setting_threads, [1, 2, 3, 5])) else 'wrong')\n",
], ids=["os.fork", "multiprocessing", "multiprocessing_set_num_threads"])
def test_a_forked_child_runs_attn(how):
    r = run_python(FORK_CHILD + how, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_four_threads_sharing_one_cache_get_an_error_not_a_crash():
    """One KVCache fed by four threads at once segfaulted or lost tokens: each
    forward now runs whole or raises RuntimeError, and the cache holds the
    tokens of those that ran, as a serial run of as many holds them."""
    r = run_python("""
import threading
import numpy as np
import attn
attn.set_num_threads(2)
layer = attn.MultiHeadAttention(64, 8, num_kv_heads=2, seed=1)
chunk = np.random.default_rng(2).normal(size=(1, 64, 64)).astype(np.float32)
cache = layer.new_cache()
counts = {"ran": 0, "refused": 0}
other = []
start = threading.Barrier(4)
lock = threading.Lock()

def feed():
    start.wait()
    for _ in range(25):
        try:
            layer(chunk, cache=cache, need_weights=False)
            key = "ran"
        except RuntimeError as e:
            if "the cache is in use by another thread" not in str(e):
                other.append(repr(e))
                continue
            key = "refused"
        except Exception as e:
            other.append(repr(e))
            continue
        with lock:
            counts[key] += 1

threads = [threading.Thread(target=feed) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
assert not other, other[:3]
assert counts["ran"] + counts["refused"] == 100, counts
assert cache.length == 64 * counts["ran"], (cache.length, counts)
serial = layer.new_cache()
for _ in range(counts["ran"]):
    layer(chunk, cache=serial, need_weights=False)
a = layer(chunk, cache=serial, need_weights=False)[0]
b = layer(chunk, cache=cache, need_weights=False)[0]
assert (a == b).all()
print("ok", counts)
""", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ok")
