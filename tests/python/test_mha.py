"""attn.MultiHeadAttention against torch.nn.MultiheadAttention (PyTorch 1.13),
GQA against NumPy, the KV cache, files, and the export script -> CLI path."""
import errno
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import attn
from util import PEAK_BYTES, rel_err, run_python

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CLI = os.environ.get("ATTN_CLI", os.path.join(ROOT, "build", "bin", "attn"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import export_torch_mha  # noqa: E402


def torch_pair(E, H, kdim=None, vdim=None, bias=True, seed=0):
    """A torch layer and an attn layer holding the same weights."""
    torch.manual_seed(seed)
    t = torch.nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=True,
                                    dtype=torch.float32)
    t.eval()
    a = attn.MultiHeadAttention(E, H, kdim=kdim, vdim=vdim, bias=bias)
    a.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    return t, a


def run_torch(t, q, k, v, **kw):
    with torch.no_grad():
        conv = {name: (torch.from_numpy(m) if isinstance(m, np.ndarray) else m)
                for name, m in kw.items()}
        out, w = t(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), **conv)
    return out.numpy(), (None if w is None else w.numpy())


CONFIGS = [  # E, H, kdim, vdim, bias
    (16, 4, None, None, True), (16, 4, None, None, False), (24, 3, 10, 6, True),
    (8, 1, 5, None, False), (32, 8, None, 12, True)]


@pytest.mark.parametrize("E,H,kdim,vdim,bias", CONFIGS)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("average", [True, False])
def test_parity_with_torch(E, H, kdim, vdim, bias, batched, average):
    rng = np.random.default_rng(E + H)
    t, a = torch_pair(E, H, kdim, vdim, bias)
    lead = (3,) if batched else ()
    q = rng.normal(size=lead + (5, E)).astype(np.float32)
    k = rng.normal(size=lead + (7, kdim or E)).astype(np.float32)
    v = rng.normal(size=lead + (7, vdim or E)).astype(np.float32)
    ref, ref_w = run_torch(t, q, k, v, need_weights=True, average_attn_weights=average)
    out, w = a(q, k, v, need_weights=True, average_attn_weights=average)
    assert out.shape == ref.shape and w.shape == ref_w.shape
    assert rel_err(out, ref) <= 1e-5
    assert rel_err(w, ref_w) <= 1e-5
    out64, w64 = a(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                   need_weights=True, average_attn_weights=average)
    assert out64.dtype == np.float64 and rel_err(out64, ref) <= 1e-5


def test_self_attention_defaults_key_and_value_to_query():
    t, a = torch_pair(16, 4)
    x = np.random.default_rng(1).normal(size=(2, 6, 16)).astype(np.float32)
    ref, _ = run_torch(t, x, x, x)
    out, w = a(x, need_weights=False)
    assert w is None
    assert rel_err(out, ref) <= 1e-5
    assert rel_err(a.forward(x)[0], ref) <= 1e-5


def mask_cases(rng, B, H, nq, nk):
    bool2 = rng.random((nq, nk)) < 0.3
    bool2[:, 0] = False  # keep a key per row so torch gives no NaN
    float2 = rng.normal(size=(nq, nk)).astype(np.float32)
    bool3 = rng.random((B * H, nq, nk)) < 0.3
    bool3[..., 0] = False
    float3 = rng.normal(size=(B * H, nq, nk)).astype(np.float32)
    kpm_bool = rng.random((B, nk)) < 0.3
    kpm_bool[:, 0] = False
    kpm_float = rng.normal(size=(B, nk)).astype(np.float32)
    return [
        dict(attn_mask=bool2), dict(attn_mask=float2), dict(attn_mask=bool3),
        dict(attn_mask=float3), dict(key_padding_mask=kpm_bool),
        dict(key_padding_mask=kpm_float), dict(attn_mask=bool2, key_padding_mask=kpm_bool),
        dict(attn_mask=float3, key_padding_mask=kpm_bool),
    ]


