#!/usr/bin/python3
"""The model of docs/scaling.md: context-parallel attention over W machines,
from a machine's attention rate (attn bench attention), a network's bandwidth
and latency. Prints the doc's tables (markdown).

    tools/scaling_model.py --rate 94 --bandwidth 12.5 --latency 5

Ring (per step, each machine): compute c = 4·b_q·b_k·d·Hq / rate on the pairs
it computes, transfer x = latency + 2·b_k·d·Hkv·bytes / bandwidth, overlapped
(attn's ring hides 98-99% of the transfer on this machine): a step takes
max(c, x). Contiguous causal: the last rank computes half a block and W - 1
whole ones, the first rank half a block. Zigzag causal: every rank half a
block every step. Ulysses: the two all-to-alls (q, k, v out; the output
back) are not overlapped: latency·(W - 1) + bytes·(W - 1)/W / bandwidth
each, plus the whole sequence's work on Hq / W heads.
"""
import argparse


def ring_seconds(n, w, causal, zigzag, m):
    b = n / w
    c = 4 * b * b * m.d * m.heads / (m.rate * 1e9)  # one whole block
    x = m.latency * 1e-6 + 2 * b * m.d * m.kv_heads * m.bytes / (m.bandwidth * 1e9)
    if w == 1:
        return c / 2 if causal else c
    if not causal:
        return c + (w - 1) * max(c, x)
    if zigzag:
        return c / 2 + (w - 1) * max(c / 2, x)
    return c / 2 + (w - 1) * max(c, x)


def ulysses_seconds(n, w, causal, m):
    work = 4 * n * n * m.d * m.heads / (m.rate * 1e9) / w * (0.5 if causal else 1)
    if w == 1:
        return work
    b = n / w
    out = b * m.d * (m.heads + 2 * m.kv_heads) * m.bytes  # q, k, v to the others
    back = b * m.d * m.heads * m.bytes                    # the output home
    comm = 2 * (w - 1) * m.latency * 1e-6 + (out + back) * (w - 1) / w / (m.bandwidth * 1e9)
    return work + comm


def memory_gib(n, w, m, strategy):
    b = n / w
    local = b * m.d * (2 * m.heads + 2 * m.kv_heads) * m.bytes  # q, out, k, v
    if strategy == "ring":
        extra = 2 * 2 * b * m.d * m.kv_heads * m.bytes + b * m.heads * (m.d + 1) * 8  # blocks in flight, merge
    else:
        extra = 2 * local  # the gathered arrays and the all-to-all buffers
    return (local + extra) / 2**30


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, required=True, help="GFLOP/s of one machine (attn bench attention)")
    p.add_argument("--bandwidth", type=float, default=12.5, help="GB/s per machine (100 Gb/s = 12.5)")
    p.add_argument("--latency", type=float, default=5.0, help="microseconds per message")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--bytes", type=int, default=4, help="bytes per K/V value (4: float32, 2: bf16)")
    m = p.parse_args()
    # The block size from which a step's transfer hides under its computation.
    whole = m.kv_heads * m.bytes * m.rate * 1e9 / (2 * m.heads * m.bandwidth * 1e9)
    print(f"ring: transfer <= compute from b = {whole:.0f} tokens per rank (non-causal), "
          f"{2 * whole:.0f} (zigzag causal, half a block per step)\n")
    ws = [2, 4, 8, 16, 32, 64]
    print("| n | strategy | layout | causal | " + " | ".join(f"W={w}" for w in ws) + " |")
    print("|---|---|---|---|" + "---|" * len(ws))
    for n in (131072, 262144, 1048576):
        rows = [("ring", "contiguous", False), ("ring", "contiguous", True), ("ring", "zigzag", True),
                ("ulysses", "contiguous", False), ("ulysses", "contiguous", True)]
        for strategy, layout, causal in rows:
            one = ring_seconds(n, 1, causal, False, m)
            cells = []
            for w in ws:
                if strategy == "ulysses" and m.kv_heads % w:
                    cells.append("—")
                    continue
                t = (ring_seconds(n, w, causal, layout == "zigzag", m) if strategy == "ring"
                     else ulysses_seconds(n, w, causal, m))
                cells.append(f"{100 * one / (w * t):.0f}%")
            print(f"| {n // 1024}k | {strategy} | {layout} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
    print("\nmemory per machine (GiB), ring / Ulysses:\n")
    print("| n | " + " | ".join(f"W={w}" for w in ws) + " |")
    print("|---|" + "---|" * len(ws))
    for n in (131072, 262144, 1048576):
        print(f"| {n // 1024}k | " + " | ".join(
            f"{memory_gib(n, w, m, 'ring'):.1f} / {memory_gib(n, w, m, 'ulysses'):.1f}" for w in ws) + " |")


if __name__ == "__main__":
    main()
