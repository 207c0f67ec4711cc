#!/usr/bin/env python3
"""Draw the two charts of BENCHMARKS.md from make bench's JSON lines.

    make bench BENCH_OUT=/tmp/bench.jsonl
    python3 scripts/bench-charts.py /tmp/bench.jsonl docs/img

    python3 scripts/bench-charts.py --tables /tmp/bench.jsonl

The first writes docs/img/bench-interval.svg (throughput and p99 latency against the
checkpoint interval) and docs/img/bench-contenders.svg (each contender's
throughput at 100 ms, Sluice against the raw franz-go loops, exactly-once
against at-least-once). Standard library only, so that it runs anywhere
the repo is checked out.
"""

import json
import math
import os
import sys
from xml.sax.saxutils import escape

FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'
COLORS = {
    "raw": "#8c8c8c",
    "exactly-once": "#1f6fb4",
    "at-least-once": "#e08a1e",
}
# The contenders' names in BENCHMARKS.md's tables, in the tables' order.
TABLE_NAMES = [
    ("raw-alos", "raw franz-go, at-least-once"),
    ("raw-eos", "raw franz-go, `GroupTransactSession`"),
    ("raw-alos-64k", "raw franz-go, at-least-once, 64 KiB fetches"),
    ("raw-eos-64k", "raw franz-go, `GroupTransactSession`, 64 KiB fetches"),
    ("raw-aggregate-alos", "raw franz-go, the aggregate job by hand, at-least-once"),
    ("raw-aggregate-eos", "raw franz-go, the aggregate job by hand, `GroupTransactSession`"),
    ("echo-eos", "Sluice `echo`, exactly-once"),
    ("aggregate-eos-bbolt", "Sluice `aggregate`, exactly-once, bbolt"),
    ("aggregate-eos-memory", "Sluice `aggregate`, exactly-once, memory"),
    ("aggregate-alos-bbolt", "Sluice `aggregate`, at-least-once, bbolt"),
    ("echo-eos-p2", "Sluice `echo`, exactly-once, 2 tasks at once"),
    ("aggregate-eos-bbolt-p2", "Sluice `aggregate`, exactly-once, bbolt, 2 tasks at once"),
    ("echo-eos-pipelined", "Sluice `echo`, exactly-once, pipelined epochs"),
    ("aggregate-eos-bbolt-pipelined", "Sluice `aggregate`, exactly-once, bbolt, pipelined epochs"),
    ("hash-eos", "Sluice `hash`, exactly-once"),
    ("hash-eos-p2", "Sluice `hash`, exactly-once, 2 tasks at once"),
]
# The charts' labels: the tables' names without Markdown.
LABELS = {name: label.replace("`", "") for name, label in TABLE_NAMES}
SERIES = {"echo-eos": "#1f6fb4", "aggregate-eos-bbolt": "#c23b3b"}
# The latency panel adds both jobs with pipelined epochs, and the raw
# transactional loops at each interval: the floor of read_committed
# latency, an epoch's records all visible at its commit (the loop copying
# each record under echo's, the aggregate job by hand under aggregate's,
# whose outputs are larger).
LAT_SERIES = {**SERIES, "echo-eos-pipelined": "#6fb0e0", "aggregate-eos-bbolt-pipelined": "#7b4ea3",
              "raw-eos": COLORS["raw"], "raw-aggregate-eos": "#4d4d4d"}


def text(x, y, s, size=12, anchor="start", weight="normal", fill="#222"):
    return (f'<text x="{x:.1f}" y="{y:.1f}" {FONT} font-size="{size}" '
            f'text-anchor="{anchor}" font-weight="{weight}" fill="{fill}">{escape(s)}</text>')


def nice_max(v):
    """A round axis maximum at or above v."""
    if v <= 0:
        return 1
    mag = 10 ** (len(str(int(v))) - 1)
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * mag >= v:
            return m * mag
    return 10 * mag


def fmt_rate(v):
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.0f} k"


