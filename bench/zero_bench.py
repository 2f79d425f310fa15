#!/usr/bin/env python3
"""Sharded data parallelism on CPU Gloo ranks, side by side, in one run:

  python3 bench/zero_bench.py                       # build/, 2 ranks, AdamW, both models
  python3 bench/zero_bench.py --build build-cpu --optimizer sgd --steps 10

For each model (mnist_mlp 784-512-512-10 and a wider 784-2048-2048-10, --batch rows per
rank) it runs, under minigrad-run with --ranks processes:
  ddp-bench --zero 1, 2 and 3   each stage's step time beside DDP's (timed alternately in
                                one job), and what each rank holds and sends (ddp-bench's
                                header says how each figure is counted)
  bench/torch_zero.py           PyTorch's DDP and DDP + ZeroRedundancyOptimizer on Gloo
and prints Markdown tables: the step times with the ratios their targets name
(ZeRO-1/2 <= 1.15x DDP, ZeRO-3 <= 1.5x DDP, minigrad ZeRO-1 <= 1.0x PyTorch's
ZeroRedundancyOptimizer), and the per-rank memory against the arithmetic of
docs/sharded-data-parallel.md. It builds nothing: build first (make build). One thread
per rank for both frameworks (--threads). PYTHON selects the interpreter with torch.
"""
import argparse
import json
import os
import subprocess
import sys

MODELS = {
    "mnist_mlp": "784,512,512,10",
    "wide_mlp": "784,2048,2048,10",
}


def run_json(cmd, env):
    """Runs cmd; returns the JSON object of its first line that holds one."""
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("[rank 0] "):
            line = line[len("[rank 0] "):]
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"zero_bench.py: no result from {' '.join(cmd)} (exit {proc.returncode}):\n"
                     f"{proc.stdout[-2000:]}")


def mib(b):
    return f"{b / 2**20:.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build", help="the build folder holding bin/")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--models", default="mnist_mlp wide_mlp")
    parser.add_argument("--batch", type=int, default=128, help="rows per rank per step")
    parser.add_argument("--optimizer", choices=["sgd", "sgd-momentum", "adamw"], default="adamw")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bin_dir = os.path.join(root, args.build) if not os.path.isabs(args.build) else args.build
    bin_dir = os.path.join(bin_dir, "bin")
    for tool in ("minigrad-run", "ddp-bench"):
        if not os.path.exists(os.path.join(bin_dir, tool)):
            raise SystemExit(f"zero_bench.py: {bin_dir}/{tool} is missing; build first "
                             "(make build, or --build DIR)")
    python = os.environ.get("PYTHON", "/usr/bin/python3")
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(args.threads)
    common = ["--batch", str(args.batch), "--steps", str(args.steps), "--warmup",
              str(args.warmup), "--optimizer", args.optimizer]

    times, memory = [], []
    for name in args.models.split():
        widths = MODELS[name]
        stages = {}
        for zero in (1, 2, 3):
            print(f"zero_bench.py: {name}, ZeRO-{zero} ...", file=sys.stderr, flush=True)
            stages[zero] = run_json([os.path.join(bin_dir, "minigrad-run"), "--nproc-per-node",
                                     str(args.ranks), os.path.join(bin_dir, "ddp-bench"),
                                     "--widths", widths, "--zero", str(zero), "--json"] + common,
                                    env)
        print(f"zero_bench.py: {name}, PyTorch ...", file=sys.stderr, flush=True)
        torch = run_json([python, os.path.join(root, "bench", "torch_zero.py"), "--ranks",
                          str(args.ranks), "--widths", widths, "--threads",
                          str(args.threads)] + common, env)
        times.append((name, widths, stages, torch))
        memory.append((name, stages, torch))

    for clock, suffix, what in (("wall", "_ms", "wall-clock"),
                                ("CPU", "_cpu_ms", "CPU time of the rank's process, all threads")):
        print(f"\nStep times, median {what} ms ({args.ranks} Gloo ranks, {args.optimizer}, "
              f"batch {args.batch} per rank, {args.threads} thread(s) per rank). Each ZeRO stage "
              "is timed in the same job as a DDP run; the ratio is to that run."
              + (" On a machine shared with other work the wall clock also counts the waits for a "
                 "core; the CPU time does not." if clock == "CPU" else "") + "\n")
        print(f"| model ({clock}) | minigrad DDP | ZeRO-1 (x DDP, target 1.15) | ZeRO-2 (x DDP, "
              "target 1.15) | ZeRO-3 (x DDP, target 1.5) | PyTorch DDP | PyTorch ZeRO-1 | "
              "minigrad / PyTorch ZeRO-1 (target 1.0) |")
        print("|---|---|---|---|---|---|---|---|")
        for name, widths, stages, torch in times:
            cells = []
            for zero in (1, 2, 3):
                s = stages[zero]
                z, d = s["zero" + suffix], s["ddp" + suffix]
                cells.append(f"{z:.2f} ({z / d:.2f}x)")
            ddp = stages[1]["ddp" + suffix]
            print(f"| {name} {widths} | {ddp:.2f} | {' | '.join(cells)} | "
                  f"{torch['ddp' + suffix]:.2f} | {torch['zero' + suffix]:.2f} | "
                  f"{stages[1]['zero' + suffix] / torch['zero' + suffix]:.2f}x |")

    print("\nPer-rank memory at a step's peak and bytes sent per step, MiB (ddp-bench's header "
          "says how each is counted; arithmetic: docs/sharded-data-parallel.md). PyTorch: the "
          "parameters and the optimizer state it holds.\n")
    print("| model | who | rank | parameters | gradients | optimizer state | allocator peak | "
          "arithmetic | sent (ring) | written (measured) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, stages, torch in memory:
        for zero in (1, 2, 3):
            for f in stages[zero]["footprint"]:
                print(f"| {name} | minigrad ZeRO-{zero} | {f['rank']} | {mib(f['parameters'])} | "
                      f"{mib(f['gradients'])} | {mib(f['optimizer'])} | {mib(f['allocator'])} | "
                      f"{mib(f['arithmetic'])} | {mib(f['sent_ring'])} | "
                      f"{mib(f['sent_measured']) if f['sent_measured'] >= 0 else '-'} |")
        for f in torch["footprint"]:
            for who, key in (("PyTorch DDP", "ddp_optimizer"), ("PyTorch ZeRO-1", "zero_optimizer")):
                print(f"| {name} | {who} | {f['rank']} | {mib(f['parameters'])} | - | "
                      f"{mib(f[key])} | - | - | - | - |")


if __name__ == "__main__":
    main()
