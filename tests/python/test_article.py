"""attn against the article's own NumPy code, and the article's claims."""
import itertools

import numpy as np
import pytest

import attn
import article
from util import rel_err

SHAPES = [(1, 1, 1), (5, 8, 4), (5, 8, 1), (5, 8, 8), (7, 12, 3), (16, 64, 8),
          (33, 48, 6), (2, 10, 5), (100, 32, 4)]


@pytest.mark.parametrize("n,d,heads", SHAPES)
def test_multi_head_matches_article(n, d, heads):
    rng = np.random.default_rng(n * 1000 + d)
    x = rng.random((n, d))
    expected = article.multi_head(x, heads)
    got64 = attn.multi_head(x, heads)
    assert got64.dtype == np.float64
    assert rel_err(got64, expected) <= 1e-12
    got32 = attn.multi_head(x.astype(np.float32), heads)
    assert got32.dtype == np.float32
    assert rel_err(got32, expected) <= 2e-5


@pytest.mark.parametrize("nq,nk,d,dv", [(1, 1, 1, 1), (5, 5, 8, 8), (3, 9, 7, 2), (9, 3, 16, 5)])
def test_attention_matches_article(nq, nk, d, dv):
    rng = np.random.default_rng(nq + 10 * nk + 100 * d)
    q, k, v = rng.normal(size=(nq, d)), rng.normal(size=(nk, d)), rng.normal(size=(nk, dv))
    expected = article.attention(q, k, v)
    assert rel_err(attn.attention(q, k, v), expected) <= 1e-12
    f32 = [a.astype(np.float32) for a in (q, k, v)]
    assert rel_err(attn.attention(*f32), expected) <= 2e-5


@pytest.mark.parametrize("shape", [(1,), (7,), (4, 9), (2, 3, 17)])
def test_softmax_matches_article(shape):
    a = np.random.default_rng(len(shape)).normal(scale=5, size=shape)
    assert rel_err(attn.softmax(a), article.softmax(a)) <= 1e-12
    assert rel_err(attn.softmax(a.astype(np.float32)), article.softmax(a)) <= 2e-6


@pytest.mark.parametrize("n,d", [(5, 8), (1, 1), (50, 17), (128, 64), (0, 4), (3, 3)])
def test_positional_encoding_matches_article(n, d):
    expected = article.positional_encoding(n, d)
    pe64 = attn.positional_encoding(n, d, dtype=np.float64)
    assert pe64.shape == (n, d) and pe64.dtype == np.float64
    np.testing.assert_allclose(pe64, expected, rtol=0, atol=1e-13)
    pe32 = attn.positional_encoding(n, d)
    assert pe32.dtype == np.float32
    np.testing.assert_allclose(pe32, expected, rtol=0, atol=1e-7)


def test_readme_example():
    assert attn.multi_head(np.random.rand(5, 8), 4).shape == (5, 8)


# The article: "猫咬狗" and "狗咬猫" give the same attention outputs, until
# position is encoded.
WORDS = {"猫": 0, "咬": 1, "狗": 2}


def sentence(vectors, text):
    return np.stack([vectors[WORDS[w]] for w in text])


def rope_per_head(x, heads=4):
    n, d = x.shape
    per_head = x.reshape(n, heads, d // heads).transpose(1, 0, 2)
    return attn.rope(per_head).transpose(1, 0, 2).reshape(n, d)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cat_bites_dog_is_dog_bites_cat_without_positions(dtype):
    vectors = np.random.default_rng(7).random((3, 8)).astype(dtype)
    a, b = sentence(vectors, "猫咬狗"), sentence(vectors, "狗咬猫")
    ya, yb = attn.multi_head(a, 4), attn.multi_head(b, 4)
    # each word's output is the same in both sentences: rows are just permuted
    assert np.abs(ya - yb[::-1]).max() <= 1e-6

    pe = attn.positional_encoding(3, 8, dtype=dtype)
    ya, yb = attn.multi_head(a + pe, 4), attn.multi_head(b + pe, 4)
    assert np.abs(ya - yb[::-1]).max() > 1e-3

    ya, yb = attn.multi_head(rope_per_head(a), 4), attn.multi_head(rope_per_head(b), 4)
    assert np.abs(ya - yb[::-1]).max() > 1e-3


@pytest.mark.parametrize("n", [3, 6, 20])
def test_permuting_rows_permutes_outputs(n):
    rng = np.random.default_rng(n)
    x = rng.random((n, 8)).astype(np.float32)
    for perm in itertools.islice((rng.permutation(n) for _ in itertools.count()), 5):
        assert np.abs(attn.multi_head(x[perm], 4) - attn.multi_head(x, 4)[perm]).max() <= 1e-6
        pe = attn.positional_encoding(n, 8)
        moved = np.abs(attn.multi_head(x[perm] + pe, 4) - attn.multi_head(x + pe, 4)[perm]).max()
        assert moved > 1e-3 or (perm == np.arange(n)).all()