def panel(x0, y0, w, h, title, xs, series, ymax, yfmt, ylabel, guides=(), ticks=None):
    """A line panel: xs are categories, series maps name -> [y or None],
    guides are heights of horizontal dashed lines."""
    def ypos(v):
        return y0 + h - h * min(v, ymax) / ymax

    out = [text(x0 + w / 2, y0 - 14, title, 14, "middle", "bold")]
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#bbb"/>')
    for v in ticks or [ymax * i / 5 for i in range(6)]:
        y = ypos(v)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(text(x0 - 6, y + 4, yfmt(v), 11, "end"))
    out.append(f'<text transform="translate({x0 - 62},{y0 + h / 2}) rotate(-90)" {FONT} '
               f'font-size="12" text-anchor="middle">{escape(ylabel)}</text>')
    step = w / len(xs)
    px = [x0 + step * (i + 0.5) for i in range(len(xs))]
    for x, label in zip(px, xs):
        out.append(text(x, y0 + h + 18, label, 12, "middle"))
    out.append(text(x0 + w / 2, y0 + h + 36, "checkpoint interval", 12, "middle"))
    for g in guides:
        y = ypos(g)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#999" stroke-dasharray="5,4"/>')
    labels = {}  # interval index -> [(wanted y, x, value, color)]
    for name, ys in series.items():
        color = LAT_SERIES.get(name, "#333")
        pts = [(x, ypos(v), v, i) for i, (x, v) in enumerate(zip(px, ys)) if v is not None]
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2.5" points="'
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in pts) + '"/>')
        for x, y, v, i in pts:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}"/>')
            labels.setdefault(i, []).append((y, x, v, color))
    # Each interval's labels stand right of its points, top to bottom in
    # the points' order, at least a line apart, so close values stay
    # readable.
    for pts in labels.values():
        pts.sort()
        ly = [y for y, _, _, _ in pts]
        for k in range(1, len(ly)):
            ly[k] = max(ly[k], ly[k - 1] + 13)
        # centre the stack on the points it labels
        shift = (sum(y for y, _, _, _ in pts) - sum(ly)) / len(ly)
        for (_, x, v, color), y in zip(pts, ly):
            label = yfmt(v)
            # on a white box, so that the lines passing behind do not cross it
            out.append(f'<rect x="{x + 7:.1f}" y="{y + shift - 7:.1f}" width="{6.5 * len(label) + 4:.1f}" height="13" fill="white" fill-opacity="0.9"/>')
            out.append(text(x + 9, y + shift + 4, label, 11, fill=color))
    return out


def interval_chart(rows):
    intervals = sorted({r["interval_ms"] for r in rows if r.get("sluice") and r["guarantee"] == "exactly-once"})
    xs = [f"{i / 1000:g} s" if i >= 1000 else f"{i:g} ms" for i in intervals]

    def pick(kind, name, field):
        out = []
        for i in intervals:
            v = [r[field] for r in rows if r["kind"] == kind and r["contender"] == name and r["interval_ms"] == i and field in r]
            out.append(v[0] if v else None)
        return out

    tp = {n: pick("throughput", n, "records_per_s") for n in SERIES}
    # p99 over the interval: what the targets bound (+ 50 ms; + 20 ms with
    # pipelined epochs), and where a few milliseconds show.
    lat = {n: [None if v is None else v - i for v, i in zip(pick("latency", n, "latency_p99_ms"), intervals)]
           for n in LAT_SERIES}
    tmax = nice_max(max([v for ys in tp.values() for v in ys if v] + [1]))
    lmax = 10 * math.ceil(max([v for ys in lat.values() for v in ys if v is not None] + [55]) / 10)
    W, H = 960, 440 + 24 * (len(LAT_SERIES) + 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    tprows = [r for r in rows if r["kind"] == "throughput"]
    out += panel(90, 50, 360, 300, f"Throughput, {records_label(tprows)[:-2] or 'preloaded records'}", xs, tp, tmax, fmt_rate, "records/s")
    out += panel(570, 50, 360, 300, "p99 latency over the interval, 20k records/s", xs, lat, lmax,
                 lambda v: f"{v:+.1f}" if v % 1 else f"+{v:.0f}", "ms over the checkpoint interval",
                 guides=(50, 20), ticks=range(0, lmax + 1, 10 if lmax <= 80 else 20))
    legend = [(LABELS[n] + ("" if n in SERIES else " (latency panel only)"), c, "") for n, c in LAT_SERIES.items()]
    legend.append(("targets: p99 within the interval + 50 ms; + 20 ms with pipelined epochs", "#999", ' stroke-dasharray="5,4"'))
    for k, (label, color, dash) in enumerate(legend):
        x, y = 60, 420 + 24 * k
        width = 1 if dash else 3
        out.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 24}" y2="{y - 4}" stroke="{color}" stroke-width="{width}"{dash}/>')
        out.append(text(x + 30, y, label, 12))
    out.append("</svg>")
    return "\n".join(out)


def records_label(bars):
    """The run's record count for a title, from its rows."""
    n = max([r.get("records", 0) for r in bars] + [0])
    return f"{n / 1e6:g}M records, " if n else ""


