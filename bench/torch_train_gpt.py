#!/usr/bin/python3
"""train_gpt's default run in PyTorch eager: the reference of its validation loss and time.

The same model (nanoGPT's, tests/models/reference/gpt_reference.py), data (the token file
train_gpt writes with --tokens), split (90/10 by position), schedule (warmup 100, cosine
to 1e-4 at the last step), optimizer (AdamW, betas (0.9, 0.99), decay 0.1 on 2-D weights),
gradient clipping at 1 and evaluation (the mean loss of 20 batches per split). The
windows are drawn with torch.randint, not minigrad's Philox stream: the same distribution,
other draws, so the final losses agree to the noise of the evaluation, not to the bit.

  build/bin/train_gpt --tokens fortunes.tokens ...    # writes the token file once
  /usr/bin/python3 bench/torch_train_gpt.py fortunes.tokens --threads 1
"""
import argparse
import math
import os
import struct
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "models", "reference"))
from gpt_reference import GPT  # noqa: E402


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"MGTOKENS", f"{path}: not a token file"
    _, vocab_size, count = struct.unpack("<IIQ", data[8:24])
    tokens = torch.frombuffer(bytearray(data[24 + vocab_size:24 + vocab_size + count]),
                              dtype=torch.uint8)
    return tokens.long(), vocab_size


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tokens")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--iters", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    data, vocab = read_tokens(a.tokens)
    cut = int(len(data) * 0.9)
    splits = {"train": data[:cut], "val": data[cut:]}
    config = dict(block_size=a.block_size, vocab_size=vocab, n_layer=a.n_layer,
                  n_head=a.n_head, n_embd=a.n_embd, dropout=0.0, bias=True)
    model = GPT(config)
    opt = model.configure_optimizers(0.1, a.lr, (0.9, 0.99), 1e-8)

    def batch(split, gen=None):
        d = splits[split]
        ix = torch.randint(len(d) - a.block_size, (a.batch_size,), generator=gen)
        x = torch.stack([d[i:i + a.block_size] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + a.block_size] for i in ix])
        return x, y

    def lr_at(it):
        if it < a.warmup:
            return a.lr * (it + 1) / (a.warmup + 1)
        if it >= a.iters:
            return a.min_lr
        r = (it - a.warmup) / (a.iters - a.warmup)
        return a.min_lr + 0.5 * (1 + math.cos(math.pi * r)) * (a.lr - a.min_lr)

    @torch.no_grad()
    def estimate():
        model.eval()
        out = {}
        for split in ("train", "val"):
            gen = torch.Generator().manual_seed(a.seed + 1)
            out[split] = sum(model(*batch(split, gen))[1].item()
                             for _ in range(a.eval_iters)) / a.eval_iters
        model.train()
        return out

    start = time.perf_counter()
    for it in range(a.iters):
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        x, y = batch("train")
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    seconds = time.perf_counter() - start
    losses = estimate()
    print(f"torch {torch.__version__}, {a.threads} thread(s): {a.iters} steps in {seconds:.1f} s "
          f"({a.iters * a.batch_size * a.block_size / seconds:.0f} tokens/s); "
          f"train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")


if __name__ == "__main__":
    main()
