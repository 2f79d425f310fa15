#!/usr/bin/env python3
"""How much of DDP's all-reduce a trace shows hidden behind backward.

    build/bin/minigrad-run --nproc-per-node 2 build/bin/ddp-bench --bucket-cap-mb 1 \\
        --trace ddp.json --trace-steps 5
    python3 bench/ddp_overlap.py ddp.json

For every rank and traced step (the spans "step N"): comm, the time the communication
thread spent in the all-reduces of DDP's buckets (the "allreduce" spans whose "for" names
a bucket); wait, how long backward blocked at its end for them ("wait for all-reduce");
hidden = 1 - wait / comm, the share of the communication that ran while backward still
computed: the figure ddp-bench prints from the reducer's own clocks, here from the trace.
Also: overlap, the share of comm that lay before the wait began (the same thing measured
on the timeline, without assuming the wait was all communication). Prints a Markdown
table, one row per rank and step, and the medians.
"""
import json
import statistics
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    process = {e["pid"]: e["args"]["name"] for e in events
               if e.get("ph") == "M" and e["name"] == "process_name"}
    rows = []
    for pid in sorted({s["pid"] for s in spans}):
        mine = [s for s in spans if s["pid"] == pid]
        steps = sorted((s for s in mine if s["name"].startswith("step ")), key=lambda s: s["ts"])
        for step in steps:
            lo, hi = step["ts"], step["ts"] + step["dur"]
            inside = [s for s in mine if lo <= s["ts"] < hi]
            comm = [s for s in inside if s["name"] == "allreduce"
                    and str(s.get("args", {}).get("for", "")).startswith("DDP bucket")]
            waits = [s for s in inside if s["name"] == "wait for all-reduce"]
            if not comm or not waits:
                continue
            comm_us = sum(s["dur"] for s in comm)
            wait = waits[0]
            wait_us = wait["dur"]
            before = sum(max(0.0, min(s["ts"] + s["dur"], wait["ts"]) - s["ts"]) for s in comm)
            rows.append((process.get(pid, pid), step["name"], len(comm), comm_us / 1000,
                         wait_us / 1000, 1 - min(1.0, wait_us / comm_us), before / comm_us))
    if not rows:
        sys.exit(f"{sys.argv[1]}: no traced step with DDP all-reduces (was it a DDP run "
                 "with --trace, of more than one rank?)")
    print("| process | step | all-reduces | comm ms | wait ms | hidden | overlap |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for p, step, n, comm, wait, hidden, overlap in rows:
        print(f"| {p} | {step} | {n} | {comm:.2f} | {wait:.2f} | {100 * hidden:.0f} % | "
              f"{100 * overlap:.0f} % |")
    print(f"\nmedian over {len(rows)} rank-steps: hidden "
          f"{100 * statistics.median(r[5] for r in rows):.0f} %, overlap "
          f"{100 * statistics.median(r[6] for r in rows):.0f} %")


if __name__ == "__main__":
    main()
