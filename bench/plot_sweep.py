#!/usr/bin/env python3
"""Draws the JSON lines of bench/sweep.sh as one SVG chart: median step time against
batch size, log-log, one line per framework and mode (and replica count).

  python3 bench/plot_sweep.py sweep.jsonl sweep.svg [--metric median_cpu_ms]

--metric picks the field drawn: median_ms (wall clock, the default) or, for CPU runs on a
machine shared with other work, median_cpu_ms (process CPU time per step, which the
scheduler disturbs less; DataParallel's replica threads add up in it).

Where a line is flat, the step costs the same whatever the batch: fixed per-step
overhead (Python, dispatch, kernel launches) dominates. Where it runs parallel to the
dotted guide (time proportional to batch), the arithmetic does. Standard library only:
the SVG is written by hand.
"""
import json
import math
import os
import sys
import tempfile
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 900, 600
LEFT, RIGHT, TOP, BOTTOM = 80, 250, 60, 70

# minigrad in blues/greens, PyTorch in oranges/reds; the mode sets the dash.
COLORS = {
    "minigrad": ["#1f4e9c", "#2f8fd8", "#2aa198", "#6c71c4", "#0b6e4f", "#5fa8d3"],
    "torch": ["#d35400", "#e67e22", "#c0392b", "#b9770e", "#a93226", "#f1948a"],
}
DASH = {"eager": "", "graph": "2,4", "dataparallel": "8,4"}
MARKER_RADIUS = 3.5


METRIC = "median_ms"
Y_LABEL = {"median_ms": "median ms per training step",
           "median_cpu_ms": "median CPU ms per training step"}


def write_atomically(path, text):
    """Writes `text` to `path` as minigrad's own writers do (minigrad/core/files.h): to a
    temporary file beside the target, flushed, then renamed over it. A symbolic link is
    followed; a path that exists and is not a regular file (a FIFO, /dev/null) is refused."""
    target = os.path.realpath(path)
    if os.path.lexists(target) and not os.path.isfile(target):
        raise SystemExit(f"plot_sweep.py: {path}: it exists and is not a regular file; "
                         "refusing to write there")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target),
                               prefix=f"{os.path.basename(target)}.tmp.{os.getpid()}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if "error" not in r and METRIC in r:
                    rows.append(r)
    return rows


def series_name(r):
    framework = "minigrad" if r["framework"] == "minigrad" else "PyTorch"
    mode = r["mode"]
    if mode == "dataparallel":
        n = len(r.get("device_ids", [0]))
        mode = f"DataParallel ×{n}"
    elif mode == "graph":
        mode = "CUDA graph"
    return f"{framework} {mode}" + (" TF32" if r.get("tf32") else "")


def nice_ticks(lo, hi):
    """Powers of ten (and 2x, 5x between them when the range is short) within [lo, hi]."""
    ticks = []
    start, end = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1, 2, 5) if end - start <= 3 else (1,)
    for e in range(start, end + 1):
        for m in steps:
            v = m * 10 ** e
            if lo <= v <= hi:
                ticks.append(v)
    return ticks


def fmt_number(v):
    if v >= 1:
        return f"{v:g}"
    return f"{v:.3g}"


