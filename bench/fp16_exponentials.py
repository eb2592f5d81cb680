#!/usr/bin/python3
"""Would bf16 precision's exponentials be accurate enough in fp16 arithmetic?

bf16 precision (docs/semantics.md "Precision") turns each score row x - m
(base 2, m the row's max) into P = bf16(2^(x - m)) by a degree-3 polynomial
in float32 (src/kernels/exp2-inl.h), and sums the unrounded 2^(x - m). This
simulates that in NumPy, and the same with the range reduction and the
polynomial in fp16 arithmetic (AVX512_FP16's 32 lanes), on bf16-rounded N(0, 1)
inputs, and prints each one's relative Frobenius error against float64
attention (docs/performance.md, "AVX512_FP16 exponentials").

    /usr/bin/python3 bench/fp16_exponentials.py
"""
import numpy as np

POLY = (5.500892922e-2, 2.422109693e-1, 6.932829022e-1, 1.0)  # exp2-inl.h, kForBF16


def bf16(a):
    """float32 rounded to bf16 (nearest, ties to even), as float32."""
    bits = np.asarray(a, np.float32).copy().view(np.uint32)
    bits += 0x7FFF + ((bits >> 16) & 1)
    bits &= 0xFFFF0000
    return bits.view(np.float32)


def exp2(x, dtype):
    """2^x by rounding, the polynomial (fused multiply-adds: one rounding
    each) and 2^n as an exponent field, every step in `dtype`; results below
    its smallest normal number flush to 0, as an exponent field cannot hold
    them."""
    x = x.astype(dtype)
    n = np.round(x)
    f = (x - n).astype(dtype)
    p = dtype(POLY[0])
    for c in POLY[1:]:
        p = (p.astype(np.float64) * f + c).astype(dtype)
    e = (p * np.exp2(n).astype(dtype)).astype(dtype)
    return np.where(n < np.log2(np.finfo(dtype).tiny), 0, e).astype(np.float32)


def main():
    rng = np.random.default_rng(1)
    for n, d in [(1024, 64), (4096, 64), (2048, 128)]:
        q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
        s = q @ k.T / np.sqrt(d)
        w = np.exp(s - s.max(1, keepdims=True))
        exact = (w / w.sum(1, keepdims=True)) @ v
        scores = (bf16(q) @ bf16(k).T) * np.float32(np.log2(np.e) / np.sqrt(d))
        x = (scores - scores.max(1, keepdims=True)).astype(np.float32)
        for name, dtype in [("float32", np.float32), ("fp16", np.float16)]:
            e = exp2(x, dtype)
            out = (bf16(e).astype(np.float64) @ bf16(v).astype(np.float64)) / e.sum(1, keepdims=True, dtype=np.float32)
            error = np.linalg.norm(out - exact) / np.linalg.norm(exact)
            print(f"n={n} d={d} 2^x in {name:8s} relative error {error:.3e}")


if __name__ == "__main__":
    main()
