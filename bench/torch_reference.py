#!/usr/bin/env python3
"""The PyTorch side of bench/compare.sh: the works and modes of minigrad-bench, defined
the same way, printing the same JSON lines (one per result, "framework": "torch").

  python3 bench/torch_reference.py --work mnist_mlp --device cpu --mode eager --threads 1
  python3 bench/torch_reference.py --work mnist_mlp --device cuda --mode graph

One training step is: zero_grad(set_to_none=True), forward, cross-entropy, backward,
SGD step (lr 0.01, no momentum). Steps are timed one by one after --warmup untimed
ones: a host clock on the CPU, CUDA events with no host synchronisation in between on a
GPU. The median is reported. TFLOP/s counts 6*B*in*out per Linear layer (the three
GEMMs), as minigrad-bench does.
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time

WORKS = {
    "tutorial": ([5, 2], 30),
    "mnist_mlp": ([784, 512, 512, 10], 256),
    "wide_mlp": ([4096, 8192, 8192, 10], 8192),
    "pipe_mlp": ([256] * 9, 4096),  # eight equal layers, 256 classes (bench/pipeline.sh)
}


def make_model(torch, widths):
    layers = []
    for i in range(len(widths) - 1):
        if i > 0:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
    return torch.nn.Sequential(*layers)


def flops_per_step(widths, batch):
    return sum(6.0 * batch * widths[i] * widths[i + 1] for i in range(len(widths) - 1))


def proc_status_bytes(field):
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(int(p * (len(ordered) - 1) + 0.5), len(ordered) - 1)]


def time_on_host(step, steps, cpu_ms):
    """Wall-clock ms per step; the process CPU time per step goes to cpu_ms."""
    ms = []
    for _ in range(steps):
        cpu_start = time.process_time()
        start = time.perf_counter()
        step()
        end = time.perf_counter()
        cpu_ms.append((time.process_time() - cpu_start) * 1e3)
        ms.append((end - start) * 1e3)
    return ms


def time_on_stream(torch, step, steps, host_ms):
    """GPU ms per step from events; the host's time inside each step() goes to host_ms."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for i in range(steps):
        start = time.perf_counter()
        step()
        host_ms.append((time.perf_counter() - start) * 1e3)
        events[i + 1].record()
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(steps)]


def run(args):
    import torch

    widths, default_batch = WORKS[args.work]
    batch = args.batch or default_batch
    record = {
        "framework": "torch",
        "torch_version": torch.__version__,
        "work": args.work,
        "device": args.device,
        "mode": args.mode,
        "batch": batch,
        "tf32": args.tf32,
        "steps": args.steps,
        "warmup": args.warmup,
    }
    if args.device == "cpu":
        if args.threads:
            torch.set_num_threads(args.threads)
        record["threads"] = torch.get_num_threads()
    device_ids = [int(i) for i in args.device_ids.split(",")] if args.device_ids else [0]
    if args.mode == "dataparallel":
        record["device_ids"] = device_ids
    record["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    record["host"] = socket.gethostname()

    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        record["error"] = "no CUDA device (torch.cuda.is_available() is False)"
        return record
    if args.mode == "graph" and not on_gpu:
        record["error"] = "graph mode captures a CUDA graph; it needs --device cuda"
        return record
    if args.mode == "dataparallel" and not on_gpu:
        # torch.nn.DataParallel runs only over CUDA devices.
        record["error"] = "torch.nn.DataParallel needs CUDA devices"
        return record

    device = torch.device(f"cuda:{device_ids[0]}" if on_gpu else "cpu")
    if on_gpu:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rss_before = proc_status_bytes("VmRSS")
    rss_window = not on_gpu and reset_peak_rss()

    torch.manual_seed(args.seed)
    model = make_model(torch, widths).to(device)
    x = torch.randn(batch, widths[0], device=device)  # standard normal: never all zero
    y = torch.randint(0, widths[-1], (batch,), device=device)
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr)
    forward = model
    if args.mode == "dataparallel":
        forward = torch.nn.DataParallel(model, device_ids=device_ids)
    loss_fn = torch.nn.CrossEntropyLoss()

    state = {}

    def step():
        sgd.zero_grad(set_to_none=True)
        loss = loss_fn(forward(x), y)
        loss.backward()
        sgd.step()
        state["loss"] = loss

    cpu_ms, host_ms = [], []
    if on_gpu:
        def timer(s, n):
            return time_on_stream(torch, s, n, host_ms)
    else:
        def timer(s, n):
            return time_on_host(s, n, cpu_ms)

    if args.mode == "graph":
        # As in the CUDA-graphs section of PyTorch's docs: warm up on a side stream, then
        # capture the whole step with static inputs; backward allocates the gradients
        # from the graph's private pool.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(args.warmup, 3)):
                step()
        torch.cuda.current_stream().wait_stream(side)
        first_loss = state["loss"].item()
        graph = torch.cuda.CUDAGraph()
        sgd.zero_grad(set_to_none=True)
        try:
            with torch.cuda.graph(graph):
                static_loss = loss_fn(forward(x), y)
                static_loss.backward()
                sgd.step()
        except Exception as e:  # report, never fake a number
            record["error"] = f"CUDA graph capture failed: {e}"
            return record
        for _ in range(args.warmup):
            graph.replay()
        ms = timer(graph.replay, args.steps)
        record["final_loss"] = static_loss.item()
    else:
        for _ in range(args.warmup):
            step()
        first_loss = state["loss"].item() if "loss" in state else 0.0
        ms = timer(step, args.steps)
        record["final_loss"] = state["loss"].item()

    median_ms = statistics.median(ms)
    record["median_ms"] = median_ms
    record["p10_ms"] = percentile(ms, 0.10)
    record["p90_ms"] = percentile(ms, 0.90)
    if cpu_ms:
        record["median_cpu_ms"] = statistics.median(cpu_ms)
    if host_ms:
        record["median_host_ms"] = statistics.median(host_ms)
    record["tflops"] = flops_per_step(widths, batch) / (median_ms * 1e-3) / 1e12
    record["first_loss"] = first_loss
    if on_gpu:
        record["peak_mem_bytes"] = torch.cuda.max_memory_allocated(device)
        record["peak_mem_kind"] = "max_memory_allocated"
    else:
        record["peak_mem_bytes"] = proc_status_bytes("VmHWM") - rss_before if rss_window else -1
        record["peak_mem_kind"] = "peak_rss_delta"
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", choices=sorted(WORKS), default="mnist_mlp")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--mode", choices=["eager", "dataparallel", "graph"], default="eager")
    parser.add_argument("--tf32", action="store_true")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--device-ids", default="")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (CPU)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        record = run(args)
    except Exception as e:  # still one JSON line, naming what failed
        record = {"framework": "torch", "work": args.work, "device": args.device,
                  "mode": args.mode, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(record))
        return 1
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
