#!/usr/bin/env python3
"""Reads the JSON lines of minigrad-bench and bench/torch_reference.py and prints the
comparison table (Markdown) of median step times, minigrad/PyTorch ratios and the
targets set for them (listed at the end of bench/RESULTS.md).

  python3 bench/report.py table results.jsonl

Standard library only.
"""
import json
import sys

# Ratio targets (minigrad / PyTorch median step time; lower is better), by device,
# work, mode. wide_mlp on CUDA must also keep its peak memory at or below PyTorch's.
TARGETS = {
    ("cpu", "tutorial", "eager"): 0.5,
    ("cpu", "mnist_mlp", "eager"): 1.0,
    ("cuda", "tutorial", "eager"): 0.25,
    ("cuda", "mnist_mlp", "eager"): 0.35,
    ("cuda", "mnist_mlp", "graph"): 1.0,
    ("cuda", "wide_mlp", "eager"): 1.0,
}
# DataParallel over one device against minigrad's own eager step.
DP_OVER_EAGER_TARGET = 1.1


def load(path):
    records = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                records.append(json.loads(line))
    return records


def key(r):
    ids = ",".join(str(i) for i in r.get("device_ids", [])) if r.get("mode") == "dataparallel" else ""
    return (r.get("device"), r.get("work"), r.get("mode"), bool(r.get("tf32")), ids, r.get("batch"))


def fmt_ms(r):
    if r is None:
        return "—"
    if "error" in r:
        return "error"
    return f"{r['median_ms']:.4g}"


def fmt_host(rec):
    """The host's time inside one GPU step (queueing its work); '—' on the CPU."""
    if rec is None or "median_host_ms" not in rec:
        return "—"
    return f"{rec['median_host_ms']:.4g}"


def fmt_mem(r):
    if r is None or "error" in r or r.get("peak_mem_bytes", -1) < 0:
        return "—"
    mib = r["peak_mem_bytes"] / 2**20
    # Three significant digits below 1 MiB: a tiny work's few KiB must not read as 0.
    return f"{mib:.1f}" if mib >= 1 else f"{mib:.3g}"


def ratio(a, b, field="median_ms"):
    if a is None or b is None or "error" in a or "error" in b:
        return None
    if field not in a or field not in b or b[field] <= 0:
        return None
    return a[field] / b[field]


def verdict(value, target, memory_ok=True):
    if target is None or value is None:
        return ""
    met = value <= target and memory_ok
    return "met" if met else "NOT met"


def table(records):
    pairs = {}
    for r in records:
        pairs.setdefault(key(r), {})[r.get("framework")] = r
    order = {"tutorial": 0, "mnist_mlp": 1, "wide_mlp": 2}
    mode_order = {"eager": 0, "graph": 1, "dataparallel": 2}
    keys = sorted(pairs, key=lambda k: (k[0] or "", order.get(k[1], 9), mode_order.get(k[2], 9),
                                         k[3], k[4], k[5] or 0))
    lines = [
        "| device | work | mode | batch | minigrad ms | PyTorch ms | ratio | target | "
        "CPU-time ratio | peak MiB minigrad / PyTorch | host ms per step minigrad / PyTorch |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for k in keys:
        device, work, mode, tf32, ids, batch = k
        mg, th = pairs[k].get("minigrad"), pairs[k].get("torch")
        label = mode + (" tf32" if tf32 else "") + (f" [{ids}]" if ids else "")
        r = ratio(mg, th)
        target = TARGETS.get((device, work, mode))
        memory_ok = True
        if device == "cuda" and work == "wide_mlp" and mode == "eager" and r is not None:
            memory_ok = mg["peak_mem_bytes"] <= th["peak_mem_bytes"]
        target_text = "" if target is None else f"≤ {target}" + (" and mem ≤" if device == "cuda" and work == "wide_mlp" else "")
        cpu_r = ratio(mg, th, "median_cpu_ms")
        lines.append(
            f"| {device} | {work} | {label} | {batch} | {fmt_ms(mg)} | {fmt_ms(th)} | "
            f"{'—' if r is None else f'{r:.3f}'} | "
            f"{target_text} {verdict(r, target, memory_ok)} | "
            f"{'—' if cpu_r is None else f'{cpu_r:.3f}'} | {fmt_mem(mg)} / {fmt_mem(th)} | "
            f"{fmt_host(mg)} / {fmt_host(th)} |")
        for name, rec in (("minigrad", mg), ("PyTorch", th)):
            if rec is not None and "error" in rec:
                notes.append(f"- {device} {work} {label}, {name}: {rec['error']}")
    # DataParallel over a single device against minigrad's own eager step.
    dp_lines = []
    for k in keys:
        device, work, mode, tf32, ids, batch = k
        if mode != "dataparallel" or ids != "0" or tf32:
            continue
        dp = pairs[k].get("minigrad")
        eager = pairs.get((device, work, "eager", False, "", batch), {}).get("minigrad")
        r = ratio(dp, eager)
        torch_dp, torch_eager = pairs[k].get("torch"), pairs.get((device, work, "eager", False, "", batch), {}).get("torch")
        tr = ratio(torch_dp, torch_eager)
        # The target is set for the GPU; on the CPU the ratio is shown for reference.
        dp_target = f"≤ {DP_OVER_EAGER_TARGET} {verdict(r, DP_OVER_EAGER_TARGET)}" if device == "cuda" else "(GPU only)"
        dp_lines.append(
            f"| {device} | {work} | {fmt_ms(dp)} | {fmt_ms(eager)} | "
            f"{'—' if r is None else f'{r:.3f}'} | {dp_target} | "
            f"{'—' if tr is None else f'{tr:.3f}'} |")
    out = "\n".join(lines)
    if dp_lines:
        out += ("\n\nDataParallel over [0] against the same framework's eager step:\n\n"
                "| device | work | minigrad DP[0] ms | minigrad eager ms | ratio | target | PyTorch DP[0]/eager |\n"
                "|---|---|---|---|---|---|---|\n" + "\n".join(dp_lines))
    if notes:
        out += "\n\nRows without a number:\n" + "\n".join(notes)
    hosts = sorted({(r.get("host"), r.get("date", "")[:10]) for r in records if r.get("host")})
    if hosts:
        out += "\n\nMeasured on " + ", ".join(f"{h} ({d})" for h, d in hosts) + "."
    return out


def main(argv):
    if len(argv) != 3 or argv[1] != "table":
        print(__doc__, file=sys.stderr)
        return 2
    print(table(load(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