def plot(rows, title):
    groups = {}
    for r in rows:
        groups.setdefault((r["framework"], r["mode"], len(r.get("device_ids", [])), bool(r.get("tf32"))), []).append(r)
    xs = [r["batch"] for r in rows]
    ys = [r[METRIC] for r in rows]
    x_lo, x_hi = min(xs) / 1.3, max(xs) * 1.3
    y_lo, y_hi = min(ys) / 1.6, max(ys) * 1.6
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x):
        return LEFT + (math.log(x) - math.log(x_lo)) / (math.log(x_hi) - math.log(x_lo)) * plot_w

    def py(y):
        return TOP + plot_h - (math.log(y) - math.log(y_lo)) / (math.log(y_hi) - math.log(y_lo)) * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="30" font-size="17" font-weight="bold">{escape(title)}</text>',
    ]
    # Grid and axes.
    for x in sorted(set(xs)):
        out.append(f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" y2="{TOP + plot_h}" stroke="#eee"/>')
        out.append(f'<text x="{px(x):.1f}" y="{TOP + plot_h + 18}" font-size="11" text-anchor="middle">{x}</text>')
    for y in nice_ticks(y_lo, y_hi):
        out.append(f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{LEFT + plot_w}" y2="{py(y):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" font-size="11" text-anchor="end">{fmt_number(y)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 25}" font-size="13" text-anchor="middle">'
               'batch size (log scale)</text>')
    out.append(f'<text x="20" y="{TOP + plot_h / 2}" font-size="13" text-anchor="middle" '
               f'transform="rotate(-90 20 {TOP + plot_h / 2})">{Y_LABEL[METRIC]} (log scale)</text>')

    # The guide: time proportional to batch, through the slowest eager point at the
    # largest batch. Lines parallel to it are bound by arithmetic, flat ones by overhead.
    eager_big = [r for r in rows if r["mode"] == "eager" and r["batch"] == max(xs)]
    if eager_big:
        anchor = min(eager_big, key=lambda r: r[METRIC])
        x0, y0 = anchor["batch"], anchor[METRIC]
        xa = max(x_lo * 1.3, x0 * y_lo / y0)
        out.append(f'<line x1="{px(xa):.1f}" y1="{py(y0 * xa / x0):.1f}" x2="{px(x0):.1f}" y2="{py(y0):.1f}" '
                   'stroke="#999" stroke-dasharray="1,3" stroke-width="1.5"/>')

    legend_y = TOP + 10
    used = {"minigrad": 0, "torch": 0}
    order = sorted(groups, key=lambda k: (k[0] != "minigrad", ["eager", "graph", "dataparallel"].index(k[1])
                                          if k[1] in DASH else 9, k[2], k[3]))
    for k in order:
        pts = sorted(groups[k], key=lambda r: r["batch"])
        framework = k[0] if k[0] in COLORS else "torch"
        color = COLORS[framework][used[framework] % len(COLORS[framework])]
        used[framework] += 1
        dash = DASH.get(k[1], "")
        path = " ".join(f"{'M' if i == 0 else 'L'}{px(r['batch']):.1f},{py(r[METRIC]):.1f}"
                        for i, r in enumerate(pts))
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"{dash_attr}/>')
        for r in pts:
            shape = (f'<circle cx="{px(r["batch"]):.1f}" cy="{py(r[METRIC]):.1f}" r="{MARKER_RADIUS}" '
                     f'fill="{color}"><title>{escape(series_name(r))}: batch {r["batch"]}, '
                     f'{r[METRIC]:.4g} ms</title></circle>')
            out.append(shape)
        name = series_name(pts[0])
        lx = LEFT + plot_w + 15
        out.append(f'<line x1="{lx}" y1="{legend_y}" x2="{lx + 30}" y2="{legend_y}" stroke="{color}" '
                   f'stroke-width="2"{dash_attr}/>')
        out.append(f'<text x="{lx + 36}" y="{legend_y + 4}" font-size="12">{escape(name)}</text>')
        legend_y += 20
    lx = LEFT + plot_w + 15
    out.append(f'<line x1="{lx}" y1="{legend_y}" x2="{lx + 30}" y2="{legend_y}" stroke="#999" '
               'stroke-dasharray="1,3" stroke-width="1.5"/>')
    out.append(f'<text x="{lx + 36}" y="{legend_y + 4}" font-size="12">time ∝ batch</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    global METRIC
    if len(argv) == 5 and argv[3] == "--metric" and argv[4] in Y_LABEL:
        METRIC = argv[4]
        argv = argv[:3]
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows = load(argv[1])
    if not rows:
        print(f"plot_sweep.py: no results without errors in {argv[1]}", file=sys.stderr)
        return 1
    devices = sorted({r["device"] for r in rows})
    hosts = sorted({r.get("host", "?") for r in rows})
    dates = sorted({r.get("date", "")[:10] for r in rows})
    threads = sorted({str(r.get("blas_threads", r.get("threads", ""))) for r in rows if r["device"] == "cpu"})
    extra = f", {'/'.join(threads)} thread(s) each" if threads else ""
    what = "CPU time" if METRIC == "median_cpu_ms" else "training step"
    title = (f"mnist_mlp {what} vs batch size — {'/'.join(devices)}{extra}, "
             f"{', '.join(hosts)}, {', '.join(dates)}")
    write_atomically(argv[2], plot(rows, title))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
