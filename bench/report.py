#!/usr/bin/python3
"""Measure attn's headline figures and write them into the README and docs/performance.md.

    bench/report.py [--build BUILD] [--root ROOT] [--write] [--quick] [--only BLOCK,...]

Runs `BUILD/bin/attn bench ... --json` for each shape below and bench/compare.py's
peers (the article's NumPy code, PyTorch), and prints the tables. With --write it
replaces, in ROOT (default: this checkout), the text between `<!-- bench-report:NAME -->`
and `<!-- /bench-report:NAME -->`: the summary in README.md and docs/performance.md, the
prefill by head dim, the peers and serving in docs/performance.md. Nothing is written unless every
measurement succeeded and every marker is in place; each file is replaced whole (a
temporary file renamed over it). `make bench-report` runs it as `make bench` runs
compare.py: PyTorch on its AVX-512 kernels, OpenBLAS detecting the CPU itself.

Every figure is a ratio measured in one process: to the machine's own ceiling (`attn
bench` times the FMA peak or the read bandwidth in turns with the kernel) or to another
path in the same turns, so figures from a noisy shared machine still compare. --quick
runs small shapes, to check that the command works; its figures mean nothing. --only
measures and writes the blocks named (summary, head-dims, peers, serving), each of which
states its own date: after a change to one path, its tables alone, not the half hour of all.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class Shapes:
    """The shapes measured: the headline ones, and small ones for --quick."""

    def __init__(self, quick):
        self.n, self.heads = (256, 2) if quick else (4096, 8)
        self.kv_len, self.decode_heads = (2048, 2) if quick else (32768, 8)
        self.lengths = ["256", "64"] if quick else ["4096", "512", "64", "64"]
        self.grid_n = (64, 256) if quick else (512, 2048, 8192)
        self.grid_d = (16, 64) if quick else (16, 32, 64, 128, 256)
        self.peer_n, self.repeats = (256, 1) if quick else (4096, 3)
        # Serving: 32 query and 8 KV heads of 128 (quick: 4 and 2 of 64).
        self.serve_shape = (["--heads", "4", "--kv-heads", "2", "--head-dim", "64"] if quick
                            else ["--heads", "32", "--kv-heads", "8", "--head-dim", "128"])
        self.requests, self.min_len, self.max_len = (4, 64, 1024) if quick else (32, 512, 32768)
        self.verify_len, self.prefill_len = (512, 128) if quick else (8192, 2048)
        self.serve_requests = 4 if quick else 32
        # DeepSeek's attention: MLA's absorbed decode, and DSA's top-k picks (rows each).
        self.mla_len, self.mla_heads = (1024, 8) if quick else (32768, 128)
        self.sparse_len, self.topk, self.sparse_rows = (2048, 256, 2) if quick else (65536, 2048, 16)


# --quick: each bench in its 3 turns (--min-time 0), not a second's worth.
BENCH_OPTIONS = []


def bench(build, *args):
    """One `attn bench` run's JSON object."""
    command = [os.path.join(build, "bin", "attn"), "bench", *args, *BENCH_OPTIONS, "--json"]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({run.returncode}): {run.stderr.strip()}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def prefill(build, s, d, *extra):
    return bench(build, "attention", "--n", str(s.n), "--heads", str(s.heads), "--head-dim", str(d), *extra)


def decode(build, s, *extra):
    return bench(build, "decode", "--kv-len", str(s.kv_len), "--heads", str(s.decode_heads),
                 "--kv-heads", str(s.decode_heads), "--head-dim", "128", *extra)


