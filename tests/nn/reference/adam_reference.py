#!/usr/bin/python3
"""Reference values for tests/nn/adam_test.cpp, from torch.optim.Adam and AdamW themselves.

Each case runs 6 steps on one float32 parameter p of 37 elements (an odd size). The
gradient at step s is g = scale[s] * (c * p + d): the gradient of a quadratic, scaled by
a factor that grows and shrinks, so that the second moment falls at some steps and
amsgrad's running maximum differs from it. p0, c and d are closed-form functions of the
element index (`pattern`), written the same way in the C++ test, so nothing random has
to be copied across. The output is C++ to paste between the markers of the test.

Run: /usr/bin/python3 tests/nn/reference/adam_reference.py   (Debian's python3-torch 1.13)
"""
import math
import textwrap

import torch

N = 37
STEPS = 6
SCALE = [3.0, 1.0, 0.5, 0.25, 2.0, 0.1]

# name, class, options (the same order and values as kCases in the C++ test)
CASES = [
    ("adam", "Adam", dict(lr=1e-2)),
    ("adam_weight_decay", "Adam", dict(lr=1e-2, weight_decay=0.1)),
    ("adam_amsgrad_betas", "Adam", dict(lr=1e-2, betas=(0.8, 0.9), amsgrad=True)),
    ("adam_maximize_eps", "Adam", dict(lr=5e-3, eps=1e-3, maximize=True)),
    ("adamw", "AdamW", dict(lr=1e-2)),
    ("adamw_weight_decay_amsgrad", "AdamW", dict(lr=1e-2, weight_decay=0.5, amsgrad=True)),
    ("adamw_betas_eps", "AdamW", dict(lr=2e-2, betas=(0.5, 0.6), eps=1e-6, weight_decay=0.1)),
]
# The case whose optimizer state after the last step is checked too.
STATE_CASE = "adamw_weight_decay_amsgrad"


def pattern(a, b, scale):
    """Element i is scale * sin(a * i + b), rounded to float32 (as kPattern in the test)."""
    return torch.tensor([scale * math.sin(a * i + b) for i in range(N)], dtype=torch.float32)


def cpp_floats(values):
    body = ", ".join(f"{v:.9g}f" for v in values)
    return "\n".join(textwrap.wrap(body, width=90, initial_indent="      ",
                                   subsequent_indent="      ", break_on_hyphens=False))


def main():
    print(f"// torch {torch.__version__}")
    p0 = pattern(0.7, 0.3, 1.5)
    c = pattern(1.3, 0.1, 1.0)
    d = pattern(0.4, 2.0, 0.5)
    state = None
    for name, cls, options in CASES:
        p = p0.clone().requires_grad_(True)
        opt = getattr(torch.optim, cls)([p], **options)
        for s in range(STEPS):
            with torch.no_grad():
                p.grad = SCALE[s] * (c * p + d)
            opt.step()
        print(f"    {{\"{name}\",\n     {{{cpp_floats(p.detach().tolist()).strip()}}}}},")
        if name == STATE_CASE:
            state = opt.state[p]
    print(f"// the state of {STATE_CASE} after the last step (step = {int(state['step'])})")
    for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        print(f"const std::vector<float> kTorch_{key} = {{\n{cpp_floats(state[key].tolist())}}};")


if __name__ == "__main__":
    main()
