#!/usr/bin/python3
"""Reference values for tests/nn/clip_grad_test.cpp, from torch.nn.utils.clip_grad_norm_.

Three parameters of odd sizes ([3, 5], [7], [1]) get closed-form gradients (`pattern`,
written the same way in the C++ test); a fourth has no gradient. Each case clips them
with one norm type and max_norm and prints the returned total norm and the clipped
gradients, as C++ to paste between the markers of the test.

Run: /usr/bin/python3 tests/nn/reference/clip_grad_reference.py   (Debian's python3-torch 1.13)
"""
import math
import textwrap

import torch

SHAPES = [(3, 5), (7,), (1,)]
PATTERNS = [(0.7, 0.3, 1.5), (1.3, 0.1, 2.0), (0.5, 1.0, 0.25)]
# name, norm_type, max_norm (the same order and values as kCases in the C++ test)
CASES = [
    ("l2_clipped", 2.0, 1.0),
    ("l2_not_clipped", 2.0, 100.0),
    ("l1", 1.0, 2.0),
    ("inf", math.inf, 0.5),
    ("p3", 3.0, 0.75),
]


def pattern(shape, a, b, scale):
    """Element i (row-major) is scale * sin(a * i + b), rounded to float32."""
    n = math.prod(shape)
    return torch.tensor([scale * math.sin(a * i + b) for i in range(n)],
                        dtype=torch.float32).reshape(shape)


def cpp_floats(values):
    body = ", ".join(f"{v:.9g}f" for v in values)
    return "\n".join(textwrap.wrap(body, width=88, initial_indent="       ",
                                   subsequent_indent="       ", break_on_hyphens=False)).strip()


def main():
    print(f"// torch {torch.__version__}")
    for name, norm_type, max_norm in CASES:
        params = [torch.zeros(shape, requires_grad=True) for shape in SHAPES]
        for p, (a, b, scale) in zip(params, PATTERNS):
            p.grad = pattern(p.shape, a, b, scale)
        frozen = torch.zeros(2, requires_grad=True)
        total = torch.nn.utils.clip_grad_norm_(params + [frozen], max_norm, norm_type)
        grads = [v for p in params for v in p.grad.reshape(-1).tolist()]
        print(f"    {{\"{name}\", {total.item():.9g}f,\n     {{{cpp_floats(grads)}}}}},")


if __name__ == "__main__":
    main()
