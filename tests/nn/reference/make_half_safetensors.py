#!/usr/bin/python3
"""Writes tests/nn/reference/half_tensors.safetensors: bfloat16 and float16 tensors made by
PyTorch, in the safetensors layout (dtype strings "BF16" and "F16", the tensors' own
little-endian bytes), for tests/nn/serialize_half_test.cpp.

The `safetensors` package is not on this machine, so the file is written with json +
struct as its writer lays it out (tests/nn/reference/check_safetensors.py validates it):
the bytes of each tensor are torch's, t.view(torch.int16).numpy(). Beside each 16-bit
tensor the same values widened to float32 ("<name>_as_f32"), so the test needs no
conversion of its own to know what torch meant. Run with Debian's python3-torch (1.13):

    /usr/bin/python3 tests/nn/reference/make_half_safetensors.py
"""
import json
import os
import struct

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
VALUES = [1.0, -2.5, 3.14159265, 0.1, 1e-40, 65504.0, 65520.0, 1e38, -0.0, float("inf"),
          float("-inf"), 2**-24, 3 * 2**-25]


def tensor_bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def main():
    source = torch.tensor(VALUES, dtype=torch.float32).reshape(13)
    tensors = [
        ("bf16", "BF16", source.to(torch.bfloat16)),
        ("bf16_as_f32", "F32", source.to(torch.bfloat16).float()),
        ("f16", "F16", source.to(torch.float16)),
        ("f16_as_f32", "F32", source.to(torch.float16).float()),
        ("source", "F32", source),
        ("bf16_matrix", "BF16", torch.arange(12, dtype=torch.float32).reshape(3, 4).div(7).to(torch.bfloat16)),
    ]
    header, payload, offset = {}, b"", 0
    for name, code, t in tensors:
        raw = tensor_bytes(t)
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        payload += raw
    header["__metadata__"] = {"format": "pt", "made_by": "torch " + torch.__version__}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(HERE, "half_tensors.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + payload)


if __name__ == "__main__":
    main()
