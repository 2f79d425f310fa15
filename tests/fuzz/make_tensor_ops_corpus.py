#!/usr/bin/env python3
"""Writes the seed corpus of the tensor-ops fuzz harness (tests/fuzz/corpus/tensor_ops/).

Each seed is a small program in the encoding of tensor_ops_target.h: the cases that
once crashed or answered wrongly (index overflow in narrow, expand to a negative size,
w * w after an in-place write, int64 division by zero, relu and argmax of NaN,
cross_entropy's options), and a few programs that reach every op. Deterministic; run
from anywhere to rewrite the committed seeds.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "tensor_ops")

OPS = ["create", "narrow", "expand", "view", "transpose", "chunk", "cat", "copy_out", "unary",
       "binary", "scalar", "in_place", "reduce", "matmul", "loss", "require_grad", "backward",
       "read", "preserve", "as_strided"]
INT64_MAX, INT64_MIN = 2**63 - 1, -2**63
EDGES = [INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1, INT64_MAX - 254, INT64_MAX - 998,
         2**31, 2**32, 2**62, -2**62, 1000, -1000, 4096, 255, 256, -100]
NAN, INF = float("nan"), float("inf")
SPECIALS = ["nan", INF, -INF, "-0", 1e300, -1e300, 2.0**63, -2.0**63, 9.3e18, 0.5, 1e-30, -1e19,
            3.4e38, 1.5, 1e19, 9007199254740993.0]


def op(name):
    return bytes([OPS.index(name)])


def b(*values):
    return bytes(values)


def num(v):
    if -2 <= v <= 13:
        return b(v + 2)
    if v in EDGES:
        return b(0x80 + EDGES.index(v))
    return b(0xC0) + struct.pack("<q", v)


def scalar(x):
    if x == "nan":
        return b(0x80)
    if x == "-0":
        return b(0x83)
    if float(x).is_integer() and -10 <= x <= 10:
        return b(int(x) + 10)
    if x in SPECIALS:
        return b(0x80 + SPECIALS.index(x))
    return b(0xC0) + struct.pack("<d", x)


def shape(*sizes):
    return b(len(sizes)) + b"".join(num(s) for s in sizes)


def create(kind, dtype_int, sizes, *extra):
    kinds = ["zeros", "ones", "full", "arange", "rand", "randn", "floats", "ints"]
    return op("create") + b(kinds.index(kind), 1 if dtype_int else 0) + shape(*sizes) + b"".join(extra)


def floats(sizes, values):
    return create("floats", False, sizes, *[scalar(v) for v in values])


def ints(sizes, values):
    return create("ints", True, sizes, *[num(v) for v in values])


SEEDS = {
    # narrow(0, INT64_MAX - 254, 256).fill_(-9): aborted in malloc (heap corruption).
    "narrow-start-plus-length-overflow-then-fill": create("zeros", False, [1000])
    + op("narrow") + b(0) + num(0) + num(INT64_MAX - 254) + num(256)
    + op("in_place") + b(1, 0, 1) + scalar(-9),
    # full({1000}, 7).narrow(0, INT64_MAX - 998, 1000): read 999 values outside.
    "narrow-reads-outside": create("full", False, [1000], scalar(7))
    + op("narrow") + b(0) + num(0) + num(INT64_MAX - 998) + num(1000) + op("read") + b(1),
    # expand({-3}) gave shape [-3]; a huge broadcast view, chunked and narrowed.
    "expand-negative-and-huge": create("ones", False, [1])
    + op("expand") + b(0) + shape(-3)
    + op("expand") + b(0) + shape(INT64_MAX)
    + op("chunk") + b(1, 0) + num(2) + num(0) + b(1)
    + op("narrow") + b(2) + num(0) + num(INT64_MAX - 1) + num(3)
    + op("view") + b(1, 0) + shape(-1, 2),
    # w * w, then w.mul_(5) under no_grad, then backward: gave grad 10 instead of an error.
    "inplace-after-save-then-backward": create("ones", False, [3])
    + op("require_grad") + b(0)
    + op("binary") + b(0, 0, 2)
    + op("in_place") + b(0, 3, 1) + scalar(5)
    + op("backward") + b(1, 0),
    # int64 / 0 and INT64_MIN / -1: SIGFPE.
    "int64-division-by-zero-and-min-by-minus-one": ints([3], [7, -7, 3])
    + create("zeros", True, [3])
    + op("binary") + b(0, 1, 3)
    + op("scalar") + b(0, 3) + scalar(0)
    + op("scalar") + b(0, 4) + scalar(0)
    + ints([2], [INT64_MIN, 4])
    + op("scalar") + b(2, 4) + scalar(-1)
    + op("binary") + b(0, 0, 2) + op("reduce") + b(0, 0, 0, 0),
    # relu(NaN) and argmax with NaN, forward and backward.
    "relu-and-argmax-of-nan": floats([3], ["nan", -1, 2])
    + op("require_grad") + b(0)
    + op("unary") + b(0, 3)
    + op("reduce") + b(0, 4, 0, 0) + num(0)
    + op("backward") + b(1, 1),
    # cross_entropy with ignore_index -100 and label smoothing, then backward.
    "cross-entropy-ignore-and-smoothing": floats([4, 3], [1, 2, 3, 0.5, -1, 2, 3, 0, 1, 1, 1, 1])
    + ints([4], [0, -100, 2, 1])
    + op("require_grad") + b(0)
    + op("loss") + b(0, 1, 1) + num(-100) + scalar(0.5) + b(1)
    + op("backward") + b(2, 0)
    + op("loss") + b(0, 1, 1) + num(-100) + scalar(0.5) + b(0)
    + op("loss") + b(0, 1, 1) + num(2) + scalar(0) + b(2)
    + op("loss") + b(0, 0) + num(0),
    # Views, copies and reductions over one tensor.
    "views-and-reductions": create("rand", False, [4, 5])
    + op("transpose") + b(0) + num(0) + num(1)
    + op("copy_out") + b(1, 0)
    + op("view") + b(2, 0) + shape(-1)
    + op("chunk") + b(0, 1) + b(2) + num(1) + num(3) + num(0) + b(1)
    + op("cat") + b(0, 0) + num(1)
    + op("reduce") + b(0, 1) + b(1) + num(1) + b(1)
    + op("reduce") + b(1, 3) + b(2) + num(0) + num(0) + b(0)
    + op("as_strided") + b(0) + shape(2, 2) + num(5) + num(1) + num(3)
    + op("as_strided") + b(0) + shape(3) + num(1) + num(19)
    + op("read") + b(3),
    # A Linear layer, fused with its ReLU, and its backward.
    "linear-relu-backward": create("randn", False, [3, 4])
    + create("randn", False, [2, 4])
    + op("require_grad") + b(1)
    + op("matmul") + b(0, 1, 1)
    + op("matmul") + b(0, 1, 2)
    + op("scalar") + b(3, 2) + scalar(0.5)
    + op("backward") + b(4, 1)
    + op("in_place") + b(1, 3, 1) + scalar(2)
    + op("backward") + b(3, 0),
    # The escape hatch: a rewrite under UnsafePreserveVersionCounter keeps the graph.
    "preserve-version-then-backward": create("ones", False, [3])
    + op("require_grad") + b(0)
    + op("binary") + b(0, 0, 2)
    + op("preserve") + b(0) + scalar(1)
    + op("backward") + b(1, 0),
    # Creation at the edges: arange lengths, int64 fills out of range, randint's range.
    "creation-edges": create("arange", False, [], scalar(0), scalar(1e300), scalar(1))
    + create("arange", True, [], scalar(-1e19), scalar(0), scalar(1e18))
    + create("full", True, [2], scalar(1e300))
    + create("full", True, [2], scalar("nan"))
    + create("rand", True, [5], num(INT64_MIN), num(INT64_MAX))
    + create("zeros", False, [INT64_MAX, 2])
    + create("zeros", False, [2**62, 4, 0])
    + create("ones", False, [0])
    + op("view") + b(0, 0) + shape(2**62, 4, 0),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
