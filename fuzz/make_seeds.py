"""Writes the seed corpus under fuzz/corpus/ (committed; rerun only to change the seeds).

Usage: /usr/bin/python3 fuzz/make_seeds.py   (from the repository root)
Regression inputs (regression_*) are saved fuzzer findings, not made here.
"""
import io
import json
import random
import struct

import numpy as np


def npy(path, a, **kw):
    b = io.BytesIO()
    np.save(b, a, **kw)
    open(path, "wb").write(b.getvalue())


def safetensors(path, tensors, metadata=None):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    j = json.dumps(header).encode()
    j += b" " * ((8 - len(j) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(j)) + j + data)


d = "fuzz/corpus/npy/"
npy(d + "f4_2x3.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
npy(d + "f8_vector.npy", np.array([1.5, -2.0, np.inf, np.nan]))
npy(d + "f4_scalar.npy", np.float32(3.0))
npy(d + "f4_empty_0x3.npy", np.zeros((0, 3), np.float32))
npy(d + "f4_fortran.npy", np.asfortranarray(np.ones((2, 3), np.float32)))
npy(d + "i4_refused.npy", np.ones(3, np.int32))
h = "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }"
h += " " * ((64 - (12 + len(h) + 1) % 64) % 64) + "\n"
open(d + "f8_version2.npy", "wb").write(
    b"\x93NUMPY\x02\x00" + struct.pack("<I", len(h)) + h.encode() + np.array([1.0, 2.0]).tobytes())

d = "fuzz/corpus/safetensors/"
safetensors(d + "f32_two_tensors.safetensors",
            {"w": ("F32", [2, 2], np.arange(4, dtype=np.float32).tobytes()),
             "b": ("F32", [2], np.ones(2, np.float32).tobytes())},
            {"embed_dim": "2", "format": "pt"})
safetensors(d + "f16_bf16.safetensors",
            {"h": ("F16", [3], np.array([1, -2, 65504], np.float16).tobytes()),
             "g": ("BF16", [2], bytes([0x80, 0x3f, 0xc0, 0x7f]))})
safetensors(d + "empty_tensor.safetensors", {"e": ("F32", [0, 4], b"")})
safetensors(d + "no_tensors.safetensors", {})
safetensors(d + "i64_refused.safetensors", {"i": ("I64", [1], bytes(8))})

# attention, rope and pages read their choices from the bytes: random seeds of a few lengths.
rng = random.Random(8)
for target in ["attention", "rope", "pages"]:
    for i, n in enumerate([1, 8, 16, 32, 48, 64, 96, 128]):
        open(f"fuzz/corpus/{target}/seed_{i}", "wb").write(bytes(rng.randrange(256) for _ in range(n)))