def contenders_chart(rows):
    order = ["raw-alos", "raw-eos", "raw-aggregate-alos", "raw-aggregate-eos", "echo-eos", "aggregate-eos-bbolt", "aggregate-eos-memory", "aggregate-alos-bbolt",
             "aggregate-eos-bbolt-pipelined"]
    tp = [r for r in rows if r["kind"] == "throughput" and r["interval_ms"] == 100]
    bars = []
    for name in order:
        for r in tp:
            if r["contender"] == name:
                bars.append(r)
                break
    vmax = nice_max(max([r["records_per_s"] for r in bars] + [1]))
    W, left, right, top, bar, gap = 1000, 415, 150, 60, 34, 14
    H = top + len(bars) * (bar + gap) + 80
    plot = W - left - right
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           text(W / 2, 30, f"Throughput at 100 ms commits, {records_label(bars)}4 partitions, 2 cores", 15, "middle", "bold")]
    bottom = top + len(bars) * (bar + gap)
    for i in range(6):
        v = vmax * i / 5
        x = left + plot * i / 5
        out.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{bottom}" stroke="#eee"/>')
        out.append(text(x, bottom + 16, fmt_rate(v), 11, "middle"))
    out.append(text(left + plot / 2, bottom + 34, "records/s", 12, "middle"))
    for k, r in enumerate(bars):
        y = top + k * (bar + gap)
        color = COLORS["raw"] if not r.get("sluice") else COLORS[r["guarantee"]]
        w = plot * r["records_per_s"] / vmax
        out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar}" fill="{color}"/>')
        out.append(text(left - 8, y + bar / 2 + 4, LABELS.get(r["contender"], r["contender"]), 12, "end"))
        note = f'{fmt_rate(r["records_per_s"])}  ({r.get("ratio_raw_alos", 0):.2f}× raw ALOS)'
        out.append(text(left + w + 6, y + bar / 2 + 4, note, 11))
    y = H - 18
    x = left
    for label, color in (("raw franz-go", COLORS["raw"]), ("Sluice, exactly-once", COLORS["exactly-once"]),
                         ("Sluice, at-least-once", COLORS["at-least-once"])):
        out.append(f'<rect x="{x}" y="{y - 11}" width="14" height="14" fill="{color}"/>')
        out.append(text(x + 20, y, label, 12))
        x += 180
    out.append("</svg>")
    return "\n".join(out)




def fmt_interval(ms):
    return "1 s" if ms == 1000 else f"{ms} ms"


def fmt_records(v):
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.0f} k"


def ratio(r, key):
    """A ratio of the row, or a dash when the run had no such raw loop."""
    return f"{r[key]:.2f}" if key in r else "–"


def tables(rows):
    """BENCHMARKS.md's throughput and latency tables, in Markdown: 100 ms
    rows first in TABLE_NAMES order, then the other intervals."""
    order = {name: i for i, (name, _) in enumerate(TABLE_NAMES)}
    label = dict(TABLE_NAMES)

    def key(r):
        return (r["interval_ms"] != 100, order.get(r["contender"], 99), r["interval_ms"])

    out = ["| contender | interval | records/s | × raw ALOS | × raw EOS | CPU s / M records | peak RSS MiB | allocs / record | B / record | checkpoint p50 / p99 ms | share of time in checkpoints |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in rows if r.get("kind") == "throughput"), key=key):
        ckpt, share = "–", "–"
        if r.get("sluice"):
            ckpt = f"{r['checkpoint_p50_ms']:.1f} / {r['checkpoint_p99_ms']:.1f}"
            share = f"{100 * r['checkpoint_share']:.0f} %"
        out.append(f"| {label.get(r['contender'], r['contender'])} | {fmt_interval(r['interval_ms'])} | {fmt_records(r['records_per_s'])} | "
                   f"{ratio(r, 'ratio_raw_alos')} | {ratio(r, 'ratio_raw_eos')} | {r['cpu_s_per_m_records']:.2f} | {r['peak_rss_mib']:.0f} | "
                   f"{r['allocs_per_record']:.1f} | {r['alloc_bytes_per_record']:.0f} | {ckpt} | {share} |")
    out += ["", "| contender | interval | p50 ms | p99 ms | received / produced |", "|---|---|---|---|---|"]
    lat = sorted((r for r in rows if r.get("kind") == "latency"), key=lambda r: (order.get(r["contender"], 99), r["interval_ms"]))
    for r in lat:
        out.append(f"| {label.get(r['contender'], r['contender'])} | {fmt_interval(r['interval_ms'])} | {r['latency_p50_ms']:.1f} | "
                   f"{r['latency_p99_ms']:.1f} | {r['received']:,} / {r['produced']:,} |")
    return "\n".join(out)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--tables":
        with open(sys.argv[2]) as f:
            print(tables([json.loads(line) for line in f if line.strip()]))
        return
    if len(sys.argv) != 3:
        print("usage: bench-charts.py BENCH_OUT.jsonl OUTDIR\n       bench-charts.py --tables BENCH_OUT.jsonl", file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    os.makedirs(sys.argv[2], exist_ok=True)
    for name, svg in (("bench-interval.svg", interval_chart(rows)), ("bench-contenders.svg", contenders_chart(rows))):
        with open(os.path.join(sys.argv[2], name), "w") as f:
            f.write(svg + "\n")


if __name__ == "__main__":
    main()