def summary_rows(build, s):
    """(what, shape, figure) for the summary table."""
    shape = f"n = {s.n}, {s.heads} heads × "
    decode_shape = f"{s.kv_len} keys, {s.decode_heads} heads × 128, 1 query"
    rows = []
    for d in (64, 128):
        r = prefill(build, s, d)
        rows.append(("prefill, float32", shape + str(d), f"{r['ratio_to_peak']:.2f} of the FMA peak"))
    r = prefill(build, s, 64, "--causal")
    rows.append(("prefill, causal", shape + "64",
                 f"{r['ratio_to_peak']:.2f} of the FMA peak (allowed pairs); "
                 f"{r['time_vs_noncausal']:.2f}× the non-causal time"))
    for precision in ("bf16", "int8"):
        r = prefill(build, s, 64, "--precision", precision)
        rows.append((f"prefill, {precision} precision", shape + "64",
                     f"{1 / r['time_vs_f32_precision']:.2f}× float32's speed (on {r['unit']})"))
    r = prefill(build, s, 64, "--alibi")
    rows.append(("prefill with ALiBi", shape + "64", f"{r['time_vs_no_alibi']:.3f}× the time without"))
    r = bench(build, "backward", "--n", str(s.n), "--heads", str(s.heads), "--head-dim", "64")
    rows.append(("backward, float32", shape + "64",
                 f"{r['ratio_to_peak']:.2f} of the FMA peak; {r['time_vs_forward']:.2f}× the forward's time"))
    r = decode(build, s)
    rows.append(("decode, float32 K/V", decode_shape, f"{r['ratio_to_peak']:.2f} of the read bandwidth"))
    for dtype in ("bf16", "q8_0", "q4_0", "int4"):
        r = decode(build, s, "--kv-dtype", dtype)
        rows.append((f"decode, {dtype} K/V", decode_shape, f"{r['speedup_vs_f32']:.2f}× float32 K/V's speed"))
    r = decode(build, s, "--kv-dtype", "q8_0", "--precision", "int8")
    rows.append(("decode, q8_0 K/V, int8 precision", decode_shape,
                 f"{r['speedup_vs_f32']:.2f}× float32 K/V's speed; {1 / r['time_vs_f32_precision']:.2f}× "
                 f"float32 precision's (on {r['unit']})"))
    r = bench(build, "varlen", "--lengths", *s.lengths, "--causal")
    rows.append(("packed variable lengths, causal", "lengths " + ", ".join(s.lengths) + ", 8 heads × 64",
                 f"{r['speedup_vs_padded']:.2f}× padding's speed; {r['time_vs_per_sequence']:.2f}× "
                 "the time of one call per sequence"))
    r = bench(build, "mla", "--kv-len", str(s.mla_len), "--heads", str(s.mla_heads), "--kv-dtype", "bf16")
    rows.append(("MLA absorbed decode, bf16 latent cache", f"{s.mla_len} tokens × (512 + 64), {s.mla_heads} heads",
                 f"{r['ratio_to_peak']:.2f} of the FMA peak"))
    r = bench(build, "sparse", "--kv-len", str(s.sparse_len), "--topk", str(s.topk), "--heads", str(s.mla_heads),
              "--queries", str(s.sparse_rows))
    rows.append(("top-k sparse (DSA) over latent rows",
                 f"top {s.topk} of {s.sparse_len} keys, {s.mla_heads} heads, {s.sparse_rows} rows",
                 f"{r['ratio_to_peak']:.2f} of the FMA peak; {r['time_vs_topk_keys']:.2f}× the time over "
                 f"{s.topk} keys; {r['speedup_vs_dense']:.0f}× dense attention's speed"))
    return rows