@pytest.mark.parametrize("case", range(8))
def test_masks_match_torch(case):
    rng = np.random.default_rng(case)
    B, H, nq, nk = 2, 4, 5, 6
    t, a = torch_pair(16, H)
    q = rng.normal(size=(B, nq, 16)).astype(np.float32)
    kv = rng.normal(size=(B, nk, 16)).astype(np.float32)
    masks = mask_cases(rng, B, H, nq, nk)[case]
    ref, ref_w = run_torch(t, q, kv, kv, need_weights=True, average_attn_weights=False, **masks)
    out, w = a(q, kv, kv, need_weights=True, average_attn_weights=False, **masks)
    assert rel_err(out, ref) <= 1e-5
    assert rel_err(w, ref_w) <= 1e-5


def test_unbatched_masks_match_torch():
    rng = np.random.default_rng(3)
    t, a = torch_pair(16, 2)
    x = rng.normal(size=(5, 16)).astype(np.float32)
    kpm = np.array([False, True, False, False, True])
    am = np.triu(np.ones((5, 5), dtype=bool), 1)
    ref, ref_w = run_torch(t, x, x, x, key_padding_mask=kpm, attn_mask=am)
    out, w = a(x, key_padding_mask=kpm, attn_mask=am, need_weights=True)
    assert rel_err(out, ref) <= 1e-5 and rel_err(w, ref_w) <= 1e-5


def test_causal_matches_torch_upper_triangle_mask():
    rng = np.random.default_rng(4)
    t, a = torch_pair(16, 4)
    x = rng.normal(size=(2, 7, 16)).astype(np.float32)
    blocked = np.triu(np.ones((7, 7), dtype=bool), 1)
    ref, _ = run_torch(t, x, x, x, attn_mask=blocked)
    assert rel_err(a(x, causal=True)[0], ref) <= 1e-5
    assert rel_err(a(x, causal="top_left")[0], ref) <= 1e-5


def test_fully_masked_rows_give_the_output_bias_not_nan():
    rng = np.random.default_rng(5)
    t, a = torch_pair(16, 4)
    x = rng.normal(size=(2, 4, 16)).astype(np.float32)
    kpm = np.zeros((2, 4), dtype=bool)
    kpm[1] = True  # batch entry 1: every key is padding
    ref, _ = run_torch(t, x, x, x, key_padding_mask=kpm)
    assert np.isnan(ref[1]).all()  # PyTorch's behaviour
    out, _ = a(x, key_padding_mask=kpm)
    assert rel_err(out[0], ref[0]) <= 1e-5
    bias = a.state_dict()["out_proj.bias"]
    np.testing.assert_array_equal(out[1], np.broadcast_to(bias, (4, 16)))


# ---------------------------------------------------------------------------
# GQA / MQA against NumPy that repeats each key/value head for its query heads.

