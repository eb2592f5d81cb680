"""What the web page must show, computed through attn's Python module
independently of the page's bindings (web/attn_web.cc): the token vectors
from their formula, positions added or applied here, attention through
attn.multi_head and attn.attention. Prints one JSON object for
tests/web/page_test.mjs. Usage: expected.py SENTENCE_A SENTENCE_B HEADS QUERY
(space-separated tokens; QUERY: the query token whose head-1 weights the
page shows as bars)."""
import json
import os
import sys

sys.path.insert(0, os.environ["ATTN_PYTHONPATH"])
import numpy as np  # noqa: E402
import attn  # noqa: E402

DIM = 16
MASK = (1 << 64) - 1


def token_vector(token):
    """FNV-1a of the UTF-8 bytes, then SplitMix64, 24 bits a value."""
    state = 0xCBF29CE484222325
    for byte in token.encode("utf-8"):
        state = ((state ^ byte) * 0x100000001B3) & MASK
    values = []
    for _ in range(DIM):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        values.append((z >> 40) / float(1 << 24))
    return values


def heads_of(x, heads):
    """(n, d) -> (heads, n, d / heads): each head's slice."""
    n = x.shape[0]
    return np.ascontiguousarray(x.reshape(n, heads, DIM // heads).transpose(1, 0, 2))


def run(tokens, heads, encoding):
    """Outputs (n, d) and weights (heads, n, n) of multi_head as the page runs it."""
    x = np.array([token_vector(t) for t in tokens], dtype=np.float32)
    n = len(tokens)
    slopes = None
    if encoding == "sinusoidal":
        x = x + attn.positional_encoding(n, DIM)
    elif encoding == "rope":
        x = attn.rope(heads_of(x, heads)).transpose(1, 0, 2).reshape(n, DIM)
    elif encoding == "alibi":
        slopes = np.array(attn.alibi_slopes(heads), dtype=np.float64)
    q = heads_of(np.ascontiguousarray(x, dtype=np.float32), heads)
    out, weights = attn.attention(q, q, q, alibi_slopes=slopes, return_weights=True)
    out = out.transpose(1, 0, 2).reshape(n, DIM)
    if encoding != "alibi":  # the article's multi_head gives the same outputs
        assert np.allclose(out, attn.multi_head(np.ascontiguousarray(x), heads), rtol=0, atol=1e-6)
    return out, weights


def main():
    a, b = sys.argv[1].split(), sys.argv[2].split()
    heads, query = int(sys.argv[3]), int(sys.argv[4])
    result = {}
    for encoding in ["none", "sinusoidal", "rope", "alibi"]:
        out_a, weights_a = run(a, heads, encoding)
        out_b, _ = run(b, heads, encoding)
        taken, largest = set(), 0.0
        for i, token in enumerate(a):
            j = next((j for j, t in enumerate(b) if t == token and j not in taken), None)
            if j is not None:
                taken.add(j)
                largest = max(largest, float(np.max(np.abs(out_a[i].astype(np.float64) - out_b[j]))))
        result[encoding] = {"max_difference": largest, "bars": weights_a[0, query].astype(float).tolist()}
    print(json.dumps(result))


main()
