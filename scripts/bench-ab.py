#!/usr/bin/env python3
"""Compare versions of the code with make bench's contenders, alternated.

The machine's speed moves by tens of per cent from one run to the next
(BENCHMARKS.md), so two versions are compared within the same stretch of
time: a test binary per version, run in turn, one round each, N times,
and each contender divided by the raw loops of its own run.

    git stash; go test -c -o /tmp/bench-before ./internal/bench; git stash pop
    go test -c -o /tmp/bench-after ./internal/bench
    BENCH_ONLY='^(raw-alos|raw-eos|echo-eos|aggregate-eos-bbolt)/100ms$' \\
        python3 scripts/bench-ab.py 4 /tmp/ab /tmp/bench-before /tmp/bench-after

runs binary 1, binary 2, binary 1, ... (4 runs of each), writes each run's
JSON lines to /tmp/ab/<binary>-<run>.jsonl and prints, per run and then as
medians per binary, every contender × raw ALOS (echo contenders × raw EOS
too, when raw-eos ran) and aggregate's checkpoint p99; the medians also
give every contender's CPU s / M records, its own and the broker's.
To compare values of a setting the binary reads from the environment
(GOGC, or a temporary hook) instead of versions, wrap one binary in a
script per value, e.g. `#!/bin/sh` and `GOGC=400 exec /tmp/bench "$@"`:
a run's child processes (the broker and every contender) inherit it. BENCH_ONLY,
BENCH_RECORDS and the other BENCH_ variables pass through; BENCH_ROUNDS is
1. A binary runs from internal/bench, as make bench does.

    python3 scripts/bench-ab.py --summary /tmp/ab

prints the summary of runs already in the directory. Standard library
only.
"""

import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH_DIR = os.path.join(HERE, "..", "internal", "bench")


def run(n, outdir, binaries):
    os.makedirs(outdir, exist_ok=True)
    env = dict(os.environ, BENCH_ROUNDS="1")
    for i in range(1, n + 1):
        for b in binaries:
            out = os.path.join(outdir, f"{os.path.basename(b)}-{i}.jsonl")
            env["BENCH_OUT"] = out
            print(f"run {i}: {b}", file=sys.stderr, flush=True)
            subprocess.run([os.path.abspath(b), "-test.run", "^$", "-test.bench", "^BenchmarkContenders$",
                            "-test.benchtime", "1x", "-test.timeout", "45m"],
                           cwd=BENCH_DIR, env=env, check=True, stdout=subprocess.DEVNULL)


def throughput(path):
    """The throughput rows at 100 ms of one run, by contender."""
    rows = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "throughput" and r.get("interval_ms") == 100:
                rows[r["contender"]] = r
    return rows


def summary(outdir):
    runs = {}  # binary -> [(run, rows)]
    for name in sorted(os.listdir(outdir)):
        if not name.endswith(".jsonl"):
            continue
        base, _, num = name[:-len(".jsonl")].rpartition("-")
        if not num.isdigit():
            continue
        runs.setdefault(base, []).append((int(num), throughput(os.path.join(outdir, name))))
    medians = {}
    for b, rs in runs.items():
        ratios = {}
        for i, rows in sorted(rs, key=lambda x: x[0]):
            if "raw-alos" not in rows:
                print(f"{b} {i}: no raw-alos row", file=sys.stderr)
                continue
            alos = rows["raw-alos"]["records_per_s"]
            eos = rows.get("raw-eos", {}).get("records_per_s")
            cols = []
            for c, r in rows.items():
                if c == "raw-alos":
                    continue
                x = r["records_per_s"] / alos
                ratios.setdefault(c + " × raw ALOS", []).append(x)
                cols.append(f"{c} {x:.2f}")
                if eos and c.startswith("echo"):
                    y = r["records_per_s"] / eos
                    ratios.setdefault(c + " × raw EOS", []).append(y)
                    cols.append(f"(× raw EOS {y:.2f})")
                if c.startswith("aggregate") and r.get("checkpoint_p99_ms"):
                    ratios.setdefault(c + " checkpoint p99 ms", []).append(r["checkpoint_p99_ms"])
            for c, r in rows.items():
                for key, what in (("cpu_s_per_m_records", "CPU s / M"),
                                  ("broker_cpu_s_per_m_records", "broker CPU s / M")):
                    if r.get(key) is not None:
                        ratios.setdefault(f"{c} {what}", []).append(r[key])
            print(f"{b} run {i}: " + ", ".join(cols))
        medians[b] = {k: statistics.median(v) for k, v in ratios.items()}
    print()
    for b, m in medians.items():
        print(f"{b}, medians:")
        for k, v in sorted(m.items()):
            print(f"  {k:50s} {v:.2f}")


def main():
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--summary":
        summary(args[1])
        return
    if len(args) < 3 or not args[0].isdigit():
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    run(int(args[0]), args[1], args[2:])
    summary(args[1])


if __name__ == "__main__":
    main()