def numpy_gqa_layer(sd, x, H, Hkv):
    E = x.shape[-1]
    dh = E // H
    bq, bk, bv = np.split(sd["in_proj_bias"], [E, E + Hkv * dh])
    q = x @ sd["q_proj_weight"].T + bq
    k = x @ sd["k_proj_weight"].T + bk
    v = x @ sd["v_proj_weight"].T + bv
    B, n, _ = x.shape
    q = q.reshape(B, n, H, dh).transpose(0, 2, 1, 3)
    k = np.repeat(k.reshape(B, n, Hkv, dh).transpose(0, 2, 1, 3), H // Hkv, axis=1)
    v = np.repeat(v.reshape(B, n, Hkv, dh).transpose(0, 2, 1, 3), H // Hkv, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ctx = (p @ v).transpose(0, 2, 1, 3).reshape(B, n, E)
    return ctx @ sd["out_proj.weight"].T + sd["out_proj.bias"]


@pytest.mark.parametrize("H,Hkv", [(8, 2), (8, 1), (4, 4), (6, 3)])
def test_gqa_matches_numpy(H, Hkv):
    a = attn.MultiHeadAttention(48, H, num_kv_heads=Hkv, seed=H * 10 + Hkv)
    sd = {k: v.astype(np.float64) for k, v in a.state_dict().items()}
    sd["in_proj_bias"] = np.random.default_rng(1).normal(size=sd["in_proj_bias"].shape)
    a.load_state_dict(sd)
    sd = {k: v.astype(np.float64) for k, v in a.state_dict().items()}  # stored as float32
    assert sd["k_proj_weight"].shape == (Hkv * 48 // H, 48)
    x = np.random.default_rng(H).normal(size=(2, 9, 48))
    ref = numpy_gqa_layer(sd, x, H, Hkv)
    assert rel_err(a(x)[0], ref) <= 1e-12
    assert rel_err(a(x.astype(np.float32))[0], ref) <= 1e-5


# ---------------------------------------------------------------------------
# KV cache

@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("chunk", [1, 5, 31])
def test_kv_cache_chunks_equal_full_causal_forward(rope, chunk):
    a = attn.MultiHeadAttention(32, 4, num_kv_heads=2, rope=rope, seed=3)
    x = np.random.default_rng(6).normal(size=(2, 37, 32)).astype(np.float32)
    full, _ = a(x, causal=True)
    cache = a.new_cache()
    parts = [a(x[:, i:i + chunk], cache=cache, causal=True)[0] for i in range(0, 37, chunk)]
    assert len(cache) == 37
    assert rel_err(np.concatenate(parts, axis=1), full) <= 1e-5


def test_rope_layer_rotates_q_and_k_per_head():
    # Reference: the layer without RoPE, fed q/k already rotated — built by hand.
    a = attn.MultiHeadAttention(16, 2, rope=True, seed=4, bias=False)
    sd = a.state_dict()
    x = np.random.default_rng(7).normal(size=(6, 16))
    wq, wk, wv = np.split(sd["in_proj_weight"].astype(np.float64), 3)
    def heads(t):
        return t.reshape(6, 2, 8).transpose(1, 0, 2)
    q, k, v = heads(x @ wq.T), heads(x @ wk.T), heads(x @ wv.T)
    half = lambda t: np.concatenate([-t[..., 4:], t[..., :4]], -1)  # noqa: E731
    ang = np.arange(6)[:, None] * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    q, k = q * cos + half(q) * sin, k * cos + half(k) * sin
    ctx = attn.attention(q, k, v).transpose(1, 0, 2).reshape(6, 16)
    ref = ctx @ sd["out_proj.weight"].T.astype(np.float64)
    assert rel_err(a(x)[0], ref) <= 1e-12


def test_cache_dtype_is_fixed_by_first_use():
    a = attn.MultiHeadAttention(8, 2)
    c = a.new_cache()
    a(np.ones((1, 2, 8), np.float32), cache=c, causal=True)
    with pytest.raises(TypeError, match="holds float32"):
        a(np.ones((1, 2, 8)), cache=c, causal=True)
    with pytest.raises(TypeError, match="new_cache"):
        a(np.ones((1, 2, 8), np.float32), cache="not a cache")


# ---------------------------------------------------------------------------
# State dict and files

@pytest.mark.parametrize("E,H,kdim,vdim,bias", CONFIGS)
def test_state_dict_names_and_shapes_match_torch(E, H, kdim, vdim, bias):
    t, a = torch_pair(E, H, kdim, vdim, bias)
    ours = a.state_dict()
    theirs = t.state_dict()
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert ours[name].shape == tuple(theirs[name].shape) and ours[name].dtype == np.float32
        np.testing.assert_array_equal(ours[name], theirs[name].numpy())


def test_load_state_dict_errors():
    a = attn.MultiHeadAttention(8, 2)
    sd = a.state_dict()
    with pytest.raises(ValueError, match="missing key 'out_proj.bias'"):
        a.load_state_dict({k: v for k, v in sd.items() if k != "out_proj.bias"})
    # add_bias_kv's keys in a layer built without it name the option
    t = torch.nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True)
    with pytest.raises(ValueError, match=r"unexpected key 'bias_k'.*nn.MultiheadAttention\(add_bias_kv=True\)"
                                         r": build the layer with add_bias_kv=True"):
        a.load_state_dict(t.state_dict())
    with pytest.raises(ValueError, match=r"'in_proj_weight' has shape \(8, 24\), expected \(24, 8\)"):
        a.load_state_dict({**sd, "in_proj_weight": sd["in_proj_weight"].T})


def test_constructor_errors():
    with pytest.raises(ValueError, match="must be divisible by num_heads"):
        attn.MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="num_kv_heads"):
        attn.MultiHeadAttention(12, 4, num_kv_heads=3)
    with pytest.raises(TypeError):
        attn.MultiHeadAttention(12, 4, kdim="5")


def test_save_load_and_seed(tmp_path):
    a = attn.MultiHeadAttention(16, 4, num_kv_heads=2, vdim=6, rope=True, seed=11)
    path = str(tmp_path / "layer.safetensors")
    a.save(path)
    b = attn.MultiHeadAttention.load(path)
    assert (b.num_kv_heads, b.vdim, b.rope) == (2, 6, True)
    x, v = np.ones((1, 3, 16), np.float32), np.ones((1, 3, 6), np.float32)
    np.testing.assert_array_equal(a(x, x, v)[0], b(x, x, v)[0])
    same = attn.MultiHeadAttention(16, 4, num_kv_heads=2, vdim=6, rope=True, seed=11)
    np.testing.assert_array_equal(same.state_dict()["q_proj_weight"], a.state_dict()["q_proj_weight"])
    other = attn.MultiHeadAttention(16, 4, num_kv_heads=2, vdim=6, rope=True, seed=12)
    assert not np.array_equal(other.state_dict()["q_proj_weight"], a.state_dict()["q_proj_weight"])
    with pytest.raises(OSError):
        attn.MultiHeadAttention.load(str(tmp_path / "missing.safetensors"))
    with open(path, "r+b") as f:  # a lying header length
        f.write((1 << 20).to_bytes(8, "little"))
    with pytest.raises(ValueError, match="runs past the end"):
        attn.MultiHeadAttention.load(path)


def lying_file(path, embed_dim):
    """A small layer's tensors under metadata that claims embed_dim: about 1.8 KB."""
    import json
    import struct
    tensors = attn.MultiHeadAttention(8, 4, seed=1).state_dict()
    header, data = {"__metadata__": {"embed_dim": str(embed_dim), "num_heads": "4"}}, b""
    for name, t in sorted(tensors.items()):
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [len(data), len(data) + t.nbytes]}
        data += t.astype("<f4").tobytes()
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize("embed_dim", [16384, 65536])
def test_a_small_file_claiming_a_large_layer_allocates_nothing_for_it(tmp_path, embed_dim):
    """Its metadata is checked against its own tensors' shapes first: load
    allocated and initialised 4.2 GB for 10 s (more than 64 GiB at 65536)
    before refusing the file. Peak memory in a fresh interpreter."""
    path = str(tmp_path / "lying.safetensors")
    lying_file(path, embed_dim)
    assert os.path.getsize(path) < 2500
    r = run_python(PEAK_BYTES + f"""
import attn
open('/proc/self/clear_refs', 'w').write('5')
before = peak_bytes()
try:
    attn.MultiHeadAttention.load({path!r})
except ValueError as e:
    print(peak_bytes() - before, e)
""", timeout=60)
    assert r.returncode == 0, r.stderr
    grew, message = r.stdout.split(" ", 1)
    assert int(grew) < 16 << 20, f"{int(grew) / 2**20:.0f} MiB"
    assert f"its metadata (embed_dim {embed_dim}, num_heads 4) needs a tensor 'in_proj_bias'" in message


