#!/usr/bin/env python3
"""Draws a Chrome trace (what --trace writes; core/profiler.h) as an SVG timeline.

    python3 bench/timeline.py t.json -o t.svg                   # the whole trace
    python3 bench/timeline.py t.json -o t.svg --step 3          # only step 3
    python3 bench/timeline.py t.rank0.json t.rank1.json -o t.svg  # several ranks at once
    python3 bench/timeline.py --merge t.json t.rank0.json t.rank1.json  # merge, no SVG

One row per track (a thread of a process, or a stream of a device), named as the trace
names it; nested spans stacked below the span they run in; spans coloured by kind (the
trace's "cat": forward, backward, comm, ...); a time axis in milliseconds. Several files
are put on one clock first, as merge_chrome_traces does (otherData.minigrad.origin_ns).
Only the standard library: it runs wherever Python 3 does.
"""
import argparse
import html
import json
import math
import sys

COLOURS = {  # category -> fill
    "step": "#d9d9d9",
    "forward": "#4e79a7",
    "backward": "#f28e2b",
    "data_parallel": "#59a14f",
    "comm": "#b07aa1",
    "ddp": "#e15759",
    "optimizer": "#76b7b2",
    "autograd": "#ffbe7d",
}
OTHER = "#bab0ac"
KINDS = {  # what the legend says of each category
    "step": "step",
    "forward": "forward",
    "backward": "backward",
    "data_parallel": "scatter / replicate / gather / reduce_add",
    "comm": "collective",
    "ddp": "DDP bucket",
    "optimizer": "optimizer step",
    "autograd": "autograd node",
}


def fail(message):
    sys.exit(f"timeline.py: {message}")


def load(path):
    try:
        with open(path) as f:
            trace = json.load(f)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        fail(f"{path} is not JSON: {e}")
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        fail(f"{path} is not a Chrome trace (a JSON object with a traceEvents array)")
    return trace


def merge(paths):
    """The traces of `paths` on one clock: each file's ts moved by its origin's offset."""
    traces = [load(p) for p in paths]
    if len(traces) == 1:
        return traces[0]
    origins = []
    for path, t in zip(paths, traces):
        origin = t.get("otherData", {}).get("minigrad", {}).get("origin_ns")
        if not isinstance(origin, int):
            fail(f"{path} was not written by minigrad (no otherData.minigrad.origin_ns)")
        origins.append(origin)
    base = min(origins)
    events, owner = [], {}
    for path, t, origin in zip(paths, traces, origins):
        shift = (origin - base) / 1000.0
        for e in t["traceEvents"]:
            pid = e.get("pid")
            if owner.setdefault(pid, path) != path:
                fail(f"{owner[pid]} and {path} both have process {pid}: the same rank twice?")
            if "ts" in e:
                e["ts"] = round(e["ts"] + shift, 3)
            events.append(e)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"minigrad": {"clock": "CLOCK_MONOTONIC", "origin_ns": base,
                                       "merged_from": list(paths)}}}


def tracks_of(trace):
    """{(pid, tid): [span dicts]}, with process and thread names and sort keys."""
    process, thread, psort, tsort = {}, {}, {}, {}
    spans = {}
    for e in trace["traceEvents"]:
        ph, pid, tid = e.get("ph"), e.get("pid"), e.get("tid", 0)
        args = e.get("args", {})
        if ph == "M":
            if e["name"] == "process_name":
                process[pid] = args.get("name", str(pid))
            elif e["name"] == "thread_name":
                thread[(pid, tid)] = args.get("name", str(tid))
            elif e["name"] == "process_sort_index":
                psort[pid] = args.get("sort_index", pid)
            elif e["name"] == "thread_sort_index":
                tsort[(pid, tid)] = args.get("sort_index", tid)
        elif ph == "X":
            spans.setdefault((pid, tid), []).append(e)
    return spans, process, thread, psort, tsort


def window_of(trace, spans, step, start_ms, end_ms):
    if step is not None:
        name = f"step {step}"
        found = [s for track in spans.values() for s in track if s["name"] == name]
        if not found:
            names = sorted({s["name"] for t in spans.values() for s in t if s["name"].startswith("step ")})
            fail(f"the trace has no span '{name}' (it has: {', '.join(names) or 'no steps'})")
        lo = min(s["ts"] for s in found)
        hi = max(s["ts"] + s["dur"] for s in found)
    else:
        all_spans = [s for t in spans.values() for s in t]
        if not all_spans:
            fail("the trace has no spans (X events) to draw")
        lo = min(s["ts"] for s in all_spans)
        hi = max(s["ts"] + s["dur"] for s in all_spans)
    if start_ms is not None:
        lo = start_ms * 1000.0
    if end_ms is not None:
        hi = end_ms * 1000.0
    if hi <= lo:
        fail(f"an empty time window ({lo / 1000:.3f} ms to {hi / 1000:.3f} ms)")
    return lo, hi


def lanes(track):
    """Each span's depth: nested spans one lane below the span they lie in."""
    order = sorted(track, key=lambda s: (s["ts"], -s["dur"]))
    stack, placed = [], []
    for s in order:
        end = s["ts"] + s["dur"]
        while stack and stack[-1] <= s["ts"] + 1e-3:
            stack.pop()
        placed.append((len(stack), s))
        stack.append(end)
    return placed


