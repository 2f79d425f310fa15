#!/usr/bin/env python3
"""The PyTorch twin of build/bin/train_fashion_mnist, for comparing time per epoch and
accuracy on the same machine (Debian: apt-get install python3-torch).

It reads the same IDX files (gzip + numpy, no torchvision), builds the same MLP
(784 -> hidden... -> 10 with ReLU, PyTorch's default Linear initialisation), and trains
with the same loop: shuffled batches, cross-entropy, SGD with momentum under the same
per-step cosine learning-rate schedule, then the test loss and accuracy after each
epoch. Inputs are scaled to [0, 1] and normalised with mean 0.2860 / std 0.3530, as
the minigrad binary does. The defaults are the binary's defaults.

  /usr/bin/python3 bench/torch_fashion_mnist.py --epochs 10 --threads 2
"""
import argparse
import gzip
import math
import os
import time

import numpy as np
import torch
from torch import nn

MEAN, STD = 0.2860, 0.3530


def read_idx(path, ndims):
    """An unsigned-byte IDX array, from <path> or <path>.gz."""
    for candidate in (path, path + ".gz"):
        if os.path.exists(candidate):
            opener = gzip.open if candidate.endswith(".gz") else open
            with opener(candidate, "rb") as f:
                raw = f.read()
            break
    else:
        raise SystemExit(f"cannot find {path} or {path}.gz")
    magic = int.from_bytes(raw[0:4], "big")
    if magic != 0x0800 | ndims:
        raise SystemExit(f"{candidate}: bad magic number 0x{magic:08X}")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndims).reshape(dims)


def load(root, prefix):
    images = read_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte"), 3)
    labels = read_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte"), 1)
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    return (x - MEAN) / STD, torch.from_numpy(labels.astype(np.int64))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--lr-schedule", choices=["cosine", "constant"], default="cosine")
    p.add_argument("--hidden", type=str, default="256,256",
                   help="comma-separated hidden layer widths")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_x, train_y = load(args.data_dir, "train")
    test_x, test_y = load(args.data_dir, "t10k")

    widths = [784] + [int(h) for h in args.hidden.split(",") if h] + [10]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, model {widths}, "
          f"batch {args.batch_size}, lr {args.lr} ({args.lr_schedule}), momentum {args.momentum}")

    n = len(train_x)
    steps_per_epoch = (n + args.batch_size - 1) // args.batch_size
    total_steps = steps_per_epoch * args.epochs

    def learning_rate(step):
        if args.lr_schedule == "constant":
            return args.lr
        return args.lr * 0.5 * (1.0 + math.cos(math.pi * step / total_steps))

    step = 0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        perm = torch.randperm(n)
        total, seen = 0.0, 0
        for i in range(0, n, args.batch_size):
            idx = perm[i:i + args.batch_size]
            x, y = train_x[idx], train_y[idx]
            for group in opt.param_groups:
                group["lr"] = learning_rate(step)
            step += 1
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            seen += len(idx)
        train_seconds = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            logits = model(test_x)
            test_loss = loss_fn(logits, test_y).item()
            accuracy = (logits.argmax(1) == test_y).float().mean().item()
        seconds = time.perf_counter() - start
        print(f"epoch {epoch}/{args.epochs}  train_loss {total / seen:.4f}  "
              f"test_loss {test_loss:.4f}  test_accuracy {100 * accuracy:.2f}%  "
              f"{seconds:.2f} s ({train_seconds:.2f} s training, {n / train_seconds:.0f} samples/s)",
              flush=True)


if __name__ == "__main__":
    main()
