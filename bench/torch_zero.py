#!/usr/bin/env python3
"""PyTorch's side of bench/zero_bench.py: DistributedDataParallel, and DDP with
torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1), on Gloo with CPU ranks.

  /usr/bin/python3 bench/torch_zero.py --ranks 2 --widths 784,512,512,10 --batch 256 \
      --optimizer adamw --threads 1

Each rank trains the same MLP as ddp-bench (Linear layers with ReLU between them, one
per-rank batch, cross-entropy) both ways, one step after the other after --warmup untimed
rounds, with a barrier before each step, and rank 0 prints one JSON line: the median step
times (wall, and the process's CPU time over all its threads), and per rank the bytes of
the parameters and of the optimizer state it holds.
One step is: zero_grad(set_to_none=True), forward, cross-entropy, backward, step.
"""
import argparse
import json
import os
import socket
import statistics
import time

from torch_reference import make_model  # the same MLP as minigrad-bench's works


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_optimizer(torch, args):
    """ddp-bench's optimizers, with its learning rates."""
    if args.optimizer == "adamw":
        return torch.optim.AdamW, {"lr": 1e-3}
    return torch.optim.SGD, {"lr": 0.01, "momentum": 0.9 if args.optimizer == "sgd-momentum" else 0}


def state_bytes(optimizer):
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if hasattr(value, "numel"):
                total += value.numel() * value.element_size()
    return total


def worker(rank, args, port, out):
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    torch.manual_seed(100 + rank)
    x = torch.randn(args.batch, widths[0])
    y = torch.randint(0, widths[-1], (args.batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    cls, kwargs = make_optimizer(torch, args)

    torch.manual_seed(0)
    ddp = DDP(make_model(torch, widths))
    ddp_opt = cls(ddp.parameters(), **kwargs)
    torch.manual_seed(0)
    zero = DDP(make_model(torch, widths))
    zero_opt = ZeroRedundancyOptimizer(zero.parameters(), optimizer_class=cls, **kwargs)

    def step(model, opt):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    ddp_ms, zero_ms, ddp_cpu, zero_cpu = [], [], [], []
    for s in range(args.warmup + args.steps):
        for model, opt, times, cpu in ((ddp, ddp_opt, ddp_ms, ddp_cpu),
                                       (zero, zero_opt, zero_ms, zero_cpu)):
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()  # CPU time: every thread
            step(model, opt)
            if s >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
                cpu.append((time.process_time() - c0) * 1e3)

    params = sum(p.numel() * p.element_size() for p in ddp.parameters())
    mine = {"rank": rank, "parameters": params, "ddp_optimizer": state_bytes(ddp_opt),
            "zero_optimizer": state_bytes(zero_opt.optim)}
    everyone = [None] * args.ranks
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        out.put({"bench": "torch_zero", "torch": torch.__version__, "ranks": args.ranks,
                 "widths": args.widths, "batch": args.batch, "optimizer": args.optimizer,
                 "threads": args.threads, "ddp_ms": statistics.median(ddp_ms),
                 "zero_ms": statistics.median(zero_ms), "ddp_cpu_ms": statistics.median(ddp_cpu),
                 "zero_cpu_ms": statistics.median(zero_cpu), "footprint": everyone})
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--widths", default="784,512,512,10")
    parser.add_argument("--batch", type=int, default=256, help="rows per rank per step")
    parser.add_argument("--optimizer", choices=["sgd", "sgd-momentum", "adamw"], default="adamw")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    args = parser.parse_args()

    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, args, port, out)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    result = out.get()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"torch_zero.py: a rank exited with {p.exitcode}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