def test_attn_mha_refuses_such_a_file_as_quickly(tmp_path):
    path = str(tmp_path / "lying.safetensors")
    lying_file(path, 16384)
    np.save(tmp_path / "x.npy", np.ones((1, 2, 8), np.float32))
    r = subprocess.run([CLI, "mha", str(tmp_path / "x.npy"), "--weights", path, "--out", str(tmp_path / "o.npy")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "needs a tensor 'in_proj_bias' of shape (49152,)" in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "o.npy")


def test_safetensors_that_the_reference_refuses_are_value_errors(tmp_path):
    """A key twice in the header (the last one was kept) and bytes after the
    data, as the format's reference implementation refuses them."""
    good = str(tmp_path / "layer.safetensors")
    attn.MultiHeadAttention(8, 2, seed=1).save(good)
    with open(good, "rb") as f:
        raw = f.read()
    trailing = str(tmp_path / "trailing.safetensors")
    with open(trailing, "wb") as f:
        f.write(raw + b"\0")
    with pytest.raises(ValueError, match="1 bytes follow the data section's last tensor"):
        attn.MultiHeadAttention.load(trailing)
    n = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + n].decode().rstrip()
    duplicated = str(tmp_path / "duplicated.safetensors")
    text = header.replace('{"__metadata__"', '{"__metadata__": {"a": "1"}, "__metadata__"', 1).encode()
    with open(duplicated, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    with pytest.raises(ValueError, match="header has the key '__metadata__' twice"):
        attn.MultiHeadAttention.load(duplicated)


def test_paths_and_headers_that_are_not_utf8(tmp_path):
    """A str naming a Latin-1 file (as os.listdir gives it) raised "Unable to
    cast Python instance to C++ type"; a bytes path to a missing file an
    OSError() with no message; a header key with a raw 0xff byte an empty
    ValueError(). Paths are taken as Python takes them (os.fsencode), errors
    are the OSError subclass open() raises, and messages show such bytes."""
    m = attn.MultiHeadAttention(8, 2, seed=1)
    latin1 = os.path.join(os.fsencode(tmp_path), b"caf\xe9.safetensors")
    m.save(os.fsdecode(latin1))  # a str with a surrogate escape
    assert os.path.exists(latin1)
    for path in (latin1, os.fsdecode(latin1), pathlib.Path(os.fsdecode(latin1))):
        np.testing.assert_array_equal(attn.MultiHeadAttention.load(path).state_dict()["out_proj.weight"],
                                      m.state_dict()["out_proj.weight"])
    missing = os.path.join(os.fsencode(tmp_path), b"no\xffsuch.safetensors")
    with pytest.raises(FileNotFoundError) as e:
        attn.MultiHeadAttention.load(missing)
    assert e.value.errno == errno.ENOENT and e.value.filename == os.fsdecode(missing)
    assert "cannot open for reading: No such file or directory" in str(e.value)
    with open(latin1, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    bad = raw[8:8 + n].replace(b'"out_proj.bias"', b'"out_proj.bia\xff"', 1)
    with open(latin1, "wb") as f:
        f.write(len(bad).to_bytes(8, "little") + bad + raw[8 + n:])
    with pytest.raises(ValueError) as e:
        attn.MultiHeadAttention.load(latin1)
    assert str(e.value) and "\\xe9" in str(e.value), str(e.value)  # the path's byte, shown
    with pytest.raises(TypeError, match="path must be a str, bytes or path-like object, got 3"):
        attn.MultiHeadAttention.load(3)


def test_save_to_a_full_disk_and_load_from_a_folder_are_os_errors(tmp_path):
    """A failed write raises (the final flush went unchecked: save returned as if it
    had worked); a folder is not a file (was RuntimeError without the name)."""
    full = tmp_path / "full.safetensors"
    os.symlink("/dev/full", full)
    with pytest.raises(OSError, match="No space left on device"):
        attn.MultiHeadAttention(4, 1).save(str(full))  # small: the old writer raised nothing
    with pytest.raises(IsADirectoryError, match="cannot read: Is a directory") as e:
        attn.MultiHeadAttention.load(str(tmp_path))
    assert e.value.filename == str(tmp_path)


# ---------------------------------------------------------------------------
# The export script -> file -> `attn mha` CLI -> PyTorch's output

@pytest.mark.parametrize("kdim,bias,causal,extras", [(None, True, False, False), (None, False, True, False),
                                                    (None, True, True, False), (None, True, False, True)])
def test_export_then_cli_equals_torch(tmp_path, kdim, bias, causal, extras):
    """extras: add_bias_kv, add_zero_attn and batch_first=False, which the file keeps."""
    torch.manual_seed(5)
    t = torch.nn.MultiheadAttention(32, 4, bias=bias, batch_first=not extras, add_bias_kv=extras,
                                    add_zero_attn=extras).eval()
    weights = str(tmp_path / "w.safetensors")
    export_torch_mha.export_mha(t, weights)
    x = np.random.default_rng(8).normal(size=(9, 2, 32) if extras else (2, 9, 32)).astype(np.float32)
    np.save(tmp_path / "in.npy", x)
    cmd = [CLI, "mha", "--weights", weights, str(tmp_path / "in.npy"), "--out",
           str(tmp_path / "out.npy")] + (["--causal"] if causal else [])
    subprocess.run(cmd, check=True, capture_output=True)
    got = np.load(tmp_path / "out.npy")
    mask = torch.triu(torch.ones(9, 9, dtype=torch.bool), 1) if causal else None
    with torch.no_grad():
        ref = t(*(torch.from_numpy(x),) * 3, attn_mask=mask)[0].numpy()
    assert got.dtype == np.float32 and rel_err(got, ref) <= 1e-5
    # float64 in, float64 out; unbatched input
    first = x[:, 0] if extras else x[0]
    np.save(tmp_path / "in64.npy", first.astype(np.float64))
    subprocess.run([CLI, "mha", "--weights", weights, str(tmp_path / "in64.npy"), "--out",
                    str(tmp_path / "out64.npy")] + (["--causal"] if causal else []), check=True)
    got64 = np.load(tmp_path / "out64.npy")
    assert got64.dtype == np.float64 and rel_err(got64, ref[:, 0] if extras else ref[0]) <= 1e-5


def test_export_script_command_line(tmp_path):
    out = str(tmp_path / "x.safetensors")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_torch_mha.py"), out,
                    "--embed-dim", "24", "--num-heads", "3", "--kdim", "10", "--seed", "2"],
                   check=True)
    layer = attn.MultiHeadAttention.load(out)
    torch.manual_seed(2)
    t = torch.nn.MultiheadAttention(24, 3, kdim=10, batch_first=True)
    for name, value in t.state_dict().items():
        np.testing.assert_array_equal(layer.state_dict()[name], value.numpy())


