#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<target>/).

Seeds are small valid files, so the fuzzer starts from inputs that reach deep into the
readers, plus a few near misses. Run from anywhere; the output is deterministic and
committed, so this script is only needed to change the seeds.
"""
import gzip
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    path = os.path.join(HERE, "corpus", target, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def idx(dims, values):
    header = struct.pack(">I", 0x0800 | len(dims)) + b"".join(struct.pack(">I", d) for d in dims)
    return header + bytes(values)


def gz(data):
    return gzip.compress(data, mtime=0)


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, offset, payload = {}, 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        payload += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + payload


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def i64(values):
    return struct.pack("<%dq" % len(values), *values)


def u16(values):
    """Raw 16-bit patterns (bfloat16 or float16 bits)."""
    return struct.pack("<%dH" % len(values), *values)


# ---- IDX: labels (1-D) and images (3-D), raw and gzipped ----
labels = idx([6], [0, 9, 3, 1, 7, 2])
images = idx([2, 28, 28], [(i * 37) % 256 for i in range(2 * 28 * 28)])
small = idx([2, 3, 3], list(range(18)))
write("idx", "labels-idx1-ubyte", labels)
write("idx", "images-idx3-ubyte", images)
write("idx", "small-idx3-ubyte", small)
write("idx", "labels-idx1-ubyte.gz", gz(labels))
write("idx", "small-idx3-ubyte.gz", gz(small))
write("idx", "empty-idx3-ubyte", idx([0, 28, 28], []))
write("idx", "truncated-idx3-ubyte", small[:-5])

# ---- safetensors: what nn::save, nn::load and the training checkpoints hold ----
write("safetensors", "linear-2x3.safetensors", safetensors(
    [("bias", "F32", [3], f32([0.1, -0.2, 0.3])),
     ("weight", "F32", [3, 2], f32([1, 2, 3, 4, 5, 6]))],
    {"format": "pt"}))
write("safetensors", "mixed.safetensors", safetensors(
    [("ints", "I64", [2, 2], i64([1, -2, 3, 1 << 40])),
     ("empty", "F32", [0, 4], b""),
     ("scalar", "F32", [], f32([2.5]))],
    {"note": "seed"}))
write("safetensors", "checkpoint.safetensors", safetensors(
    [("model.bias", "F32", [3], f32([0, 0, 0])),
     ("model.weight", "F32", [3, 2], f32([1, 0, 0, 1, 1, 1])),
     ("optim.momentum_buffer.0", "F32", [3, 2], f32([0.5] * 6)),
     ("rng.state", "I64", [2], i64([42, 7]))],
    {"epoch": "1", "step": "12"}))
write("safetensors", "header-only.safetensors", safetensors([], {"format": "pt"}))
# 16-bit floats: a bfloat16 model's weights (1, -2, 0.5, a subnormal) and float16 ones,
# and a float16 tensor holding inf and NaN (refused unless allow_non_finite).
write("safetensors", "half.safetensors", safetensors(
    [("weight", "BF16", [2, 2], u16([0x3F80, 0xC000, 0x3F00, 0x0001])),
     ("bias", "F16", [3], u16([0x3C00, 0x7BFF, 0x0001]))],
    {"format": "pt"}))
write("safetensors", "half-non-finite.safetensors", safetensors(
    [("h", "F16", [2], u16([0x7C00, 0x7E00])), ("b", "BF16", [1], u16([0xFFC0]))]))


# ---- store: TCPStore message streams (store_protocol.h) after one byte that seeds how
# the fuzz target cuts them into reads ----
def message(code, args):
    payload = b"".join(struct.pack("<I", len(a)) + a for a in args)
    return struct.pack("<BII", code, len(args), len(payload)) + payload


SET, GET, ADD, CHECK, WAIT, HELLO = 1, 2, 3, 4, 5, 6
OK, VALUE, ERROR = 100, 101, 102
hello = message(HELLO, [b"minigrad-tcpstore", b"2", b"default", b"1"])
session = (hello + message(SET, [b"default/gloo/0/rank_1", bytes(range(40))]) +
           message(GET, [b"default/gloo/0/rank_0"]) + message(ADD, [b"default/barrier", b"1"]) +
           message(CHECK, [b"default/a", b"default/b"]) + message(WAIT, []) +
           message(WAIT, [b"default/x"] * 3))
write("store", "session", b"\x00" + session)
write("store", "session-cut-small", b"\x07" + session)
write("store", "replies", b"\x2a" + message(OK, [b"default"]) + message(VALUE, [b"3"]) +
      message(ERROR, [b"key 'c' holds 9223372036854775807; adding 1 would overflow int64"]))
write("store", "truncated", b"\x01" + session[:-3])
write("store", "too-many-arguments", b"\x02" + struct.pack("<BII", CHECK, 65, 4 * 65) + bytes(4 * 65))
write("store", "too-large", b"\x03" + struct.pack("<BII", SET, 2, 1 << 30) + struct.pack("<I", 3) + b"key")
write("store", "argument-past-end", b"\x04" + struct.pack("<BII", SET, 2, 12) + struct.pack("<I", 3) +
      b"key" + struct.pack("<I", 99) + b"v")
write("store", "trailing-bytes", b"\x05" + struct.pack("<BII", GET, 1, 9) + struct.pack("<I", 3) + b"key" +
      b"xx")
write("store", "http", b"\x06GET / HTTP/1.1\r\nHost: store\r\n\r\n")
# ---- what a reader must refuse without reading or inflating past its header ----
# A gzip bomb in small: 3 labels declared, then 1 MiB of zeros (about 1 KiB compressed);
# the reader stops inflating after the declared 11 bytes.
write("idx", "bomb-labels-idx1-ubyte.gz", gz(idx([3], [1, 2, 3]) + bytes(1 << 20)))
# A header that declares nearly 2^64 bytes over 100 bytes of data: no buffer of the
# declared size may be made.
write("idx", "liar-idx3-ubyte.gz", gz(idx([0xFFFFFFFF, 0xFFFF, 0xFFFF], []) + bytes(100)))
# The weights of a run that diverged: refused unless LoadOptions::allow_non_finite.
write("safetensors", "non-finite.safetensors", safetensors(
    [("bias", "F32", [3], f32([0.1, float("nan"), 0.3])),
     ("weight", "F32", [3, 2], f32([1, 2, float("inf"), 4, 5, -float("inf")]))],
    {"format": "pt"}))
# A header length far past the end of the file: refused before anything is allocated.
write("safetensors", "header-length-past-end.safetensors", struct.pack("<Q", 1 << 40) + b'{"a":1}')


# ---- token files (minigrad/data/token_file.h) ----
def token_file(vocab, tokens, version=1, vocab_size=None, count=None):
    vocab_size = len(vocab) if vocab_size is None else vocab_size
    count = len(tokens) if count is None else count
    return (b"MGTOKENS" + struct.pack("<IIQ", version, vocab_size, count) + bytes(vocab) +
            bytes(tokens))


text = b"To be or not to be.\n"
vocab = sorted(set(text))
write("token_file", "hello.tokens", token_file(vocab, [vocab.index(c) for c in text]))
write("token_file", "one-char.tokens", token_file([0x41], [0, 0, 0]))
write("token_file", "all-bytes.tokens", token_file(list(range(256)), list(range(255, -1, -1))))
write("token_file", "empty.tokens", token_file([0x20], []))
# Near misses: a token past the vocabulary, an unsorted vocabulary, 257 characters, and
# a header that declares nearly 2^64 tokens over a few bytes (refused before any is read).
write("token_file", "token-out-of-range.tokens", token_file([0x61, 0x62], [0, 1, 2]))
write("token_file", "unsorted-vocab.tokens", token_file([0x62, 0x61], [0, 1]))
write("token_file", "vocab-too-large.tokens", token_file([0x61], [0], vocab_size=257))
write("token_file", "liar.tokens", token_file([0x61], [0] * 8, count=(1 << 64) - 8))
# Keys given twice (json.dumps cannot write them): two tensors of one name, a metadata key
# twice, __metadata__ twice, and a tensor entry with two shapes. Refused, never one kept.
def raw_safetensors(header_text, payload):
    text = header_text.encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + payload


t = '{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
write("safetensors", "duplicate-tensor.safetensors",
      raw_safetensors('{"w":%s,"w":%s}' % (t, t), f32([1, 2])))
write("safetensors", "duplicate-metadata-key.safetensors",
      raw_safetensors('{"w":%s,"__metadata__":{"epoch":"1","epoch":"7"}}' % t, f32([1, 2])))
write("safetensors", "duplicate-metadata.safetensors",
      raw_safetensors('{"__metadata__":{"epoch":"1"},"w":%s,"__metadata__":{"epoch":"2"}}' % t,
                      f32([1, 2])))
write("safetensors", "duplicate-shape.safetensors",
      raw_safetensors('{"w":{"dtype":"F32","shape":[2],"shape":[1],"data_offsets":[0,8]}}',
                      f32([1, 2])))
# A training checkpoint whose metadata numbers are out of range (train_fashion_mnist's
# --resume refuses them, naming the key; the loader itself reads them as text).
write("safetensors", "checkpoint-metadata-out-of-range.safetensors", safetensors(
    [("model.bias", "F32", [3], f32([0, 0, 0]))],
    {"epoch": "99999999999999999999999", "epoch_batches": "-1",
     "epoch_seen": "18446744073709551616", "generator_offset": "1e400"}))
