#!/usr/bin/env python3
"""Draws a 16-mixed run's loss scale per step (train_gpt --scale-log's CSV: step,scale,stepped)
as one SVG: log2 of the scale against the step, a step line, each skipped step (an inf or NaN
gradient: the scale halved after it) marked.

  build/bin/train_gpt --precision 16-mixed --iters 300 --eval-interval 100 --sample-chars 0 \\
      --growth-interval 20 --scale-log scale.csv
  python3 scripts/plot_loss_scale.py scale.csv docs/mixed-precision-loss-scale.svg "title"

Standard library only: the SVG is written by hand.
"""
import csv
import math
import os
import sys
import tempfile
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 900, 420
LEFT, RIGHT, TOP, BOTTOM = 80, 30, 60, 60


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit("usage: plot_loss_scale.py SCALE.csv OUT.svg [TITLE]")
    with open(argv[1], newline="") as f:
        rows = [(int(r["step"]), float(r["scale"]), r["stepped"] == "1") for r in csv.DictReader(f)]
    if not rows:
        sys.exit(f"{argv[1]}: no steps")
    title = argv[3] if len(argv) == 4 else "GradScaler's loss scale per step"
    steps = [r[0] for r in rows]
    logs = [math.log2(r[1]) for r in rows]
    x0, x1 = min(steps) - 1, max(steps)
    y0, y1 = math.floor(min(logs)) - 1, math.ceil(max(logs)) + 1
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def X(s):
        return LEFT + (s - x0) / max(x1 - x0, 1) * pw

    def Y(v):
        return TOP + (y1 - v) / max(y1 - y0, 1) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="13">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="28" text-anchor="middle" font-size="16">{escape(title)}</text>']
    for v in range(y0, y1 + 1):  # a grid line per power of 2
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 8}" y="{Y(v) + 4:.1f}" text-anchor="end">2^{v}</text>')
    tick = max(1, 10 ** int(math.log10(max(x1 - x0, 1))) // 2)
    for s in range((x0 // tick + 1) * tick, x1 + 1, tick):
        out.append(f'<line x1="{X(s):.1f}" x2="{X(s):.1f}" y1="{TOP + ph}" y2="{TOP + ph + 5}" stroke="black"/>')
        out.append(f'<text x="{X(s):.1f}" y="{TOP + ph + 20}" text-anchor="middle">{s}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 15}" text-anchor="middle">step</text>')
    out.append(f'<text transform="translate(20 {TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
               'loss scale S (log2)</text>')
    # The scale a step's loss was multiplied by holds over that step: a step line.
    points = []
    for (s, _, _), v in zip(rows, logs):
        points += [f"{X(s - 1):.1f},{Y(v):.1f}", f"{X(s):.1f},{Y(v):.1f}"]
    out.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#1f4e9c" stroke-width="2"/>')
    skipped = [(s, v) for (s, _, stepped), v in zip(rows, logs) if not stepped]
    for s, v in skipped:
        out.append(f'<circle cx="{X(s - 0.5):.1f}" cy="{Y(v):.1f}" r="4" fill="#c0392b"/>')
    out.append(f'<text x="{LEFT + 10}" y="{TOP + 18}" fill="#1f4e9c">S per step</text>')
    out.append(f'<text x="{LEFT + 10}" y="{TOP + 36}" fill="#c0392b">&#9679; step skipped: an inf or NaN '
               f'gradient, S halved ({len(skipped)} of {len(rows)})</text>')
    out.append("</svg>")
    # Written whole or not at all.
    directory = os.path.dirname(os.path.abspath(argv[2]))
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp") as f:
        f.write("\n".join(out) + "\n")
    os.replace(f.name, argv[2])


if __name__ == "__main__":
    main(sys.argv)