@pytest.mark.parametrize("content,needle", [
    (b"", "shorter than its 8-byte header length"),
    ((16).to_bytes(8, "little") + b'{"a": 1}', "runs past the end"),
    ((1 << 40).to_bytes(8, "little"), "exceeds 100 MiB"),
])
def test_cli_reports_corrupt_weights_in_one_line(tmp_path, content, needle):
    (tmp_path / "bad.safetensors").write_bytes(content)
    np.save(tmp_path / "in.npy", np.ones((3, 8), np.float32))
    r = subprocess.run([CLI, "mha", "--weights", str(tmp_path / "bad.safetensors"),
                        str(tmp_path / "in.npy"), "--out", str(tmp_path / "o.npy")],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert needle in r.stderr and r.stderr.count("\n") == 1


def test_cli_reports_bad_npy_and_usage(tmp_path):
    weights = str(tmp_path / "w.safetensors")
    attn.MultiHeadAttention(8, 2).save(weights)
    np.save(tmp_path / "ints.npy", np.ones((3, 8), np.int32))
    np.save(tmp_path / "full.npy", np.ones((3, 8), np.float32))
    (tmp_path / "trunc.npy").write_bytes((tmp_path / "full.npy").read_bytes()[:140])
    np.save(tmp_path / "wrong.npy", np.ones((3, 7), np.float32))
    for name, needle in [("ints.npy", "'<i4'"),
                         ("trunc.npy", "bytes of data"), ("missing.npy", "cannot open"),
                         ("wrong.npy", "embed_dim=8")]:
        r = subprocess.run([CLI, "mha", "--weights", weights, str(tmp_path / name), "--out",
                            str(tmp_path / "o.npy")], capture_output=True, text=True)
        assert r.returncode == 1, name
        assert needle in r.stderr and r.stderr.count("\n") == 1, (name, r.stderr)
    r = subprocess.run([CLI, "mha", str(tmp_path / "ints.npy")], capture_output=True, text=True)
    assert r.returncode == 2 and "--weights" in r.stderr


def test_cli_reads_every_float_npy_that_numpy_writes(tmp_path):
    """Fortran order, big-endian and float16 files (refused before) give what the
    same array in native float32/float64 gives: the CLI reads what np.load reads."""
    weights = str(tmp_path / "w.safetensors")
    attn.MultiHeadAttention(8, 2, seed=3).save(weights)
    x = np.random.default_rng(4).normal(size=(2, 5, 8))

    def mha(name, array):
        np.save(tmp_path / name, array)
        r = subprocess.run([CLI, "mha", "--weights", weights, str(tmp_path / name), "--out",
                            str(tmp_path / "o.npy")], capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr)
        return np.load(tmp_path / "o.npy")

    for dtype in (np.float32, np.float64):
        native = mha("native.npy", x.astype(dtype))
        for name, array in [("fortran.npy", np.asfortranarray(x.astype(dtype))),
                            ("big.npy", x.astype(np.dtype(dtype).newbyteorder(">"))),
                            ("big_fortran.npy",
                             np.asfortranarray(x.astype(np.dtype(dtype).newbyteorder(">"))))]:
            got = mha(name, array)
            assert got.dtype == dtype, name  # the output is native, of the input's precision
            np.testing.assert_array_equal(got, native, err_msg=name)
    # float16 is read as float32, exactly (every half is a float): the output is
    # the float32 layer's on the rounded input.
    rounded = mha("rounded.npy", x.astype(np.float16).astype(np.float32))
    for name, dtype in [("half.npy", "<f2"), ("big_half.npy", ">f2")]:
        got = mha(name, np.asfortranarray(x.astype(dtype)))
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, rounded, err_msg=name)


