#!/usr/bin/python3
"""Reference values for tests/nn/sgd_test.cpp, from torch.optim.SGD itself.

Each case runs 5 steps of SGD on one float32 parameter p of 4 elements, whose gradient
at every step is set to g = c * p + d (the gradient of sum(c * p^2 / 2 + d * p)), and
prints p after the last step. The C++ test runs the same steps with mg::optim::SGD and
compares against these numbers (pasted there as constants).

Run: /usr/bin/python3 tests/nn/reference/sgd_reference.py   (Debian's python3-torch)
"""
import torch

P0 = [0.5, -1.25, 2.0, 0.75]
C = [1.0, 0.5, -0.25, 2.0]
D = [0.1, -0.2, 0.3, 0.0]
STEPS = 5

# name, lr, momentum, dampening, weight_decay, nesterov (same order as the C++ test)
CASES = [
    ("plain", 0.1, 0.0, 0.0, 0.0, False),
    ("momentum", 0.1, 0.9, 0.0, 0.0, False),
    ("dampening", 0.1, 0.9, 0.5, 0.0, False),
    ("weight_decay", 0.1, 0.0, 0.0, 0.01, False),
    ("momentum_weight_decay", 0.1, 0.9, 0.0, 0.01, False),
    ("nesterov", 0.1, 0.9, 0.0, 0.0, True),
    ("nesterov_weight_decay", 0.05, 0.8, 0.0, 0.1, True),
]


def cpp_float(v):
    """A C++ float literal that reads back to the same float32 (9 significant digits)."""
    text = f"{v:.9g}"
    if not any(ch in text for ch in ".en"):
        text += ".0"
    return text + "f"


def main():
    print(f"torch {torch.__version__}")
    c = torch.tensor(C, dtype=torch.float32)
    d = torch.tensor(D, dtype=torch.float32)
    for name, lr, momentum, dampening, weight_decay, nesterov in CASES:
        p = torch.tensor(P0, dtype=torch.float32, requires_grad=True)
        opt = torch.optim.SGD([p], lr=lr, momentum=momentum, dampening=dampening,
                              weight_decay=weight_decay, nesterov=nesterov)
        for _ in range(STEPS):
            with torch.no_grad():
                p.grad = c * p + d
            opt.step()
        values = ", ".join(cpp_float(v) for v in p.detach().tolist())
        print(f"    {{\"{name}\", {{{values}}}}},")


if __name__ == "__main__":
    main()
