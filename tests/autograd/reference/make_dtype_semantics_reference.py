#!/usr/bin/python3
"""Reference results for tests/autograd/dtype_semantics_test.cpp, computed with PyTorch.

PyTorch is not available where the tests run, so the results are computed once here and
pasted into the test. Run with Debian's python3-torch (1.13, CPU):

    /usr/bin/python3 tests/autograd/reference/make_dtype_semantics_reference.py

Two tables: every arithmetic op with a Python scalar, in both orders, on int64, float32
and float64 tensors (the dtype torch gives, by category, and the values); and the unary
ops and reductions of an int64 tensor (the dtype and values, or torch's error). The output
is C++ to paste between the markers of the test.
"""
import torch

X = {
    "int64": torch.tensor([7, -3, 0, 5]),
    "float32": torch.tensor([1.5, -2.25, 0.1, 3.0]),
    "float64": torch.tensor([1.5, -2.25, 0.1, 3.0], dtype=torch.float64),
}
# (C++ spelling, Python value): 2 and -3 are integers, the others floating-point numbers.
SCALARS = [("int64_t{2}", 2), ("2.0", 2.0), ("2.5", 2.5), ("1.0", 1.0), ("int64_t{-3}", -3),
           ("0.1", 0.1)]
OPS = {
    "x + s": lambda x, s: x + s,
    "s + x": lambda x, s: s + x,
    "x - s": lambda x, s: x - s,
    "s - x": lambda x, s: s - x,
    "x * s": lambda x, s: x * s,
    "s * x": lambda x, s: s * x,
    "x / s": lambda x, s: x / s,
    "s / x": lambda x, s: s / x,
}
DTYPE = {torch.int64: "DType::Int64", torch.float32: "DType::Float32",
         torch.float64: "DType::Float64"}


def values(t):
    if t.dtype == torch.int64:
        return ", ".join(str(int(v)) for v in t)
    # repr of a double is exact, and a float32 value is a double exactly.
    def one(v):
        if v != v:
            return "NAN"
        if v in (float("inf"), float("-inf")):
            return "INFINITY" if v > 0 else "-INFINITY"
        return repr(float(v))
    return ", ".join(one(v) for v in t.tolist())


lines = []
for name, x in X.items():
    for spelling, s in SCALARS:
        for op, f in OPS.items():
            r = f(x, s)
            lines.append(f'    {{"{name}", {spelling}, "{op}", {DTYPE[r.dtype]}, {{{values(r)}}}}},')
print("const std::vector<ScalarCase> kScalarCases = {")
print("\n".join(lines))
print("};")

ints = X["int64"]
UNARY = {
    "neg": torch.neg, "relu": torch.relu, "abs": torch.abs, "exp": torch.exp, "log": torch.log,
    "sqrt": torch.sqrt, "tanh": torch.tanh, "sum": torch.sum,
    "argmax": lambda t: torch.argmax(t, dim=-1, keepdim=True), "mean": torch.mean,
}
print("const std::vector<UnaryCase> kUnaryCases = {")
for op, f in UNARY.items():
    try:
        r = f(ints).reshape(-1)
        print(f'    {{"{op}", {DTYPE[r.dtype]}, {{{values(r)}}}, ""}},')
    except RuntimeError as e:
        print(f'    {{"{op}", DType::Int64, {{}}, "{str(e).splitlines()[0]}"}},')
print("};")