def serving_rows(build, s):
    """(what, shape, figure, target) for the serving table (issue 48's targets)."""
    heads = "{} query and {} KV heads of {}".format(*s.serve_shape[1::2])
    rows = []
    for dtype in ("f32", "bf16"):
        r = bench(build, "decode", "--kv-len", str(s.max_len), *s.serve_shape, "--page-size", "16",
                  "--kv-dtype", dtype)
        rows.append((f"decode over pages of 16, {dtype}", f"{s.max_len} keys, {heads}",
                     f"ratio_to_contiguous {r['ratio_to_contiguous']:.2f} ({r['ratio_to_peak']:.2f} of the read "
                     "bandwidth)", "≥ 0.95"))
    r = bench(build, "decode", "--kv-len", str(s.verify_len), *s.serve_shape, "--page-size", "16", "--queries", "8",
              "--tree")
    rows.append(("8 draft queries, tree mask", f"{s.verify_len} keys, {heads}",
                 f"ratio_to_one_query {r['ratio_to_one_query']:.2f}", "≤ 2.5"))
    r = bench(build, "batch-decode", "--requests", str(s.requests), "--min-len", str(s.min_len), "--max-len",
              str(s.max_len), *s.serve_shape)
    rows.append((f"{s.requests} decodes in one call", f"{s.min_len}..{s.max_len} keys (log-spaced), {heads}",
                 f"ratio_to_single {r['ratio_to_single']:.2f}; speedup_vs_separate {r['speedup_vs_separate']:.2f}",
                 "≥ 0.95; ≥ 1.1"))
    r = bench(build, "mixed", "--prefill-len", str(s.prefill_len), "--max-len", str(s.max_len), *s.serve_shape)
    rows.append(("mixed batch", f"a {s.prefill_len}-token prefill, 31 decodes, 8 drafts; {heads}",
                 f"ratio_to_parts {r['ratio_to_parts']:.2f}", "≤ 1.05"))
    for dtype in ("f32", "bf16", "f16", "q8_0", "int4"):
        pages = ["--page-size", "32"] if dtype == "int4" else []  # (whole groups of 32 keys in a page)
        r = bench(build, "serve", "--requests", str(s.serve_requests), *s.serve_shape, "--kv-dtype", dtype, *pages)
        rows.append((f"serve, {dtype}" + (", pages of 32" if pages else ""),
                     f"{s.serve_requests} requests, seed 1, {heads}",
                     f"{r['tokens_per_s']:.0f} tokens/s, step p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms; "
                     f"KV {r['kv_bytes'] / 2**20:.1f} MiB against {r['kv_bytes_contiguous'] / 2**20:.1f} "
                     "contiguous", ""))
    return rows


def peer_rows(s):
    """(what, against, seconds of attn, seconds of the peer) from bench/compare.py."""
    sys.path.insert(0, HERE)
    import compare  # torch and the article's NumPy code; imported only when measuring
    t = compare.peer_seconds(s.peer_n, 512, 8, s.repeats)
    self_attention = f"the article's self-attention, n = {s.peer_n}, width 512, 8 heads"
    return [(f"attn.multi_head, {self_attention}", "the article's NumPy code", t["attn"], t["numpy"]),
            (f"attn.multi_head, {self_attention}", "PyTorch matmul + softmax", t["attn"], t["torch"]),
            ("attn.MultiHeadAttention, the same input", "torch.nn.MultiheadAttention, same weights",
             t["attn_layer"], t["torch_layer"])]


def grid(build, s):
    """Prefill's ratio to the FMA peak by head dim (rows) and n (columns), 8 heads."""
    return {(n, d): bench(build, "attention", "--n", str(n), "--heads", str(s.heads), "--head-dim", str(d))
            ["ratio_to_peak"] for n in s.grid_n for d in s.grid_d}


def machine():
    """The CPU as lscpu names it, with its family and model where the name alone is
    generic (a VM's "AMD EPYC" is a Zen 4 at family 25, a Zen 5 at 26), and the threads."""
    fields = {}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    cpu = fields.get("Model name", "unknown CPU")
    if "CPU family" in fields and "Model" in fields:
        cpu += f" (family {fields['CPU family']}, model {fields['Model']})"
    return f"{cpu}, {os.cpu_count()} threads"


BLOCKS = ("summary", "head-dims", "peers", "serving")