@pytest.mark.parametrize("options", [
    dict(window=(3, 0)), dict(window=(2, 1), causal=True), dict(softcap=2.0),
    dict(scale=0.7), dict(causal="top_left", softcap=1.5, scale=0.2, window=(4, -1))])
def test_the_layer_takes_every_attention_option(options):
    """The layer's forward passes causal, window, softcap and scale on as attn.attention
    means them: against explicit torch ops on the layer's own projections (float64),
    with both PyTorch masks, boolean and float, beside them."""
    from torch_reference import torch_attention
    rng = np.random.default_rng(6)
    E, H, B, nq, nk = 16, 4, 2, 5, 9
    m = attn.MultiHeadAttention(E, H)
    sd = {k: v.astype(np.float64) for k, v in m.state_dict().items()}
    q_in = rng.normal(size=(B, nq, E))
    kv_in = rng.normal(size=(B, nk, E))
    attn_mask = rng.normal(size=(nq, nk))                 # float: added
    padding = np.zeros((B, nk), bool)
    padding[1, [2, 7]] = True                              # boolean: blocked
    out = m(q_in, kv_in, kv_in, attn_mask=attn_mask, key_padding_mask=padding, **options)[0]

    w, b = sd["in_proj_weight"], sd["in_proj_bias"]
    heads = lambda x: x.reshape(B, -1, H, E // H).transpose(0, 2, 1, 3)
    q, k, v = (heads(x @ w[i * E:(i + 1) * E].T + b[i * E:(i + 1) * E])
               for i, x in enumerate((q_in, kv_in, kv_in)))
    additive = attn_mask[None, None] + np.where(padding[:, None, None, :], -np.inf, 0.0)
    ctx, _ = torch_attention(q, k, v, mask=additive, **options)
    ref = ctx.numpy().transpose(0, 2, 1, 3).reshape(B, nq, E) @ sd["out_proj.weight"].T + sd["out_proj.bias"]
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)


def test_padding_mask_costs_no_dense_mask():
    """Batch 1, n = 16384, E = 512, 8 heads, a key_padding_mask, no weights: peak memory
    grows by at most the six (n, E) float32 arrays (input, q, k, v, attention output,
    layer output) + 64 MiB; a dense (batch, heads, n, n) mask would be 8 GiB."""
    n, E = 16384, 512
    code = ("import attn, numpy as np\n" + PEAK_BYTES +
            f"m = attn.MultiHeadAttention({E}, 8)\n"
            f"pad = np.zeros((1, {n}), bool); pad[0, -100:] = True\n"
            "before = peak_bytes()\n"
            f"x = np.random.default_rng(0).standard_normal((1, {n}, {E}), dtype=np.float32)\n"
            "y, w = m(x, key_padding_mask=pad, need_weights=False)\n"
            "assert w is None and np.isfinite(y).all()\n"
            "print(peak_bytes() - before)\n")
    r = run_python(code, timeout=300)
    assert r.returncode == 0, r.stderr
    grown, allowed = int(r.stdout), 6 * n * E * 4 + (64 << 20)
    assert grown <= allowed, f"{grown / 2**20:.0f} MiB > {allowed / 2**20:.0f} MiB"
