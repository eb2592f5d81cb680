#!/usr/bin/python3
"""Write a PyTorch nn.MultiheadAttention's weights to a safetensors file that
attn reads (MultiHeadAttention.load in C++ and Python, `attn mha --weights`).

As a library:  export_mha(module, "layer.safetensors")
As a command:  export_torch_mha.py OUT.safetensors --embed-dim E --num-heads H
                   [--kdim K] [--vdim V] [--no-bias] [--state-dict FILE.pt] [--seed S]
               builds the module, loads FILE.pt (a torch.save'd state_dict) if given,
               else keeps torch's random initialisation from --seed, and exports it.

Uses only torch and numpy.
"""
import argparse
import json
import struct
import sys

import numpy as np
import torch


def write_safetensors(path, tensors, metadata):
    """tensors: name -> float32 numpy array. Little-endian F32, 8-byte aligned header."""
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    offset = 0
    blobs = []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def export_mha(module, path):
    """Export an nn.MultiheadAttention, with every option it has, to `path`."""
    if not isinstance(module, torch.nn.MultiheadAttention):
        raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(module).__name__}")
    state = {name: t.detach().cpu().float().numpy() for name, t in module.state_dict().items()}
    flag = {True: "true", False: "false"}
    metadata = {
        "format": "attn.MultiHeadAttention",
        "embed_dim": module.embed_dim,
        "num_heads": module.num_heads,
        "kdim": module.kdim,
        "vdim": module.vdim,
        "bias": flag[module.in_proj_bias is not None],
        "add_bias_kv": flag[module.bias_k is not None],
        "add_zero_attn": flag[bool(module.add_zero_attn)],
        "batch_first": flag[bool(module.batch_first)],
        "dropout": repr(float(module.dropout)),
    }
    write_safetensors(path, state, metadata)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="output .safetensors")
    p.add_argument("--embed-dim", type=int, required=True)
    p.add_argument("--num-heads", type=int, required=True)
    p.add_argument("--kdim", type=int)
    p.add_argument("--vdim", type=int)
    p.add_argument("--no-bias", action="store_true")
    p.add_argument("--state-dict", help="a torch.save'd nn.MultiheadAttention state_dict")
    p.add_argument("--seed", type=int, default=0, help="torch seed for a random layer")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    module = torch.nn.MultiheadAttention(args.embed_dim, args.num_heads, bias=not args.no_bias,
                                         kdim=args.kdim, vdim=args.vdim, batch_first=True)
    if args.state_dict:
        module.load_state_dict(torch.load(args.state_dict, map_location="cpu"))
    export_mha(module, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