def tables(summary, peers, by_head_dim, serving, s, where):
    """The Markdown of each block, by name: those whose measurements were taken (not None)."""
    measured = f"Measured by `make bench-report` on {where}, {datetime.date.today().isoformat()}."
    out = {}
    if summary is not None:
        lines = ["| Path | Shape | attn |", "|---|---|---|"]
        lines += [f"| {what} | {shape} | {figure} |" for what, shape, figure in summary]
        lines += [f"| {what} | against {peer} | {peer_s / attn_s:.1f}× as fast |"
                  for what, peer, attn_s, peer_s in peers]
        out["summary"] = measured + "\n\n" + "\n".join(lines)
    if by_head_dim is not None:
        head = "| head dim | " + " | ".join(f"n = {n}" for n in s.grid_n) + " |"
        rule = "|---:|" + "---:|" * len(s.grid_n)
        rows = [f"| {d} | " + " | ".join(f"{by_head_dim[(n, d)]:.2f}" for n in s.grid_n) + " |" for d in s.grid_d]
        out["head-dims"] = (measured + f" Prefill, float32, {s.heads} heads, non-causal: ratio to the FMA peak.\n\n"
                            + "\n".join([head, rule] + rows))
    if peers is not None:
        peer_lines = ["| attn | peer | attn ms | peer ms | attn speedup |", "|---|---|---:|---:|---:|"]
        peer_lines += [f"| {what} | {peer} | {a * 1e3:.1f} | {p * 1e3:.1f} | {p / a:.1f}× |"
                       for what, peer, a, p in peers]
        out["peers"] = measured + "\n\n" + "\n".join(peer_lines)
    if serving is not None:
        serving_lines = ["| Path | Shape | attn | target |", "|---|---|---|---|"]
        serving_lines += [f"| {what} | {shape} | {figure} | {target} |" for what, shape, figure, target in serving]
        out["serving"] = measured + "\n\n" + "\n".join(serving_lines)
    return out


def replaced(text, name, block, path):
    """`text` with the block `name` replaced; an error naming `path` if its markers are missing."""
    begin, end = f"<!-- bench-report:{name} -->", f"<!-- /bench-report:{name} -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"{path}: needs exactly one {begin} ... {end} pair")
    return pattern.sub(lambda _: f"{begin}\n{block}\n{end}", text)


TARGETS = {"README.md": ["summary"],
           os.path.join("docs", "performance.md"): ["summary", "head-dims", "peers", "serving"]}


def write(root, blocks):
    """Replace the blocks given in every target file: all checked first, then each renamed into place."""
    new = {}
    for relative, names in TARGETS.items():
        path = os.path.join(root, relative)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for name in names:
            if name in blocks:
                text = replaced(text, name, blocks[name], path)
        new[path] = text
    for path, text in new.items():
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".bench-report-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, os.stat(path).st_mode & 0o777)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"), help="the build folder (default: build)")
    p.add_argument("--root", default=REPO, help="the checkout whose docs --write rewrites")
    p.add_argument("--write", action="store_true", help="rewrite the blocks of README.md and docs/performance.md")
    p.add_argument("--quick", action="store_true", help="small shapes: checks the command, not the machine")
    p.add_argument("--only", default=",".join(BLOCKS),
                   help="the blocks to measure and write, comma-separated (default: all: %(default)s)")
    args = p.parse_args(argv)
    only = args.only.split(",")
    unknown = [b for b in only if b not in BLOCKS]
    if unknown:
        p.error(f"--only: unknown block {unknown[0]!r}: expected some of {', '.join(BLOCKS)}")
    os.environ.setdefault("ATTN_PYTHONPATH", os.path.join(os.path.abspath(args.build), "python"))
    s = Shapes(args.quick)
    BENCH_OPTIONS[:] = ["--min-time", "0"] if args.quick else []
    summary = summary_rows(args.build, s) if "summary" in only else None
    peers = peer_rows(s) if "summary" in only or "peers" in only else None  # (the summary's last rows)
    by_head_dim = grid(args.build, s) if "head-dims" in only else None
    serving = serving_rows(args.build, s) if "serving" in only else None
    blocks = {name: block for name, block in tables(summary, peers, by_head_dim, serving, s, machine()).items()
              if name in only}
    for name, block in blocks.items():
        print(f"## {name}\n\n{block}\n")
    if args.write:
        write(args.root, blocks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
