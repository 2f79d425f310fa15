#!/usr/bin/python3
"""Checks that files written by mg::nn::save / save_tensors are valid safetensors files.

The `safetensors` Python package is not available on the build machine (no Debian
package, no PyPI access), so this script applies the rules of its reader (the Rust
`SafeTensors::deserialize` of huggingface/safetensors) with json + struct, then turns
each tensor into a torch tensor (Debian's python3-torch). Where `safetensors` is
installed it also loads the file with `safetensors.torch.load_file` and compares.

  check_safetensors.py FILE...   validate and print each file's tensors and metadata
  check_safetensors.py --self-test
                                 validate the exact bytes that serialize_test.cpp
                                 ("save: writes the safetensors layout") pins down

Exit status 0 when every file passes, 1 otherwise.
"""
import json
import struct
import sys

import torch

MAX_HEADER_SIZE = 100_000_000  # the reader's own limit
DTYPES = {  # safetensors dtype -> (torch dtype, bytes per element)
    "BOOL": (torch.bool, 1), "U8": (torch.uint8, 1), "I8": (torch.int8, 1),
    "I16": (torch.int16, 2), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
    "I32": (torch.int32, 4), "F32": (torch.float32, 4),
    "I64": (torch.int64, 8), "F64": (torch.float64, 8),
}


def parse(data: bytes):
    """Returns (tensors, metadata) or raises ValueError naming the rule broken."""
    if len(data) < 8:
        raise ValueError("HeaderTooSmall")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_SIZE:
        raise ValueError("HeaderTooLarge")
    if 8 + n > len(data):
        raise ValueError("InvalidHeaderLength")
    text = data[8:8 + n].decode("utf-8")  # InvalidHeader if not UTF-8
    if not text.startswith("{"):
        raise ValueError("InvalidHeaderStart")
    header = json.loads(text)
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("InvalidHeaderDeserialization: __metadata__ values must be strings")
    buffer = data[8 + n:]

    # The reader wants the tensors to tile the data buffer exactly: sorted by offset,
    # each starting where the previous one ended, the last one ending at the end.
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"])
    end = 0
    tensors = {}
    for name, info in entries:
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"InvalidHeaderDeserialization: fields of {name}: {sorted(info)}")
        begin, stop = info["data_offsets"]
        if begin != end or stop < begin:
            raise ValueError(f"InvalidOffset: {name}")
        dtype, size = DTYPES[info["dtype"]]
        numel = 1
        for d in info["shape"]:
            numel *= d
        if stop - begin != numel * size:
            raise ValueError(f"TensorInvalidInfo: {name}")
        raw = bytearray(buffer[begin:stop])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(info["shape"])
        end = stop
    if end != len(buffer):
        raise ValueError("MetadataIncompleteBuffer")
    return tensors, metadata


def compare_with_safetensors_package(path, tensors):
    try:
        from safetensors.torch import load_file
    except ImportError:
        print("  (python3 safetensors not installed: checked with json + struct only)")
        return True
    loaded = load_file(path)
    same = loaded.keys() == tensors.keys() and all(
        torch.equal(loaded[k], tensors[k]) for k in tensors)
    print(f"  safetensors.torch.load_file: {'same tensors' if same else 'DIFFERENT'}")
    return same


def check_file(path):
    with open(path, "rb") as f:
        data = f.read()
    try:
        tensors, metadata = parse(data)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as e:
        print(f"{path}: INVALID: {e!r}")
        return False
    print(f"{path}: valid safetensors, {len(tensors)} tensors, metadata {metadata}")
    for name, t in tensors.items():
        print(f"  {name}: {t.dtype} {list(t.shape)} sum={t.double().sum().item():.9g}")
    return compare_with_safetensors_package(path, tensors)


def self_test():
    # The header and data that serialize_test.cpp asserts for its Counter module.
    header = ('{"__metadata__":{"epoch":"3","format":"pt"},'
              '"count":{"data_offsets":[0,16],"dtype":"I64","shape":[2]},'
              '"w":{"data_offsets":[16,32],"dtype":"F32","shape":[2,2]}}')
    header += " " * ((8 - len(header) % 8) % 8)
    data = (struct.pack("<Q", len(header)) + header.encode() +
            struct.pack("<2q", 0, -7) + struct.pack("<4f", *[0.5] * 4))
    tensors, metadata = parse(data)
    assert metadata == {"epoch": "3", "format": "pt"}, metadata
    assert torch.equal(tensors["count"], torch.tensor([0, -7]))
    assert torch.equal(tensors["w"], torch.full((2, 2), 0.5))
    print("self-test: the layout serialize_test.cpp pins down is valid safetensors")
    return True


def main(argv):
    if argv == ["--self-test"]:
        return 0 if self_test() else 1
    if not argv:
        print(__doc__)
        return 1
    return 0 if all([check_file(p) for p in argv]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
