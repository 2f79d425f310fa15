#!/usr/bin/python3
"""Reference numbers for tests/autograd/transformer_reference_test.cpp, computed with PyTorch.

As make_reference.py: PyTorch is not available where the tests run, so the numbers are
computed once here and pasted into the test between its markers (or written there with
--write). Run with Debian's python3-torch (1.13, CPU):

    /usr/bin/python3 tests/autograd/reference/make_transformer_reference.py --write

Every input is a closed-form function of its element index (`pattern`, the same in the C++
test), and all arithmetic is float64, so the comparison is tight. Each case weights its
output with another pattern and backpropagates the weighted sum, so every output element
and every input gradient is checked. torch 1.13 has no scaled_dot_product_attention, so
attention is written out here as its definition (torch 2's documented reference code).
"""
import math
import sys
import textwrap

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)


def pattern(shape, a, b, scale):
    """Element i (row-major) is scale * sin(a * i + b), in float64."""
    n = math.prod(shape)
    values = [scale * math.sin(a * i + b) for i in range(n)]
    return torch.tensor(values, dtype=torch.float64).reshape(shape)


def leaf(t):
    return t.clone().requires_grad_(True)


def cpp(name, t):
    flat = t.detach().reshape(-1).tolist()
    body = ", ".join(f"{v:.17g}" for v in flat) + "};"
    wrapped = textwrap.wrap(body, width=96, initial_indent="    ", subsequent_indent="    ",
                            break_on_hyphens=False)
    return f"const std::vector<double> {name} = {{\n" + "\n".join(wrapped)


lines = []


def record(prefix, out, weight_args, leaves):
    """out weighted by pattern(out.shape, *weight_args), backpropagated; records all."""
    (out * pattern(tuple(out.shape), *weight_args)).sum().backward()
    lines.append(cpp(f"k{prefix}Out", out))
    for name, t in leaves:
        lines.append(cpp(f"k{prefix}Grad{name}", t.grad))


# ---- batched matmul with broadcast batch dims ----
a = leaf(pattern((2, 3, 4, 5), 0.7, 0.3, 1.0))
b = leaf(pattern((3, 5, 2), 1.3, 0.1, 0.5))
record("Bmm", torch.matmul(a, b), (0.9, 0.2, 1.0), [("A", a), ("B", b)])

# ---- linear on [B, T, C] ----
x = leaf(pattern((2, 3, 5), 0.5, 0.2, 1.0))
w = leaf(pattern((4, 5), 1.9, 0.4, 0.8))
bias = leaf(pattern((4,), 0.8, 1.0, 0.5))
record("Linear", F.linear(x, w, bias), (0.3, 0.9, 1.0), [("X", x), ("W", w), ("B", bias)])

# ---- embedding with repeated indices ----
table = leaf(pattern((5, 3), 1.1, 0.6, 1.0))
idx = torch.tensor([[1, 4, 1], [0, 2, 4]], dtype=torch.int64)
record("Embedding", F.embedding(idx, table), (0.6, 0.1, 1.0), [("W", table)])

# ---- layer_norm over the last dim, with weight and bias ----
x = leaf(pattern((2, 3, 6), 0.9, 0.7, 2.0) + 0.5)
w = leaf(pattern((6,), 1.7, 0.5, 1.0))
bias = leaf(pattern((6,), 0.4, 0.3, 0.5))
record("LayerNorm", F.layer_norm(x, (6,), w, bias, 1e-5), (1.2, 0.4, 1.0),
       [("X", x), ("W", w), ("B", bias)])

# ---- gelu (both forms) and tanh ----
x = leaf(pattern((3, 7), 0.6, 0.0, 3.0))
record("GeluExact", F.gelu(x), (1.7, 0.5, 1.0), [("X", x)])
x = leaf(pattern((3, 7), 0.6, 0.0, 3.0))
record("GeluTanh", F.gelu(x, approximate="tanh"), (1.7, 0.5, 1.0), [("X", x)])
x = leaf(pattern((3, 7), 0.6, 0.0, 3.0))
record("Tanh", torch.tanh(x), (1.7, 0.5, 1.0), [("X", x)])

# ---- softmax over a middle dim, log_softmax over the first ----
x = leaf(pattern((3, 4, 5), 0.45, 0.1, 2.0))
record("Softmax", torch.softmax(x, dim=1), (0.8, 0.3, 1.0), [("X", x)])
x = leaf(pattern((3, 4, 5), 0.45, 0.1, 2.0))
record("LogSoftmax", torch.log_softmax(x, dim=0), (0.8, 0.3, 1.0), [("X", x)])

# ---- masked_fill with a broadcast mask ----
x = leaf(pattern((3, 5), 0.5, 0.5, 1.0))
mask = torch.tensor([[True, False, False, True, False]])
record("MaskedFill", x.masked_fill(mask, -2.5), (0.7, 0.2, 1.0), [("X", x)])


# ---- attention, causal and not: softmax(q k^T / sqrt(E) + mask) v ----
def attention(q, k, v, is_causal):
    L, S = q.size(-2), k.size(-2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if is_causal:
        scores = scores.masked_fill(torch.ones(L, S, dtype=torch.bool).tril().logical_not(),
                                    float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


for causal, name in [(False, "Attention"), (True, "CausalAttention")]:
    q = leaf(pattern((2, 2, 5, 3), 0.3, 0.1, 1.5))
    k = leaf(pattern((2, 2, 5, 3), 0.7, 0.4, 1.5))
    v = leaf(pattern((2, 2, 5, 4), 1.1, 0.9, 1.0))
    record(name, attention(q, k, v, causal), (0.5, 0.6, 1.0), [("Q", q), ("K", k), ("V", v)])

# ---- permute, split on an inner dim, cat ----
x = leaf(pattern((2, 3, 5), 0.35, 0.25, 1.0))
pieces = torch.split(x.permute(2, 0, 1), 2, dim=0)  # sizes 2, 2, 1
record("PermuteSplitCat", torch.cat([pieces[2], pieces[0] * pieces[1]], dim=0), (0.9, 0.1, 1.0),
       [("X", x)])

block = "\n".join(lines)
if "--write" in sys.argv:
    path = "tests/autograd/transformer_reference_test.cpp"
    begin = "// ---- generated by tests/autograd/reference/make_transformer_reference.py: begin ----\n"
    end = "// ---- generated by tests/autograd/reference/make_transformer_reference.py: end ----"
    text = open(path).read()
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    open(path, "w").write(head + begin + block + "\n" + end + tail)
else:
    print(block)
