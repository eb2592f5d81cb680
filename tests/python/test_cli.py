"""The command line: `attn pe` against the article's formula, `attn attend` against
attn.multi_head and NumPy, the pictures parsed back, and every bad input."""
import os
import struct
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import article
import attn
from util import rel_err

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CLI = os.environ.get("ATTN_CLI", os.path.join(ROOT, "build", "bin", "attn"))
SVG = "{http://www.w3.org/2000/svg}"


def run(*args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


def ok(*args):
    r = run(*args)
    assert r.returncode == 0, r.stderr
    return r


def quick_bench(*args):
    """attn bench ARGS in 3 turns, not a second's worth: its output, not the machine, is checked."""
    return ok("bench", *args, "--min-time", 0)


def png_size(path):
    """Width and height from the PNG signature and IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def svg_maps(path):
    """Per heat map: title, axis titles, column and row labels, index ticks, cell tooltips and fills."""
    root = ET.parse(path).getroot()
    assert root.tag == SVG + "svg"
    maps = []
    for g in root.iter(SVG + "g"):
        if g.get("class") != "heatmap":
            continue
        texts = lambda cls: [t.text for t in g.iter(SVG + "text") if t.get("class") == cls]
        cells = [r for r in g.iter(SVG + "rect") if r.get("class") == "cell"]
        maps.append(dict(title=texts("title")[0], cols=texts("col-label"),
                         rows=texts("row-label"), col_axis=texts("col-axis")[0],
                         row_axis=texts("row-axis")[0], col_ticks=texts("col-tick"),
                         row_ticks=texts("row-tick"),
                         tips=[c.find(SVG + "title").text for c in cells],
                         fills=[c.get("fill") for c in cells]))
    return root, maps


# ---------------------------------------------------------------------------
# attn pe

@pytest.mark.parametrize("n,d", [(5, 8), (50, 64), (7, 5), (1, 1), (0, 4)])
def test_pe_npy_is_the_articles_formula(tmp_path, n, d):
    out = tmp_path / "pe.npy"
    ok("pe", "--n", n, "--d", d, "--out", out)
    pe = np.load(out)
    assert pe.dtype == np.float32 and pe.shape == (n, d)
    np.testing.assert_allclose(pe, article.positional_encoding(n, d), rtol=0, atol=1e-6)


def test_pe_base_and_csv(tmp_path):
    out = tmp_path / "pe.csv"
    ok("pe", "--n", 9, "--d", 6, "--base", 100, "--out", out)
    pos, i = np.arange(9)[:, None], np.arange(6)[None, :]
    angle = pos / np.power(100.0, (2 * (i // 2)) / 6)
    expected = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    np.testing.assert_allclose(np.loadtxt(out, delimiter=","), expected, rtol=0, atol=1e-6)


def test_pe_pictures(tmp_path):
    ok("pe", "--n", 12, "--d", 10, "--out", tmp_path / "pe.svg")
    _, maps = svg_maps(tmp_path / "pe.svg")
    assert len(maps) == 1 and len(maps[0]["tips"]) == 12 * 10
    assert "n=12, d=10" in maps[0]["title"]
    assert maps[0]["row_axis"] == "position" and maps[0]["col_axis"] == "dimension"
    # Index ticks, thinned out to leave two lines of text from one to the next (cells are 26 high).
    assert maps[0]["row_ticks"] == [str(p) for p in range(0, 12, 2)]
    assert maps[0]["col_ticks"] == [str(i) for i in range(10)]
    # The tooltip of position 3, dimension 4 holds that entry of the table.
    tip = maps[0]["tips"][3 * 10 + 4]
    assert tip.startswith("position 3, dimension 4: ")
    assert float(tip.split(": ")[1]) == pytest.approx(article.positional_encoding(12, 10)[3, 4],
                                                      abs=1e-4)
    ok("pe", "--n", 12, "--d", 10, "--out", tmp_path / "PE.PNG")
    width, height = png_size(tmp_path / "PE.PNG")
    assert width > 10 and height > 12


def test_pe_rope_angles_and_their_scaling(tmp_path):
    # the angles t * base^(-2k/d) in radians, float64; with --scaling, the scaled ones
    ok("pe", "--encoding", "rope", "--n", 20, "--d", 8, "--base", 100, "--out", tmp_path / "r.npy")
    want = np.arange(20)[:, None] * 100.0 ** (-np.arange(0, 8, 2) / 8)
    got = np.load(tmp_path / "r.npy")
    assert got.dtype == np.float64 and np.allclose(got, want, rtol=1e-15, atol=0)
    linear = '{"rope_type": "linear", "factor": 4}'
    ok("pe", "--encoding", "rope", "--n", 20, "--d", 8, "--base", 100, "--scaling", linear,
       "--out", tmp_path / "r.csv")
    assert np.allclose(np.loadtxt(tmp_path / "r.csv", delimiter=","), want / 4, rtol=1e-15, atol=0)
    # the picture: the plain and the scaled angles mod 2π, one row per pair along the positions
    ok("pe", "--encoding", "rope", "--n", 20, "--d", 8, "--scaling", linear, "--out", tmp_path / "r.svg")
    _, maps = svg_maps(tmp_path / "r.svg")
    assert [m["title"] for m in maps] == ["RoPE, d=8, base 10000",
                                          "linear scaling, factor 4, attention factor 1"]
    assert maps[0]["row_axis"] == "frequency pair" and maps[0]["col_axis"] == "position"
    tip = maps[1]["tips"][1 * 20 + 13]  # pair 1, position 13
    assert tip.startswith("frequency pair 1, position 13: ")
    assert float(tip.split(": ")[1]) == pytest.approx(13 * 10000 ** -0.25 / 4, abs=1e-3)
    turned = maps[0]["tips"][0 * 20 + 13]  # pair 0 turns a radian per position: 13 mod 2π
    assert float(turned.split(": ")[1]) == pytest.approx(13 - 2 * (2 * np.pi), abs=1e-3)
    yarn = '{"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 16}'
    ok("pe", "--encoding", "rope", "--n", 20, "--d", 8, "--scaling", yarn, "--out", tmp_path / "y.svg")
    _, maps = svg_maps(tmp_path / "y.svg")
    assert maps[1]["title"] == "yarn scaling, factor 4, attention factor 1.139"
    ok("pe", "--encoding", "rope", "--n", 20, "--d", 8, "--out", tmp_path / "plain.png")


def test_pe_alibi_biases(tmp_path):
    ok("pe", "--encoding", "alibi", "--n", 10, "--heads", 6, "--out", tmp_path / "a.npy")
    slopes = attn.alibi_slopes(6)
    got = np.load(tmp_path / "a.npy")
    assert got.shape == (6, 10) and np.array_equal(got, -slopes[:, None] * np.arange(10))
    ok("pe", "--encoding", "alibi", "--n", 10, "--out", tmp_path / "a.svg")  # 8 heads by default
    _, maps = svg_maps(tmp_path / "a.svg")
    assert maps[0]["title"] == "ALiBi, 8 heads" and maps[0]["rows"][:2] == ["0.5", "0.25"]
    assert maps[0]["col_axis"] == "distance p - j"


@pytest.mark.parametrize("args, status, needle", [
    (("--encoding", "alibi", "--n", 4, "--d", 8), 2, "--d: does not apply to --encoding alibi"),
    (("--encoding", "rope", "--n", 4), 2, "--d: is required for --encoding rope"),
    (("--n", 4, "--d", 4, "--scaling", '{"rope_type": "linear", "factor": 2}'), 2,
     "--scaling: applies to --encoding rope only"),
    (("--n", 4, "--d", 4, "--heads", 2), 2, "--heads: applies to --encoding alibi only"),
    (("--encoding", "alibi", "--n", 4, "--base", 10), 2, "--base: does not apply"),
    (("--encoding", "ntk", "--n", 4, "--d", 4), 2, "--encoding"),
    (("--encoding", "rope", "--n", 4, "--d", 5), 1, "--d must be even for rope"),
    (("--encoding", "rope", "--n", 4, "--d", 4, "--scaling", '{"rope_type": "yarn"'), 1, "not valid JSON"),
    (("--encoding", "rope", "--n", 4, "--d", 4, "--scaling", '{"rope_type": "linear"}'), 1,
     "rope_type 'linear' needs 'factor'"),
])
def test_pe_encoding_errors(tmp_path, args, status, needle):
    out = tmp_path / "x.npy"
    r = run("pe", *args, "--out", out)
    assert r.returncode == status and needle in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------
# attn attend

def np_multi_head(x, heads, causal=False):
    """The article's multi_head in NumPy, with an optional causal mask, batched."""
    if x.ndim == 3:
        return np.stack([np_multi_head(b, heads, causal) for b in x])
    if not causal:
        return article.multi_head(x.astype(np.float64), heads)
    n, d = x.shape
    dh = d // heads
    outs = []
    for h in range(heads):
        s = x[:, h * dh:(h + 1) * dh].astype(np.float64)
        logits = s @ s.T / np.sqrt(dh)
        logits[np.triu(np.ones((n, n), bool), 1)] = -np.inf
        outs.append(article.softmax(logits) @ s)
    return np.concatenate(outs, axis=-1)


def np_rope_per_head(x, heads, base=10000.0):
    """RoPE (half-split pairs) on each head's slice, at positions 0..n-1."""
    n, d = x.shape[-2:]
    dh, half = d // heads, d // heads // 2
    angle = np.arange(n)[:, None] * base ** (-2.0 * np.arange(half) / dh)
    cos, sin = np.cos(angle), np.sin(angle)
    out = np.empty_like(x, dtype=np.float64)
    for h in range(heads):
        a = x[..., h * dh:h * dh + half].astype(np.float64)
        b = x[..., h * dh + half:(h + 1) * dh].astype(np.float64)
        out[..., h * dh:h * dh + half] = a * cos - b * sin
        out[..., h * dh + half:(h + 1) * dh] = b * cos + a * sin
    return out


@pytest.mark.parametrize("shape,heads", [((5, 8), 4), ((7, 12), 3), ((2, 6, 8), 2), ((1, 4), 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attend_equals_multi_head(tmp_path, shape, heads, dtype):
    x = np.random.default_rng(sum(shape)).normal(size=shape).astype(dtype)
    np.save(tmp_path / "in.npy", x)
    ok("attend", tmp_path / "in.npy", "--heads", heads, "--out", tmp_path / "out.npy")
    y = np.load(tmp_path / "out.npy")
    assert y.dtype == dtype and y.shape == shape
    np.testing.assert_array_equal(y, attn.multi_head(x, heads))
    assert rel_err(y, np_multi_head(x, heads)) <= (1e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("shape", [(6, 8), (3, 5, 8)])
def test_attend_with_positions_and_causal(tmp_path, shape):
    heads = 2
    x = np.random.default_rng(7).normal(size=shape)
    np.save(tmp_path / "in.npy", x)

    def attend(*flags):
        ok("attend", tmp_path / "in.npy", "--heads", heads, "--out", tmp_path / "out.npy", *flags)
        return np.load(tmp_path / "out.npy")

    n, d = shape[-2:]
    with_pe = x + article.positional_encoding(n, d)
    assert rel_err(attend("--pe", "sinusoidal"), np_multi_head(with_pe, heads)) <= 1e-12
    assert rel_err(attend("--pe", "rope"), np_multi_head(np_rope_per_head(x, heads), heads)) <= 1e-12
    assert rel_err(attend("--causal"), np_multi_head(x, heads, causal=True)) <= 1e-12
    assert rel_err(attend("--pe", "none"), np_multi_head(x, heads)) <= 1e-12
    # The first word sees only itself under the causal mask: its output is its input.
    np.testing.assert_allclose(attend("--causal")[..., 0, :], x[..., 0, :], rtol=1e-12)


def test_attend_and_mha_take_every_attention_option(tmp_path):
    """--causal, --window, --softcap and --scale mean what attn.attention's keywords do:
    attend against attn.attention on each head's slice, mha against the layer."""
    rng = np.random.default_rng(12)
    x = rng.normal(size=(7, 8))
    np.save(tmp_path / "in.npy", x)
    flags = ["--causal", "--window", "2,0", "--softcap", "1.5", "--scale", "0.8"]
    ok("attend", tmp_path / "in.npy", "--heads", 2, "--out", tmp_path / "out.npy", *flags)
    heads = x.reshape(7, 2, 4).transpose(1, 0, 2)
    ref = attn.attention(heads, heads, heads, causal=True, window=(2, 0), softcap=1.5, scale=0.8)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), ref.transpose(1, 0, 2).reshape(7, 8),
                               rtol=1e-12)
    m = attn.MultiHeadAttention(8, 2, seed=4)
    m.save(tmp_path / "layer.safetensors")
    ok("mha", tmp_path / "in.npy", "--weights", tmp_path / "layer.safetensors",
       "--out", tmp_path / "mo.npy", *flags)
    np.testing.assert_allclose(np.load(tmp_path / "mo.npy"),
                               m(x, causal=True, window=(2, 0), softcap=1.5, scale=0.8)[0],
                               rtol=1e-12)


def test_attend_weights_svg_has_a_cell_per_weight_and_the_labels(tmp_path):
    x = np.random.default_rng(3).normal(size=(3, 8)).astype(np.float32)
    np.save(tmp_path / "in.npy", x)
    ok("attend", tmp_path / "in.npy", "--heads", 4, "--out", tmp_path / "out.npy",
       "--weights", tmp_path / "w.svg", "--tokens", "猫 咬 狗")
    root, maps = svg_maps(tmp_path / "w.svg")
    assert "CJK" in root.get("font-family")
    assert [m["title"] for m in maps] == [f"猫 咬 狗, no positions, head {h}" for h in range(4)]
    _, weights = attn.attention(*(np.ascontiguousarray(x.reshape(3, 4, 2).transpose(1, 0, 2)),) * 3,
                                return_weights=True)  # (heads, n, n), from the head slices
    for h, m in enumerate(maps):
        assert m["cols"] == ["猫", "咬", "狗"] and m["rows"] == ["猫", "咬", "狗"]
        assert m["row_axis"] == "query" and m["col_axis"] == "key"
        assert len(m["tips"]) == 9
        values = [float(t.rsplit(": ", 1)[1]) for t in m["tips"]]
        np.testing.assert_allclose(np.reshape(values, (3, 3)), weights[h], atol=1e-4)
    assert maps[0]["tips"][1] == "query 0 猫, key 1 咬: " + maps[0]["tips"][1].rsplit(": ", 1)[1]


def test_attend_svg_is_xml_whatever_the_tokens(tmp_path):
    """Tokens with control characters or bytes that are not UTF-8 gave an SVG
    no XML parser reads, and exit 0. What XML can hold is escaped and parses
    back (expat, a real XML parser) to the very labels; what it cannot is
    refused, naming the token, and nothing is written."""
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32))
    tokens = ['<a&"x">&amp;', "'quoted'", "\U0001F600猫"]
    ok("attend", tmp_path / "x.npy", "--out", tmp_path / "o.npy", "--weights", tmp_path / "w.svg",
       "--tokens", " ".join(tokens))
    _, maps = svg_maps(tmp_path / "w.svg")
    assert maps[0]["rows"] == tokens  # (column labels too wide to fit are left out; the tooltips hold them)
    assert maps[0]["tips"][5].startswith(f"query 1 {tokens[1]}, key 2 {tokens[2]}: ")
    for bad, said in [(b"a\x01 b c", "'a\\x01' holds U+0001"), (b"a \xff c", "'\\xff' is not valid UTF-8"),
                      (b"a b \x1b[31m", "holds U+001B")]:
        r = subprocess.run([CLI.encode(), b"attend", bytes(tmp_path / "x.npy"), b"--out", bytes(tmp_path / "p.npy"),
                            b"--weights", bytes(tmp_path / "p.svg"), b"--tokens", bad], capture_output=True, timeout=60)
        assert r.returncode == 1 and said.encode() in r.stderr, (bad, r.stderr)
        assert not (tmp_path / "p.svg").exists() and not (tmp_path / "p.npy").exists()


def test_attend_weights_of_a_batch(tmp_path):
    np.save(tmp_path / "in.npy", np.random.default_rng(4).normal(size=(2, 4, 6)))
    ok("attend", tmp_path / "in.npy", "--heads", 3, "--causal", "--out", tmp_path / "o.npy",
       "--weights", tmp_path / "w.svg")
    _, maps = svg_maps(tmp_path / "w.svg")
    assert len(maps) == 6 and maps[4]["title"] == "no positions, causal, batch 1, head 1"
    assert all(len(m["tips"]) == 16 and m["cols"] == [] for m in maps)
    # Causal: weights above the diagonal are zero.
    assert float(maps[0]["tips"][1].rsplit(": ", 1)[1]) == 0
    ok("attend", tmp_path / "in.npy", "--heads", 3, "--out", tmp_path / "o.npy",
       "--weights", tmp_path / "w.png")
    width, height = png_size(tmp_path / "w.png")
    assert width > 3 * 4 and height > 2 * 4


ENCODING_TITLES = {"none": "no positions", "sinusoidal": "sinusoidal", "rope": "RoPE"}


def test_demo_writes_its_pictures(tmp_path):
    r = ok("demo", "--out", tmp_path / "pics")
    names = sorted(os.listdir(tmp_path / "pics"))
    assert len(names) == 22 and "positional_encoding.png" in names
    _, table = svg_maps(tmp_path / "pics" / "positional_encoding.svg")
    assert table[0]["row_ticks"] == ["0", "10", "20", "30", "40"]
    assert table[0]["col_ticks"] == ["0", "10", "20", "30", "40", "50", "60"]
    for sentence, words in (("cat_bites_dog", "猫 咬 狗"), ("dog_bites_cat", "狗 咬 猫")):
        for encoding, title in ENCODING_TITLES.items():
            name = f"weights_{sentence}_{encoding}"
            assert str(tmp_path / "pics" / name) in r.stdout
            _, maps = svg_maps(tmp_path / "pics" / (name + ".svg"))
            assert len(maps) == 4 and all(len(m["tips"]) == 9 for m in maps)
            assert [m["title"] for m in maps] == [f"{words}, {title}, head {h}" for h in range(4)]
            assert all(m["row_axis"] == "query" and m["col_axis"] == "key" for m in maps)
            png_size(tmp_path / "pics" / (name + ".png"))
    # Without positions the reversed sentence's weights are the reversed weights.
    _, a = svg_maps(tmp_path / "pics" / "weights_cat_bites_dog_none.svg")
    _, b = svg_maps(tmp_path / "pics" / "weights_dog_bites_cat_none.svg")
    value = lambda m: np.reshape([float(t.rsplit(": ", 1)[1]) for t in m["tips"]], (3, 3))
    np.testing.assert_allclose(value(b[1]), value(a[1])[::-1, ::-1], atol=1e-4)


def bar_labels(path):
    root = ET.parse(path).getroot()
    return [float(t.text) for t in root.iter(SVG + "text") if t.get("class") == "bar-label"]


def test_demo_difference_is_blank_without_positions_only(tmp_path):
    """The weights of 猫 咬 狗 minus those of 狗 咬 猫 with rows and columns reversed,
    computed here from the demo's word vectors with attn.attention on each head's slice,
    against the demo's difference pictures."""
    ok("demo", "--out", tmp_path)
    heads = 4
    cat, dog = np.load(tmp_path / "cat_bites_dog.npy"), np.load(tmp_path / "dog_bites_cat.npy")
    np.testing.assert_array_equal(dog, cat[::-1])  # the same words, mirrored
    n, d = cat.shape
    encode = {"none": lambda x: x,
              "sinusoidal": lambda x: x + attn.positional_encoding(n, d),
              "rope": lambda x: np_rope_per_head(x, heads).astype(np.float32)}

    def weights(x):  # (heads, n, n)
        s = np.ascontiguousarray(x.reshape(n, heads, d // heads).transpose(1, 0, 2))
        return attn.attention(s, s, s, return_weights=True)[1].astype(np.float64)

    largest = {}
    for encoding, title in ENCODING_TITLES.items():
        diff = weights(encode[encoding](cat)) - weights(encode[encoding](dog))[:, ::-1, ::-1]
        largest[encoding] = np.abs(diff).max()
        _, maps = svg_maps(tmp_path / f"difference_{encoding}.svg")
        png_size(tmp_path / f"difference_{encoding}.png")
        assert [m["title"] for m in maps] == [f"猫 咬 狗 - 狗 咬 猫, {title}, head {h}" for h in range(4)]
        for h, m in enumerate(maps):
            assert m["rows"] == m["cols"] == ["猫", "咬", "狗"]
            drawn = [float(t.rsplit(": ", 1)[1]) for t in m["tips"]]  # 4 significant digits
            np.testing.assert_allclose(np.reshape(drawn, (3, 3)), diff[h], atol=1e-4)
    # float32 rounding only without positions (the same words, the same sums, in
    # another order); with positions the article's point: the weights differ.
    assert largest["none"] < 1e-6
    assert largest["sinusoidal"] >= 0.05 and largest["rope"] >= 0.05
    # One symmetric scale for the three pictures, on which "none" is blank (white).
    for encoding in ENCODING_TITLES:
        top, middle, bottom = bar_labels(tmp_path / f"difference_{encoding}.svg")
        assert top == pytest.approx(max(largest.values()), abs=1e-4) and middle == 0 and bottom == -top
    _, blank = svg_maps(tmp_path / "difference_none.svg")
    assert {f for m in blank for f in m["fills"]} == {"#f7f7f7"}
    _, rope = svg_maps(tmp_path / "difference_rope.svg")
    assert len({f for m in rope for f in m["fills"]}) > 9


def test_demo_weights_share_the_range_of_the_data(tmp_path):
    ok("demo", "--out", tmp_path)
    values = []
    for sentence in ("cat_bites_dog", "dog_bites_cat"):
        for encoding in ENCODING_TITLES:
            _, maps = svg_maps(tmp_path / f"weights_{sentence}_{encoding}.svg")
            values += [float(t.rsplit(": ", 1)[1]) for m in maps for t in m["tips"]]
            top, _, bottom = bar_labels(tmp_path / f"weights_{sentence}_{encoding}.svg")
    # The colour bar spans the weights (not [0, 1]), the same for all six pictures.
    assert top == pytest.approx(max(values), abs=1e-4) and bottom == pytest.approx(min(values), abs=1e-4)
    assert top - bottom < 0.9


# ---------------------------------------------------------------------------
# Writing files: a failed write is an error and never costs the old file.

def test_a_full_disk_is_an_error_for_every_kind_of_file(tmp_path):
    """Small outputs fit in a stream's buffer, so only the final flush sees the
    failure: it was unchecked, and these commands exited 0 having written nothing."""
    np.save(tmp_path / "x.npy", np.ones((3, 8), np.float32))
    for ext in ("npy", "csv", "png", "svg"):
        os.symlink("/dev/full", tmp_path / f"full.{ext}")
    for args in [["pe", "--n", 4, "--d", 4, "--out", tmp_path / "full.npy"],
                 ["pe", "--n", 4, "--d", 4, "--out", tmp_path / "full.csv"],
                 ["pe", "--n", 4, "--d", 4, "--out", tmp_path / "full.svg"],
                 ["attend", tmp_path / "x.npy", "--out", tmp_path / "full.npy"],
                 ["attend", tmp_path / "x.npy", "--out", tmp_path / "o.npy",
                  "--weights", tmp_path / "full.png"]]:
        r = run(*args)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and "full." in r.stderr, (args, r.stderr)
        assert "write failed: No space left on device" in r.stderr, (args, r.stderr)


def test_a_write_that_fails_part_way_keeps_the_old_file(tmp_path):
    """Under a file size limit (SIGXFSZ ignored, so the write reports EFBIG) each
    kind of output fails part way: the old file must survive byte for byte (it
    was truncated first), with its mode, and no temporary file may be left."""
    import resource
    import signal

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    names = ["pe.npy", "pe.csv", "pe.png", "pe.svg"]
    for name in names:
        out = tmp_path / name
        ok("pe", "--n", 2, "--d", 2, "--out", out)
        os.chmod(out, 0o604)
        old = out.read_bytes()
        r = subprocess.run([CLI, "pe", "--n", "200", "--d", "64", "--out", str(out)],  # > 20 kB each
                           capture_output=True, text=True, preexec_fn=limit_file_size)
        assert r.returncode == 1 and "write failed: File too large" in r.stderr, (name, r.stderr)
        assert out.read_bytes() == old, name
        ok("pe", "--n", 3, "--d", 2, "--out", out)  # a successful replacement keeps the mode
        assert os.stat(out).st_mode & 0o7777 == 0o604, name
    assert sorted(os.listdir(tmp_path)) == sorted(names)


def test_one_failed_output_leaves_every_output_as_it_was(tmp_path):
    """attend replaced --out and then failed on --weights (a missing folder, a
    full disk, a link to one): every output now stays as it was when any
    fails, and no temporary file is left; a link stays a link."""
    np.save(tmp_path / "x.npy", np.ones((3, 8), np.float32))
    (tmp_path / "o.npy").write_bytes(b"old out")
    (tmp_path / "w.png").write_bytes(b"old picture")
    os.symlink("/dev/full", tmp_path / "full.svg")
    before = {name: (tmp_path / name).read_bytes() for name in ("o.npy", "w.png")}
    for out, weights in [("o.npy", "/missing/dir/w.svg"), ("o.npy", "/dev/full"), ("o.npy", "full.svg"),
                         ("/dev/full", "w.png"), ("full.svg", "w.png")]:
        r = subprocess.run([CLI, "attend", "x.npy", "--out", out, "--weights", weights], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, (out, weights, r.stderr)
        assert {name: (tmp_path / name).read_bytes() for name in before} == before, (out, weights)
        assert sorted(os.listdir(tmp_path)) == ["full.svg", "o.npy", "w.png", "x.npy"], (out, weights)
        assert os.readlink(tmp_path / "full.svg") == "/dev/full"
    ok("attend", tmp_path / "x.npy", "--out", tmp_path / "o.npy", "--weights", tmp_path / "w.png")
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), attn.multi_head(np.ones((3, 8), np.float32)))


def test_a_write_protected_file_is_refused_as_cp_refuses_it():
    """A user's --out over a mode-444 file renamed over it and exited 0, where
    cp refuses. As root (who may write anything) the test runs the command as
    nobody, in a folder nobody may write."""
    import pwd
    import shutil
    import tempfile
    as_user = {}
    folder = tempfile.mkdtemp(prefix="attn-write-protected-")
    try:
        os.chmod(folder, 0o777)
        np.save(os.path.join(folder, "x.npy"), np.ones((3, 8), np.float32))
        for name, mode in (("keep.npy", 0o444), ("mine.npy", 0o644)):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(b"old")
            os.chmod(os.path.join(folder, name), mode)
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            for name in ("keep.npy", "mine.npy"):
                os.chown(os.path.join(folder, name), nobody.pw_uid, nobody.pw_gid)
            as_user = dict(user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])

        def attend(out):
            return subprocess.run([CLI, "attend", "x.npy", "--out", out], cwd=folder, capture_output=True,
                                  text=True, timeout=60, **as_user)

        cp = subprocess.run(["cp", "x.npy", "keep.npy"], cwd=folder, capture_output=True, text=True, **as_user)
        assert cp.returncode == 1 and "Permission denied" in cp.stderr  # the behaviour to match
        r = attend("keep.npy")
        assert r.returncode == 1 and r.stderr == "attn: error: keep.npy: cannot open for writing: Permission denied\n"
        assert open(os.path.join(folder, "keep.npy"), "rb").read() == b"old"
        assert sorted(os.listdir(folder)) == ["keep.npy", "mine.npy", "x.npy"]
        assert attend("mine.npy").returncode == 0  # the same user's writable file is replaced
        assert np.load(os.path.join(folder, "mine.npy")).shape == (3, 8)
    finally:
        shutil.rmtree(folder)


def test_no_subcommand_exits_0_when_standard_output_fails(tmp_path):
    """`> /dev/full` lost bench's, experiment's and demo's output, and --version's,
    with exit 0. Each is now exit 1 with one line on stderr; a command that
    also writes files leaves them unwritten."""
    np.save(tmp_path / "x.npy", np.ones((3, 8), np.float32))
    attn.MultiHeadAttention(8, 2).save(str(tmp_path / "layer.safetensors"))
    commands = [["--version"], ["--help"], ["demo"], ["demo", "--help"],
                ["pe", "--n", 3, "--d", 4, "--out", "/dev/stdout"],
                ["attend", "x.npy", "--out", "/dev/stdout"],
                ["mha", "x.npy", "--weights", "layer.safetensors", "--out", "/dev/stdout"],
                ["experiment", "order", "--steps", 1, "--json", "--out", "weights"],
                ["experiment", "heads", "--steps", 1],
                ["bench", "attention", "--n", 64, "--heads", 1, "--head-dim", 16, "--threads", 1, "--json",
                 "--min-time", 0],
                ["bench", "decode", "--kv-len", 64, "--heads", 1, "--head-dim", 16, "--threads", 1, "--min-time", 0],
                ["bench", "varlen", "--lengths", 16, 8, "--heads", 1, "--head-dim", 16, "--threads", 1,
                 "--min-time", 0]]
    with open("/dev/full", "w") as full:
        for args in commands:
            r = subprocess.run([CLI, *map(str, args)], cwd=tmp_path, stdout=full, stderr=subprocess.PIPE,
                               text=True, timeout=300)
            assert r.returncode == 1, (args, r.stderr)
            said = "/dev/stdout: write failed" if "/dev/stdout" in args else "standard output: write error"
            assert r.stderr.startswith("attn: error: " + said) and r.stderr.count("\n") == 1, (args, r.stderr)
    assert not os.path.exists(tmp_path / "weights") or os.listdir(tmp_path / "weights") == []


def test_out_may_be_standard_output(tmp_path):
    """--out /dev/stdout was refused for its missing extension: a device or
    FIFO takes the command's first format (.npy), written in place."""
    import io
    x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([CLI, "attend", str(tmp_path / "x.npy"), "--out", "/dev/stdout"], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(io.BytesIO(r.stdout)), attn.multi_head(x))
    r = subprocess.run([CLI, "pe", "--n", "3", "--d", "4", "--out", "/dev/stdout"], capture_output=True, timeout=60)
    np.testing.assert_array_equal(np.load(io.BytesIO(r.stdout)), attn.positional_encoding(3, 4))


# ---------------------------------------------------------------------------
# Bad input: one line on stderr, exit 2 for usage and 1 for runtime errors.

def bad_cases(tmp):
    np.save(tmp / "x.npy", np.zeros((3, 8), np.float32))
    np.save(tmp / "flat.npy", np.zeros(8, np.float32))
    np.save(tmp / "rank4.npy", np.zeros((1, 2, 3, 8), np.float32))
    np.save(tmp / "odd.npy", np.zeros((3, 6), np.float32))
    (tmp / "junk.npy").write_bytes(b"not an npy file at all")
    (tmp / "a_file").write_text("")
    x, out = tmp / "x.npy", tmp / "out.npy"
    return [
        ([], 2, "subcommand"),
        (["nonsense"], 2, "nonsense"),
        (["pe", "--n", 3, "--d", 4], 2, "--out is required"),
        (["pe", "--n", 3, "--d", 4, "--out", tmp / "pe.txt"], 2, "must end in .npy, .csv, .png, .svg"),
        (["pe", "--n", 3, "--d", 0, "--out", tmp / "pe.npy"], 2, "--d"),
        (["pe", "--n", -1, "--d", 4, "--out", tmp / "pe.npy"], 2, "--n"),
        (["pe", "--n", "many", "--d", 4, "--out", tmp / "pe.npy"], 2, "--n"),
        (["pe", "--n", 3, "--d", 4, "--base", 0, "--out", tmp / "pe.npy"], 2, "--base"),
        (["pe", "--n", 3, "--d", 4, "--out", tmp / "pe.npy", "--bogus"], 2, "--bogus"),
        (["pe", "--n", 3, "--d", 4, "--out", tmp / "no" / "pe.npy"], 1, "pe.npy"),
        (["pe", "--n", 3, "--d", 4, "--out", tmp / "no" / "pe.csv"], 1, "cannot open"),
        (["pe", "--n", 0, "--d", 4, "--out", tmp / "pe.png"], 1, "shape (0, 4)"),
        (["attend", x, "--out", out, "--heads", 0], 2, "--heads"),
        (["attend", x, "--out", out, "--pe", "learned"], 2, "learned"),
        (["attend", x, "--out", tmp / "out.txt"], 2, "must end in .npy"),
        (["attend", x, "--out", out, "--weights", tmp / "w.jpg"], 2, "must end in .png, .svg"),
        (["attend", x], 2, "--out is required"),
        (["attend", "--out", out], 2, "input is required"),
        (["attend", tmp / "missing.npy", "--out", out], 1, "missing.npy"),
        (["attend", tmp / "junk.npy", "--out", out], 1, "junk.npy"),
        (["attend", "/dev/zero", "--out", out], 1, "/dev/zero: not a valid .npy file"),
        (["attend", tmp, "--out", out], 1, f"{tmp}: cannot read: Is a directory"),
        (["attend", tmp / "flat.npy", "--out", out], 1, "has shape (8,); expected (n, d) or (batch, n, d)"),
        (["attend", tmp / "rank4.npy", "--out", out], 1, "expected (n, d) or (batch, n, d)"),
        (["attend", x, "--out", out, "--heads", 3], 1, "heads (3) must divide the model dimension d (8)"),
        (["attend", tmp / "odd.npy", "--out", out, "--heads", 2, "--pe", "rope"], 1, "must be even"),
        (["attend", x, "--out", out, "--tokens", "猫 咬"], 1, "--tokens gives 2 tokens"),
        (["attend", x, "--out", tmp / "no" / "out.npy"], 1, "out.npy"),
        (["attend", x, "--out", out, "--weights", tmp / "no" / "w.svg"], 1, "cannot open"),
        (["demo", "--out", tmp / "a_file"], 1, "cannot create the folder"),
        # Every number range-checked on its text (CLI11 printed the range as
        # 300-digit doubles, clamped overflow to INT64_MAX, wrapped -1).
        (["attend", x, "--out", out, "--heads", 0], 2, "--heads: 0 is not in 1..1000000"),
        (["attend", x, "--out", out, "--heads", "99999999999999999999"], 2,
         "--heads: 99999999999999999999 is not in 1..1000000"),
        (["pe", "--n", 3, "--d", 4, "--base", "nan", "--out", tmp / "pe.npy"], 2,
         "--base: nan is not a finite number > 0"),
        (["pe", "--n", 3, "--d", 4, "--base", "inf", "--out", tmp / "pe.npy"], 2, "--base: inf"),
        (["pe", "--n", "3.5", "--d", 4, "--out", tmp / "pe.npy"], 2, "--n: '3.5' is not a whole number"),
        (["pe", "--n", 100000001, "--d", 4, "--out", tmp / "pe.npy"], 2, "--n: 100000001 is not in 0..100000000"),
        (["pe", "--n", 3, "--d", 1000001, "--out", tmp / "pe.npy"], 2, "--d: 1000001 is not in 1..1000000"),
        (["experiment", "order", "--steps", "99999999999999999999"], 2,
         "--steps: 99999999999999999999 is not in 0..10000000"),
        (["experiment", "heads", "--steps", -1], 2, "--steps: -1 is not in 0..10000000"),
        (["experiment", "order", "--seed", -1], 2, "--seed: -1 is not in 0..18446744073709551615"),
        (["experiment", "heads", "--seed", "18446744073709551616"], 2, "--seed: 18446744073709551616 is not in"),
        (["bench", "decode", "--queries", 9], 2, "--queries: 9 is not in 1..8"),
        (["bench", "decode", "--min-time", -1], 2, "--min-time: Value -1 not in range"),
        (["bench", "decode", "--kv-len", 0], 2, "--kv-len: 0 is not in"),
        (["bench", "attention", "--n", 0], 2, "--n: 0 is not in"),
        (["bench", "attention", "--head-dim", 4097], 2, "--head-dim: 4097 is not in 1..4096"),
        (["bench", "attention", "--heads", 0], 2, "--heads: 0 is not in 1..4096"),
        (["bench", "attention", "--kv-heads", 0], 2, "--kv-heads: 0 is not in 1..4096"),
        (["bench", "attention", "--batch", 5000], 2, "--batch: 5000 is not in 1..4096"),
        (["bench", "attention", "--threads", 0], 2, "--threads: 0 is not in 1.."),
        (["bench", "attention", "--threads", 2000], 2, "--threads: 2000 is not in 1.."),
        (["attend", x, "--out", out, "--window", 1], 2, "--window"),
        (["attend", x, "--out", out, "--window", "-2,0"], 2, "--window: -2 is not in -1.."),
        (["mha", x, "--weights", tmp / "w.safetensors", "--out", out, "--softcap", 0], 2,
         "--softcap: 0 is not a finite number > 0"),
        (["mha", x, "--weights", tmp / "w.safetensors", "--out", out, "--scale", "inf"], 2,
         "--scale: inf is not a finite number"),
        (["mha", x, "--weights", tmp / "w.safetensors", "--out", tmp / "mo.png"], 2,
         "--out: '" + str(tmp / "mo.png") + "' must end in .npy"),
    ]


def test_bad_input_is_one_line_and_the_right_exit_status(tmp_path):
    for args, status, needle in bad_cases(tmp_path):
        r = run(*args)
        what = f"attn {' '.join(map(str, args))}: {r.stderr!r}"
        assert r.returncode == status, what
        assert r.stderr.startswith("attn: ") and r.stderr.endswith("\n"), what
        assert r.stderr.count("\n") == 1, what
        assert needle in r.stderr, what
        assert "terminate" not in r.stderr and "Traceback" not in r.stderr, what


def test_a_bad_ATTN_NUM_THREADS_is_one_line():
    """2000 hung the process; now the first kernel call names the variable."""
    r = subprocess.run([CLI, "demo"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ATTN_NUM_THREADS": "2000"})
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("attn: error: ATTN_NUM_THREADS must be an integer in [1, ")
    assert r.stderr.count("\n") == 1 and "got '2000'" in r.stderr


def test_version_is_the_projects():
    import re
    header = open(os.path.join(ROOT, "include", "attn", "version.h")).read()
    version = ".".join(re.search(rf"#define ATTN_VERSION_{part} ([0-9]+)", header).group(1)
                       for part in ("MAJOR", "MINOR", "PATCH"))
    assert ok("--version").stdout == f"attn {version}\n"


def test_outputs_are_checked_before_any_is_written(tmp_path):
    """A picture too large to draw (over a million SVG cells) is an error before
    the .npy is written: it was written, and then the command failed."""
    np.save(tmp_path / "x.npy", np.zeros((1001, 4), np.float32))
    r = run("attend", tmp_path / "x.npy", "--heads", 1, "--out", tmp_path / "out.npy",
            "--weights", tmp_path / "w.svg")
    assert r.returncode == 1 and "write_svg: 1002001 cells" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["x.npy"]


def test_experiment_order_writes_weights_only_with_out(tmp_path):
    """It wrote order_weights/ into the current folder, even with --json."""
    for args in (["--json"], []):
        r = subprocess.run([CLI, "experiment", "order", "--steps", "1", *args], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert os.listdir(tmp_path) == [], args
    assert "--out FOLDER" in r.stdout


@pytest.mark.parametrize("sub", ["demo", "pe", "attend", "mha"])
def test_every_subcommand_has_help(sub):
    r = ok(sub, "--help")
    assert "--out" in r.stdout and "Usage" in r.stdout


def test_bench_sweep_takes_no_shape():
    """--sweep runs a fixed grid: a shape option beside it is refused, by name."""
    for shape in (["--n", "64"], ["--kv-len", "64"], ["--head-dim", "32"], ["--causal"], ["--batch", "2"]):
        r = subprocess.run([CLI, "bench", "attention", "--sweep", *shape], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and shape[0] in r.stderr and "--sweep" in r.stderr, (shape, r.stderr)


def test_bench_reports_consistent_numbers():
    """attn bench --json: its rates follow from its own times and the formulas in
    the issue (4·n²·d·H FLOPs, causal ratios on the unmasked pairs; K and V bytes
    read), to the digits printed; 16-bit K/V also report the float32 time of the
    same turns, causal runs the non-causal time. (Speed itself is never tested.)"""
    import json

    def rate_tol(ms, rate):  # %.4f ms and %.2f rates printed
        return 5e-5 / ms + 5e-3 / rate + 1e-6

    def time_ratio(a_ms, b_ms):  # a / b as printed (4 decimals), from times printed to 4 decimals
        # Each time's rounding moves a / b by up to its relative half-unit, and the
        # ratio's own rounding adds one more half-unit: the bound is their sum
        # (pytest.approx takes the larger of rel and abs, not the sum).
        ratio = a_ms / b_ms
        return pytest.approx(ratio, rel=0, abs=ratio * (5e-5 / a_ms + 5e-5 / b_ms + 1e-6) + 5e-5)

    def check_ceiling(r, d, qk, pv, softmax_ops):
        """docs/performance.md's ceiling: 4d FLOPs per pair over Q·Kᵀ's and P·V's 2d on their
        units and the softmax's operations on the FMA ports, 2 FLOPs' time each."""
        ceiling = 4 * d / (2 * d / qk + 2 * d / pv + 2 * softmax_ops / r["peak_gflops"])
        assert r["ceiling"] == pytest.approx(ceiling, rel=2e-3)
        rate = r["gflops_unmasked"] if r["causal"] else r["gflops"]
        assert r["ratio_to_ceiling"] == pytest.approx(rate / r["ceiling"], rel=2e-3, abs=1e-4)

    n, heads, d = 160, 2, 32
    r = json.loads(quick_bench("attention", "--n", n, "--heads", heads, "--head-dim", d,
                      "--kv-dtype", "bf16", "--threads", 1, "--json").stdout)
    assert r["n"] == n and r["kv_dtype"] == "bf16" and r["threads"] == 1
    flop = 4 * n * n * d * heads
    assert r["gflops"] == pytest.approx(flop / r["median_ms"] * 1e-6, rel=rate_tol(r["median_ms"], r["gflops"]))
    assert r["ratio_to_peak"] == pytest.approx(r["gflops"] / r["peak_gflops"], rel=2e-3, abs=1e-4)
    check_ceiling(r, d, r["peak_gflops"], r["peak_gflops"], 10)
    assert r["speedup_vs_f32"] == time_ratio(r["f32_median_ms"], r["median_ms"])
    assert 0.2 < r["speedup_vs_f32"] < 5  # the float32 time of the same kernel, not the ceiling's
    assert 1e-4 < r["error_vs_f64"] < 1e-2  # bf16's rounding, against the float64 reference
    r = json.loads(quick_bench("attention", "--n", n, "--heads", heads, "--head-dim", d, "--causal",
                      "--threads", 1, "--json").stdout)
    pairs = n * (n + 1) / 2
    assert r["gflops_unmasked"] == pytest.approx(4 * pairs * d * heads / r["median_ms"] * 1e-6,
                                                 rel=rate_tol(r["median_ms"], r["gflops_unmasked"]))
    assert r["ratio_to_peak"] == pytest.approx(r["gflops_unmasked"] / r["peak_gflops"], rel=2e-3, abs=1e-4)
    check_ceiling(r, d, r["peak_gflops"], r["peak_gflops"], 10)
    assert r["time_vs_noncausal"] == time_ratio(r["median_ms"], r["noncausal_median_ms"])
    assert 0.1 < r["time_vs_noncausal"] < 2  # the non-causal kernel of the same turns
    assert "speedup_vs_f32" not in r
    # bf16 precision: the unit that ran it, its error against float64, the
    # float32 precision of the same turns.
    r = json.loads(quick_bench("attention", "--n", n, "--heads", heads, "--head-dim", d, "--precision", "bf16",
                      "--threads", 1, "--json").stdout)
    # (The CLI's process times the CPU's bf16 unit for itself, so its choice
    # is not asserted to be this process's.)
    assert r["precision"] == "bf16"
    assert r["unit"] in {"highway", "avx512_bf16", "neon_bf16"}
    assert 1e-4 < r["error_vs_f64"] < 4e-3
    assert r["time_vs_f32_precision"] == time_ratio(r["median_ms"], r["f32_precision_median_ms"])
    # The CPU's unit's own peak, where it has one (the FMAs' is peak_gflops),
    # used or not: bf16 runs on it only where it outruns the FMAs.
    assert r["bf16_peak_gflops"] is None or r["bf16_peak_gflops"] > 0
    assert r["unit"] == "highway" or r["bf16_peak_gflops"] is not None
    assert "int8_peak_gops" not in r
    on_unit = r["bf16_peak_gflops"] if r["unit"] != "highway" else r["peak_gflops"]
    check_ceiling(r, d, on_unit, on_unit, 8)
    # int8 precision: on x86's VNNI or Arm's SDOT where the CPU has it, its
    # error the quantization's.
    r = json.loads(quick_bench("attention", "--n", n, "--heads", heads, "--head-dim", d, "--precision", "int8",
                      "--threads", 1, "--json").stdout)
    assert r["precision"] == "int8" and r["unit"] in {"highway", "avx512_vnni", "neon_dotprod"}
    assert 1e-3 < r["error_vs_f64"] < 2e-2
    assert r["time_vs_f32_precision"] == time_ratio(r["median_ms"], r["f32_precision_median_ms"])
    # Its unit's own peak where the CPU has one (a byte product and its sum
    # counting 2), used or not; and the bf16 unit's, where its P·V runs.
    assert r["int8_peak_gops"] is None or r["int8_peak_gops"] > 0
    assert r["unit"] == "highway" or r["int8_peak_gops"] is not None
    pv = r["bf16_peak_gflops"] if r["pv_unit"] != "highway" else r["peak_gflops"]
    check_ceiling(r, d, r["int8_peak_gops"] if r["unit"] != "highway" else r["peak_gflops"], pv, 8)
    # A chunk of queries against a longer cache, aligned bottom-right: query i
    # sees keys 0 .. i + (kv_len - n).
    n_q, n_k = 64, 200
    r = json.loads(quick_bench("attention", "--n", n_q, "--kv-len", n_k, "--heads", heads, "--head-dim", d,
                      "--causal", "--threads", 1, "--json").stdout)
    assert (r["n"], r["kv_len"]) == (n_q, n_k)
    pairs = sum(min(i + n_k - n_q + 1, n_k) for i in range(n_q))
    assert r["gflops"] == pytest.approx(4 * n_q * n_k * d * heads / r["median_ms"] * 1e-6,
                                        rel=rate_tol(r["median_ms"], r["gflops"]))
    assert r["gflops_unmasked"] == pytest.approx(4 * pairs * d * heads / r["median_ms"] * 1e-6,
                                                 rel=rate_tol(r["median_ms"], r["gflops_unmasked"]))
    L = 6000
    r = json.loads(quick_bench("decode", "--kv-len", L, "--heads", heads, "--head-dim", d,
                      "--threads", 1, "--json").stdout)
    assert r["gbps"] == pytest.approx(2 * heads * L * d * 4 / r["median_ms"] * 1e-6,
                                      rel=rate_tol(r["median_ms"], r["gbps"]))
    assert r["ratio_to_peak"] == pytest.approx(r["gbps"] / r["peak_gbps"], rel=2e-3, abs=1e-4)
    assert r["ceiling"] == r["peak_gbps"] and r["ratio_to_ceiling"] == r["ratio_to_peak"]  # the read bandwidth
    # q8_0 K/V: the bytes counted are q8_0's (34 per 32 values), the error is
    # q8_0's rounding; a head dim that is not whole blocks is an error naming it.
    r = json.loads(quick_bench("decode", "--kv-len", L, "--heads", heads, "--head-dim", d,
                      "--kv-dtype", "q8_0", "--threads", 1, "--json").stdout)
    assert r["gbps"] == pytest.approx(2 * heads * L * d // 32 * 34 / r["median_ms"] * 1e-6,
                                      rel=rate_tol(r["median_ms"], r["gbps"]))
    assert 1e-4 < r["error_vs_f64"] < 2e-2 and r["speedup_vs_f32"] > 0
    bad = run("bench", "decode", "--kv-len", L, "--heads", heads, "--head-dim", 20, "--kv-dtype", "q8_0")
    assert bad.returncode != 0 and "multiple of 32" in bad.stderr
    # q4_0: 18 bytes per 32 values; issue 50's bound on its error.
    r = json.loads(quick_bench("decode", "--kv-len", L, "--heads", heads, "--head-dim", d,
                      "--kv-dtype", "q4_0", "--threads", 1, "--json").stdout)
    assert r["gbps"] == pytest.approx(2 * heads * L * d // 32 * 18 / r["median_ms"] * 1e-6,
                                      rel=rate_tol(r["median_ms"], r["gbps"]))
    assert 1e-3 < r["error_vs_f64"] < 8e-2 and r["speedup_vs_f32"] > 0
    # int4 (KIVI's): 20 bytes per 32 values, keys per channel; the same bound.
    r = json.loads(quick_bench("decode", "--kv-len", L, "--heads", heads, "--head-dim", d,
                      "--kv-dtype", "int4", "--threads", 1, "--json").stdout)
    key_blocks, value_blocks = -(-L // 32) * d, L * d // 32  # (a last group of keys partial)
    assert r["gbps"] == pytest.approx(heads * (key_blocks + value_blocks) * 20 / r["median_ms"] * 1e-6,
                                      rel=rate_tol(r["median_ms"], r["gbps"]))
    assert 1e-3 < r["error_vs_f64"] < 8e-2 and r["speedup_vs_f32"] > 0
    bad = run("bench", "backward", "--n", 64, "--kv-dtype", "int4")
    assert bad.returncode != 0 and "int4 has no backward" in bad.stderr
    # Over int4 pages: whole groups of keys in a page.
    r = json.loads(quick_bench("decode", "--kv-len", L, "--heads", heads, "--head-dim", d, "--kv-dtype", "int4",
                      "--page-size", 32, "--threads", 1, "--json").stdout)
    assert (r["kv_dtype"], r["page_size"]) == ("int4", 32) and r["ratio_to_contiguous"] > 0
    bad = run("bench", "decode", "--kv-len", L, "--kv-dtype", "int4", "--page-size", 16)
    assert bad.returncode != 0 and "page_size must be a multiple of 32, got 16" in bad.stderr
    # int8 precision over q8_0: q rounded to q8_0 too, its error q8_0's and a
    # little more, timed against float32 precision on the unit named; with
    # other caches (computed in float32) or over pages, an error naming both.
    f32 = r8 = None
    for precision in ("f32", "int8"):
        r = json.loads(quick_bench("decode", "--kv-len", L, "--heads", heads, "--head-dim", d, "--kv-dtype", "q8_0",
                          "--precision", precision, "--threads", 1, "--json").stdout)
        assert r["precision"] == precision
        f32, r8 = (r, r8) if precision == "f32" else (f32, r)
    assert f32["error_vs_f64"] < r8["error_vs_f64"] < 1.5 * f32["error_vs_f64"]
    assert r8["unit"] in ("highway", "avx512_vnni", "neon_dotprod") and r8["time_vs_f32_precision"] > 0
    bad = run("bench", "decode", "--kv-len", L, "--precision", "int8")
    assert bad.returncode != 0 and "needs --kv-dtype q8_0" in bad.stderr
    bad = run("bench", "decode", "--kv-len", L, "--kv-dtype", "q8_0", "--precision", "int8", "--page-size", 16)
    assert bad.returncode != 0 and "--page-size" in bad.stderr
    # MLA's absorbed decode: 2·H·kv_len·(576 + 512) FLOPs against the FMA peak, on the unit named
    r = json.loads(quick_bench("mla", "--kv-len", 700, "--heads", 4, "--kv-dtype", "bf16", "--threads", 1,
                      "--json").stdout)
    assert (r["kind"], r["kv_len"], r["heads"], r["kv_dtype"], r["unit"]) == ("mla", 700, 4, "bf16", "highway")
    assert r["gflops"] == pytest.approx(2 * 4 * 700 * (576 + 512) / r["median_ms"] * 1e-6,
                                        rel=rate_tol(r["median_ms"], r["gflops"]))
    assert r["ratio_to_peak"] == pytest.approx(r["gflops"] / r["peak_gflops"], rel=2e-3, abs=1e-4)
