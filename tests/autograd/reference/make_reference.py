#!/usr/bin/python3
"""Reference numbers for tests/autograd/torch_reference_test.cpp, computed with PyTorch.

PyTorch is not available where the tests run (CI), so the numbers are computed once here
and pasted into the test. Run with Debian's python3-torch (1.13, CPU):

    /usr/bin/python3 tests/autograd/reference/make_reference.py

Every input is a closed-form function of its element index (see `pattern`), written the
same way in the C++ test, so nothing random has to be copied across. All arithmetic is
float32, as in minigrad. The output is C++ to paste between the markers of the test.
"""
import math
import textwrap

import torch

torch.set_default_dtype(torch.float32)


def pattern(shape, a, b, scale):
    """Element i (row-major) is scale * sin(a * i + b), rounded to float32."""
    n = math.prod(shape)
    values = [scale * math.sin(a * i + b) for i in range(n)]
    return torch.tensor(values, dtype=torch.float32).reshape(shape)


def cpp(name, t):
    """A C++ vector of the tensor's values (row-major), wrapped at 100 columns."""
    flat = t.detach().reshape(-1).tolist()
    body = ", ".join(f"{v:.9g}f" for v in flat) + "};"
    wrapped = textwrap.wrap(body, width=96, initial_indent="    ", subsequent_indent="    ",
                            break_on_hyphens=False)
    return f"const std::vector<float> {name} = {{\n" + "\n".join(wrapped)


def leaf(t):
    return t.clone().requires_grad_(True)


lines = []

# ---- a two-layer MLP: linear -> relu -> linear -> cross_entropy (mean) ----
x = leaf(pattern((5, 7), 0.7, 0.3, 1.0))
w1 = leaf(pattern((6, 7), 1.3, 0.1, 0.5))
b1 = leaf(pattern((6,), 2.1, 0.5, 0.2))
w2 = leaf(pattern((3, 6), 0.9, 1.7, 0.6))
b2 = leaf(pattern((3,), 1.1, 0.2, 0.1))
targets = torch.tensor([0, 2, 1, 1, 0], dtype=torch.int64)
hidden = torch.nn.functional.linear(x, w1, b1)
# The check is only meaningful away from relu's kink.
assert hidden.abs().min().item() > 1e-2, hidden.abs().min().item()
logits = torch.nn.functional.linear(torch.relu(hidden), w2, b2)
loss = torch.nn.functional.cross_entropy(logits, targets)
loss.backward()
lines.append(f"// MLP: loss = {loss.item():.9g}")
lines.append(cpp("kMlpLogits", logits))
lines.append(f"const float kMlpLoss = {loss.item():.9g}f;")
for name, t in [("kMlpGradX", x), ("kMlpGradW1", w1), ("kMlpGradB1", b1), ("kMlpGradW2", w2),
                ("kMlpGradB2", b2)]:
    lines.append(cpp(name, t.grad))

# ---- elementwise and reductions with broadcasting, weighted so every output counts ----
a = leaf(pattern((3, 4), 0.5, 0.2, 1.0))
b = leaf(pattern((1, 4), 1.9, 0.4, 0.8))
c = leaf(pattern((3, 1), 0.8, 1.0, 0.5))
weights = pattern((3, 4), 0.3, 0.9, 1.0)
assert (a - 0.25).abs().min().item() > 1e-2  # away from relu's kink
y = torch.log(a * a + 1.0) - b / (c.exp() + 1.0) + torch.relu(a - 0.25) * 2.0
y = y - y.mean(dim=1, keepdim=True) + y.sum(dim=0)
(y * weights).sum().backward()
lines.append(cpp("kMixedOut", y))
lines.append(cpp("kMixedGradA", a.grad))
lines.append(cpp("kMixedGradB", b.grad))
lines.append(cpp("kMixedGradC", c.grad))

# ---- log_softmax over dim 0 of a transposed input, large logits ----
s = leaf(pattern((4, 3), 0.6, 0.0, 3.0) + 1000.0)
z = torch.log_softmax(s.t(), dim=0)
(z * pattern((3, 4), 1.7, 0.5, 1.0)).sum().backward()
lines.append(cpp("kLogSoftmaxOut", z))
lines.append(cpp("kLogSoftmaxGrad", s.grad))

print("\n".join(lines))
