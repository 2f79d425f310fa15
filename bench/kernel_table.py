#!/usr/bin/env python3
"""Prints the kernels of one training step of each framework, grouped by name, with
their total GPU time: the table of bench/profile_kernels.sh.

  kernel_table.py TITLE MINIGRAD_CSV TORCH_CSV

Each CSV is Nsight Compute's (--csv --metrics gpu__time_duration.sum) for a run of two
identical steps; the table keeps the second step: the longest run of kernel names at
the end that repeats the run just before it.
"""
import collections
import csv
import sys


def kernels(path):
    """(name, nanoseconds) of every kernel launch, in launch order."""
    with open(path) as f:
        rows = [line for line in f if line.startswith('"')]
    launches = []
    for row in csv.DictReader(rows):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        launches.append((row["Kernel Name"], value))
    return launches


def last_step(launches):
    """The kernels of the last of two identical steps: the longest suffix that also
    appears right before it."""
    names = [n for n, _ in launches]
    for length in range(len(names) // 2, 0, -1):
        if names[-length:] == names[-2 * length:-length]:
            return launches[-length:]
    return launches


def short(name):
    name = name.replace("(anonymous namespace)::", "").split("(")[0]
    return name if len(name) <= 70 else name[:67] + "..."


def table(launches):
    groups = collections.OrderedDict()
    for name, ns in launches:
        count, total = groups.get(short(name), (0, 0.0))
        groups[short(name)] = (count + 1, total + ns)
    return sorted(groups.items(), key=lambda kv: -kv[1][1])


def main():
    title, *paths = sys.argv[1:]
    for framework, path in zip(["minigrad", "PyTorch"], paths):
        step = last_step(kernels(path))
        total = sum(ns for _, ns in step)
        print(f"\n{framework}, {title}: {len(step)} kernels, {total / 1e6:.3f} ms of GPU time per step\n")
        print("| kernel | launches | total ms | share |")
        print("|---|---|---|---|")
        for name, (count, ns) in table(step):
            print(f"| `{name}` | {count} | {ns / 1e6:.4f} | {100 * ns / total:.1f} % |")


if __name__ == "__main__":
    main()
