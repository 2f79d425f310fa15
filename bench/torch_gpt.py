#!/usr/bin/python3
"""PyTorch's eager GPT training step, the reference of bench/gpt_bench.cpp.

The model is nanoGPT's (tests/models/reference/gpt_reference.py's copy), one step is
zero_grad, forward, cross-entropy, backward, AdamW with nanoGPT's groups; the median of
the timed steps after the warm-up. Prints one JSON line.

  /usr/bin/python3 bench/torch_gpt.py --threads 1
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "models", "reference"))
from gpt_reference import GPT  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=65)
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    # bf16-mixed: torch.autocast("cpu", torch.bfloat16) around forward and loss, as gpt-bench's.
    parser.add_argument("--precision", choices=["32-true", "bf16-mixed"], default="32-true")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    config = dict(block_size=a.block_size, vocab_size=a.vocab_size, n_layer=a.n_layer,
                  n_head=a.n_head, n_embd=a.n_embd, dropout=0.0, bias=True)
    model = GPT(config)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), 1e-8)
    x = torch.randint(0, a.vocab_size, (a.batch, a.block_size))
    y = torch.randint(0, a.vocab_size, (a.batch, a.block_size))
    ms, cpu_ms = [], []
    for s in range(a.warmup + a.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16-mixed"):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        value = loss.item()
        if s >= a.warmup:
            ms.append((time.perf_counter() - start) * 1e3)
            cpu_ms.append((time.process_time() - cpu_start) * 1e3)
    ms.sort()
    median = statistics.median(ms)
    print(json.dumps({
        "framework": "pytorch", "torch": torch.__version__, "work": "gpt", "precision": a.precision,
        "threads": a.threads,
        "n_layer": a.n_layer, "n_head": a.n_head, "n_embd": a.n_embd,
        "block_size": a.block_size, "batch": a.batch, "steps": a.steps,
        "median_ms": round(median, 3), "p10_ms": round(ms[int(0.1 * (len(ms) - 1) + 0.5)], 3),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1) + 0.5)], 3),
        "median_cpu_ms": round(statistics.median(cpu_ms), 3),
        "tokens_per_s": round(a.batch * a.block_size / median * 1e3),
        "loss": round(value, 4)}))


if __name__ == "__main__":
    main()
