#!/usr/bin/python3
"""attn against its peers on one machine, in one run.

The article's self-attention (multi_head: each head's slice of x is its own
query, key and value) at n tokens, model width 512, 8 heads of 64, through:
  - attn (float32 fast path, all cores)
  - the article's NumPy code, verbatim
  - PyTorch 1.13 at its best: torch.set_num_threads(cores), AVX-512 kernels,
    matmul + softmax per head batch
  - attn's double-precision reference (float64 input)
and the learnable layer: attn.MultiHeadAttention against torch.nn.MultiheadAttention
with the same weights; then attn.attention against PyTorch's matmul + softmax
at every head dim of `attn bench attention --sweep` (16 to 256).

attn comes from build/python (or $ATTN_PYTHONPATH). Run it through `make bench`,
which sets ATEN_CPU_CAPABILITY=avx512 and lets OpenBLAS detect the CPU itself
(unsets OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE) for this command only;
bench/report.py uses peer_seconds for the tables of the docs.
"""
import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("ATTN_PYTHONPATH", os.path.join(HERE, "..", "build", "python")))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import attn  # noqa: E402
import article  # noqa: E402
import torch  # noqa: E402


def median_seconds(fn, repeats, min_seconds=1.0):
    fn()  # warm up
    times = []
    start = time.perf_counter()
    while len(times) < repeats or (time.perf_counter() - start < min_seconds and len(times) < 20):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_multi_head(x, heads):
    n, d = x.shape
    s = x.view(n, heads, d // heads).transpose(0, 1)  # (heads, n, dh)
    w = torch.softmax(s @ s.transpose(1, 2) / (d // heads) ** 0.5, dim=-1)
    return (w @ s).transpose(0, 1).reshape(n, d)


def peer_seconds(n, width, heads, repeats, reference=False):
    """Median seconds of the article's self-attention (n tokens, `width`, `heads`) through
    attn and its peers, and of attn's layer against PyTorch's, in one run: a dict with
    keys attn, numpy, torch, (reference,) attn_layer, torch_layer."""
    torch.set_num_threads(os.cpu_count())
    x = np.random.default_rng(0).random((n, width), dtype=np.float32)
    xt = torch.from_numpy(x)
    seconds = {}
    with torch.no_grad():
        seconds["attn"] = median_seconds(lambda: attn.multi_head(x, heads), repeats)
        seconds["numpy"] = median_seconds(lambda: article.multi_head(x, heads), repeats)
        seconds["torch"] = median_seconds(lambda: torch_multi_head(xt, heads), repeats)
        if reference:
            x64 = x.astype(np.float64)
            seconds["reference"] = median_seconds(lambda: attn.multi_head(x64, heads), 1, 0)
        torch.manual_seed(0)
        mha = torch.nn.MultiheadAttention(width, heads, batch_first=True).eval()
        layer = attn.MultiHeadAttention(width, heads)
        layer.load_state_dict({k: v.numpy() for k, v in mha.state_dict().items()})
        xb = x[None]
        xbt = torch.from_numpy(xb)
        seconds["attn_layer"] = median_seconds(lambda: layer(xb), repeats)
        seconds["torch_layer"] = median_seconds(lambda: mha(xbt, xbt, xbt, need_weights=False), repeats)
    return seconds


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-reference", action="store_true", help="skip the slow float64 path")
    p.add_argument("--sweep-n", type=int, default=1024, help="sequence length of the head-dim table")
    args = p.parse_args()
    n, d, h = args.n, args.width, args.heads
    flop = 4.0 * n * n * d  # 4·n²·dh·heads
    t = peer_seconds(n, d, h, args.repeats, reference=not args.skip_reference)
    rows = [("attn.multi_head (float32)", t["attn"], f"{attn_threads()} threads"),
            ("article NumPy multi_head", t["numpy"], "float32 input"),
            ("PyTorch matmul + softmax", t["torch"], f"{torch.get_num_threads()} threads, ATEN_CPU_CAPABILITY="
             f"{os.environ.get('ATEN_CPU_CAPABILITY', 'default')}")]
    if "reference" in t:
        rows.append(("attn reference (float64)", t["reference"], "plain double loops"))

    base = rows[0][1]
    print(f"# attn vs peers: self-attention n={n}, width {d}, {h} heads of {d // h}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"torch {torch.__version__}, numpy {np.__version__}\n")
    print("| implementation | median ms | GFLOP/s | attn speedup | notes |")
    print("|---|---:|---:|---:|---|")
    for name, s, note in rows:
        print(f"| {name} | {s * 1e3:.1f} | {flop / s * 1e-9:.1f} | {s / base:.1f}× | {note} |")
    layer_flop = flop + 2.0 * n * d * d * 4  # + q, k, v, out projections
    t_layer, t_mha = t["attn_layer"], t["torch_layer"]
    print(f"| attn.MultiHeadAttention | {t_layer * 1e3:.1f} | {layer_flop / t_layer * 1e-9:.1f} "
          f"| 1.0× | projections included |")
    print(f"| torch.nn.MultiheadAttention | {t_mha * 1e3:.1f} | {layer_flop / t_mha * 1e-9:.1f} "
          f"| {t_mha / t_layer:.1f}× | same weights |")
    head_dim_table(args.sweep_n, h, args.repeats)


HEAD_DIMS = (16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256)  # attn bench attention --sweep's


def head_dim_table(n, heads, repeats):
    """attn.attention against PyTorch's matmul + softmax at each head dim of
    the sweep: (heads, n, d) float32 query, key and value."""
    rng = np.random.default_rng(1)
    print(f"\n# attention at every head dim of the sweep: n={n}, {heads} heads, float32\n")
    print("| head dim | attn ms | PyTorch matmul + softmax ms | attn speedup |")
    print("|---:|---:|---:|---:|")
    for d in HEAD_DIMS:
        q, k, v = (rng.standard_normal((heads, n, d), dtype=np.float32) for _ in range(3))
        qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))

        def torch_attention():
            w = torch.softmax(qt @ kt.transpose(1, 2) / d ** 0.5, dim=-1)
            return w @ vt

        with torch.no_grad():
            t_attn = median_seconds(lambda: attn.attention(q, k, v), repeats)
            t_torch = median_seconds(torch_attention, repeats)
        print(f"| {d} | {t_attn * 1e3:.2f} | {t_torch * 1e3:.2f} | {t_torch / t_attn:.1f}× |")


def attn_threads():
    return getattr(attn, "num_threads", lambda: os.cpu_count())()


if __name__ == "__main__":
    main()
