#!/usr/bin/env python3
"""The planner against the trainer, every split at once: train_gpt's memory line per rank.

Runs build/bin/train_gpt (through minigrad-run) on a grid of splits x precisions x models at
the ctests' shape, and prints one markdown table: per rank, the allocator's peak over the
planner's bytes at the trainer's moments ("measured / that"), or, where the peak is a race
with Gloo's thread (trainer_moments.h), the range and where the peak fell in it; "not
priced" where the line says so. Then a summary: how many ranks within 5 %, outside, not
priced. Nothing here is asserted (the ctests do that, on fewer splits): it is the table
docs/planning.md and bench/RESULTS.md quote.

  python3 bench/planner_table.py [--build build] [--models gpt,llama] [--precisions ...] [--only SUBSTR]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

# (ranks, flags): the splits train_gpt runs, up to the 4-D mesh on 16 CPU ranks (ZeRO-2/3
# with pp and recompute with tp alone are refused by the trainer).
SPLITS = [
    (1, ""), (1, "--recompute"),
    (2, "--dp 2"), (2, "--dp 2 --zero 1"), (2, "--dp 2 --zero 2"), (2, "--dp 2 --zero 3 --weight-decay 0"),
    (2, "--dp 2 --recompute"), (2, "--dp 2 --zero 3 --weight-decay 0 --recompute"),
    (2, "--tp 2"), (2, "--tp 2 --sequence-parallel"), (2, "--cp 2"),
    (2, "--pp 2"), (2, "--pp 2 --micro-batches 4"), (2, "--pp 2 --recompute"),
    (2, "--pp 2 --schedule interleaved --model-chunks 2 --micro-batches 4"),
    (4, "--dp 2 --tp 2"), (4, "--dp 2 --cp 2"), (4, "--dp 2 --pp 2"), (4, "--dp 2 --pp 2 --zero 1"),
    (4, "--tp 2 --pp 2"), (4, "--tp 2 --pp 2 --sequence-parallel"), (4, "--tp 2 --pp 2 --recompute"),
    (4, "--cp 2 --pp 2"), (4, "--tp 2 --cp 2 --sequence-parallel"),
    (4, "--dp 2 --tp 2 --zero 3 --weight-decay 0"), (4, "--dp 2 --cp 2 --zero 3 --weight-decay 0"),
    (4, "--dp 2 --cp 2 --zero 3 --weight-decay 0 --recompute"),
    # the 3-D and 4-D meshes
    (8, "--dp 2 --tp 2 --cp 2"), (8, "--dp 2 --tp 2 --cp 2 --sequence-parallel"), (8, "--dp 2 --tp 2 --pp 2"),
    (8, "--dp 2 --tp 2 --pp 2 --zero 1"), (8, "--dp 2 --cp 2 --pp 2"), (8, "--tp 2 --cp 2 --pp 2"),
    (8, "--dp 2 --tp 2 --cp 2 --zero 3 --weight-decay 0"), (16, "--dp 2 --tp 2 --cp 2 --pp 2"),
]
# FSDP's MixedPrecisionPolicy: ZeRO-3's own way of the mixed precisions.
POLICY_SPLITS = [
    (2, "--dp 2 --zero 3 --weight-decay 0 --fsdp-mp-policy"),
    (2, "--dp 2 --zero 3 --weight-decay 0 --fsdp-mp-policy --recompute"),
    (4, "--dp 2 --tp 2 --zero 3 --weight-decay 0 --fsdp-mp-policy"),
    (4, "--dp 2 --cp 2 --zero 3 --weight-decay 0 --fsdp-mp-policy"),
    (4, "--dp 2 --cp 2 --zero 3 --weight-decay 0 --fsdp-mp-policy --recompute"),
    (8, "--dp 2 --tp 2 --cp 2 --zero 3 --weight-decay 0 --fsdp-mp-policy"),
]
PRECISIONS = ["32-true", "bf16-mixed", "16-mixed", "bf16-true"]

SINGLE = re.compile(r"peak ([\d.]+) MiB.*at the trainer's moments: ([\d.]+) MiB .*measured / that ([\d.]+)")
RANGE = re.compile(r"peak ([\d.]+) MiB.*at the trainer's moments: ([\d.]+) to ([\d.]+) MiB .*measured (within|below|above) that range")


def corpus(directory):
    path = os.path.join(directory, "fortunes")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "wisdom"), "w") as f:
        for i in range(60):
            f.write(f"A fortune a day keeps the doctor away, said number {i}.\n%\n")
    return path


def cell(line):
    """(text for the table, verdict): verdict 'in', 'out' or 'unpriced'."""
    if m := RANGE.search(line):
        peak, low, high, where = float(m[1]), float(m[2]), float(m[3]), m[4]
        return f"{peak:.2f} in {low:.2f}–{high:.2f}" if where == "within" else f"{peak:.2f} {where} {low:.2f}–{high:.2f}", \
            "in" if where == "within" else "out"
    if m := SINGLE.search(line):
        ratio = float(m[3])
        return f"{ratio:.3f}", "in" if abs(ratio - 1) <= 0.05 else "out"
    return "not priced", "unpriced"


def run(build, ranks, model, precision, flags, data):
    train = os.path.join(build, "bin", "train_gpt")
    command = [train] if ranks == 1 else [os.path.join(build, "bin", "minigrad-run"), "--nproc-per-node", str(ranks), train]
    command += ["--devices", "cpu", "--model", model, "--iters", "4", "--eval-iters", "2", "--eval-interval", "4",
                "--sample-chars", "0", "--data-dir", data, "--precision", precision] + flags.split()
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    lines = {}
    for line in out.stdout.splitlines():
        m = re.match(r"(?:\[rank (\d+)\] )?memory: (.*)", line)
        if m:
            lines[int(m[1] or 0)] = m[2]
    if out.returncode != 0 or len(lines) != ranks:
        return None, (out.stderr.strip().splitlines() or ["no memory line"])[-1]
    return [lines[r] for r in range(ranks)], None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--models", default="gpt,llama")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--only", default="", help="run only the splits whose flags contain this")
    args = parser.parse_args()
    counts = {"in": 0, "out": 0, "unpriced": 0}
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        data = corpus(tmp)
        print("| model | precision | split | each rank, in order |\n|---|---|---|---|")
        for model in args.models.split(","):
            for precision in args.precisions.split(","):
                splits = SPLITS + (POLICY_SPLITS if precision in ("bf16-mixed", "16-mixed") else [])
                for ranks, flags in splits:
                    if args.only not in flags:
                        continue
                    lines, error = run(args.build, ranks, model, precision, flags, data)
                    if lines is None:
                        print(f"| {model} | {precision} | `{flags or 'one device'}` | refused or failed: {error} |")
                        continue
                    cells = []
                    for line in lines:
                        text, verdict = cell(line)
                        counts[verdict] += 1
                        if verdict != "unpriced" and "in " not in text and "–" not in text:
                            ratios.append(float(text))
                        cells.append(text)
                    print(f"| {model} | {precision} | `{flags or 'one device'}` | " + " · ".join(cells) + " |")
                    sys.stdout.flush()
    print(f"\nranks within 5 % (or within their range): {counts['in']}; outside: {counts['out']}; "
          f"not priced: {counts['unpriced']}" +
          (f"; single figures {min(ratios):.3f} to {max(ratios):.3f}" if ratios else ""))


if __name__ == "__main__":
    main()