def nice_step(span_us, ticks=8):
    raw = span_us / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def draw(trace, out, title, step, start_ms, end_ms, width):
    spans, process, thread, psort, tsort = tracks_of(trace)
    lo, hi = window_of(trace, spans, step, start_ms, end_ms)
    rows = []
    for key, track in spans.items():
        visible = [s for s in track if s["ts"] < hi and s["ts"] + s["dur"] > lo]
        if visible:
            rows.append((key, lanes(visible)))
    rows.sort(key=lambda r: (psort.get(r[0][0], r[0][0]), r[0][0], tsort.get(r[0], r[0][1]), r[0][1]))

    label_w, right, lane_h, gap, top = 210, 20, 16, 8, 44
    plot_w = width - label_w - right
    x_of = lambda ts: label_w + (min(max(ts, lo), hi) - lo) / (hi - lo) * plot_w
    backgrounds, body, y = [], [], top
    categories = set()
    for row, ((pid, tid), placed) in enumerate(rows):
        depth = 1 + max(d for d, _ in placed)
        h = depth * lane_h
        name = f"{process.get(pid, pid)} · {thread.get((pid, tid), tid)}"
        backgrounds.append(f'<rect x="0" y="{y - gap / 2:.1f}" width="{width}" '
                           f'height="{h + gap:.1f}" fill="{"#f3f3f3" if row % 2 == 0 else "#ffffff"}"/>')
        body.append(f'<text x="6" y="{y + 12}" class="track">{html.escape(name)}</text>')
        for d, s in placed:
            x0, x1 = x_of(s["ts"]), x_of(s["ts"] + s["dur"])
            cat = s.get("cat", "")
            categories.add(cat)
            fill = COLOURS.get(cat, OTHER)
            w = max(x1 - x0, 0.5)
            tip = f'{s["name"]}: {s["dur"] / 1000:.3f} ms'
            for k, v in sorted(s.get("args", {}).items()):
                tip += f"\n{k}: {v}"
            body.append(f'<rect x="{x0:.2f}" y="{y + d * lane_h + 1}" width="{w:.2f}" '
                        f'height="{lane_h - 2}" fill="{fill}" stroke="#ffffff" stroke-width="0.5">'
                        f"<title>{html.escape(tip)}</title></rect>")
            text = s["name"]
            if w > 6.2 * len(text) + 4:
                body.append(f'<text x="{x0 + 2:.2f}" y="{y + d * lane_h + 12}" class="span">'
                            f"{html.escape(text)}</text>")
        y += h + gap
    # The time axis, in milliseconds from the window's start.
    axis_y = y + 4
    tick = nice_step(hi - lo)
    axis = [f'<line x1="{label_w}" y1="{axis_y}" x2="{label_w + plot_w}" y2="{axis_y}" stroke="#333"/>']
    t = 0.0
    while lo + t <= hi + 1e-9:
        x = x_of(lo + t)
        axis.append(f'<line x1="{x:.2f}" y1="{top - 6}" x2="{x:.2f}" y2="{axis_y + 4}" stroke="#ddd"/>')
        axis.append(f'<text x="{x:.2f}" y="{axis_y + 16}" class="tick" text-anchor="middle">'
                    f"{t / 1000:g}</text>")
        t += tick
    axis.append(f'<text x="{label_w + plot_w}" y="{axis_y + 30}" class="tick" text-anchor="end">'
                f"ms from {lo / 1000:.3f} ms into the trace</text>")
    legend, lx = [], label_w
    for cat in [c for c in COLOURS if c in categories] + sorted(categories - set(COLOURS)):
        text = KINDS.get(cat, cat or "other")
        legend.append(f'<rect x="{lx}" y="{axis_y + 40}" width="10" height="10" '
                      f'fill="{COLOURS.get(cat, OTHER)}"/>')
        legend.append(f'<text x="{lx + 14}" y="{axis_y + 49}" class="tick">{html.escape(text)}</text>')
        lx += 24 + 6.2 * len(text)
    height = axis_y + 60
    svg = [f'<?xml version="1.0" encoding="UTF-8"?>',
           f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0f}" '
           f'viewBox="0 0 {width} {height:.0f}" font-family="sans-serif">',
           "<style>.track{font-size:11px;fill:#222}.span{font-size:10px;fill:#111}"
           ".tick{font-size:10px;fill:#444}.title{font-size:14px;font-weight:bold}</style>",
           f'<rect width="{width}" height="{height:.0f}" fill="#ffffff"/>',
           f'<text x="6" y="20" class="title">{html.escape(title)}</text>',
           *backgrounds, *axis[:1], *[a for a in axis[1:] if "<line" in a], *body,
           *[a for a in axis[1:] if "<line" not in a], *legend, "</svg>"]
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", help="trace files (several: put on one clock)")
    p.add_argument("-o", "--output", help="the SVG to write")
    p.add_argument("--merge", action="store_true",
                   help="write the first file as the merge of the others; draw nothing")
    p.add_argument("--step", type=int, help="draw only the window of the spans 'step N'")
    p.add_argument("--from-ms", type=float, help="window start, ms into the trace")
    p.add_argument("--to-ms", type=float, help="window end, ms into the trace")
    p.add_argument("--title", default="", help="the picture's title")
    p.add_argument("--width", type=int, default=1100, help="pixels (default 1100)")
    a = p.parse_args()
    if a.merge:
        if len(a.traces) < 2:
            fail("--merge OUT IN... needs the output and at least one input")
        merged = merge(a.traces[1:])
        with open(a.traces[0], "w") as f:
            json.dump(merged, f)
        return
    if not a.output:
        fail("say where the SVG goes: -o FILE.svg")
    draw(merge(a.traces), a.output, a.title or ", ".join(a.traces), a.step, a.from_ms, a.to_ms,
         a.width)


if __name__ == "__main__":
    main()
