#!/usr/bin/env python3
"""bench/cpu_compare.py — alternating runs of the P2/P7 programs under
`perf stat`, reporting the median rate and the median CPU time per request.

For comparing builds of libfetchq (before/after a change) against the
curl+jansson anchor on the same nginx, on a shared machine: every round runs
each side once, in the same order, so slow phases hit all sides.

  python3 bench/cpu_compare.py --url http://127.0.0.1:PORT/doc.json \\
      --n 20000 --c 8 --rounds 3 \\
      --lib before=/tmp/base-lib --lib after=build/lib [--no-anchor] [--p7 TEMPLATE]

`--foundation PATH` (with --p7) adds the OperationQueue + URLSession anchor
of P7 (the bench/anchors binary) as a side. `--lib LABEL=DIR` runs build/bench/fq_bench with LD_LIBRARY_PATH=DIR (the
program's RUNPATH points at build/lib; LD_LIBRARY_PATH takes precedence),
so DIR must hold a libfetchq.so.0; `--lib LABEL=DIR,{"delivery":"inline"}` also
merges that JSON into fq_bench's engine config (FQ_BENCH_CONFIG), so one
build can run as several sides. `--p7 TEMPLATE` runs `fq_bench p7`
instead of p2 (the anchor then fetches TEMPLATE with {query} = "q1 ü" and
extracts "results", like bench/run.sh). Needs `perf` (linux-perf).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "build", "bench")


def run(cmd, env=None):
    """One run under perf stat: (rate, task-clock ms, context switches)."""
    full = ["perf", "stat", "-x", ",", "-e", "task-clock,context-switches"] + cmd
    p = subprocess.run(full, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr}")
    result = json.loads(p.stdout.strip().splitlines()[-1])
    clock = switches = None
    for line in p.stderr.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2].startswith("task-clock"):
            clock = float(fields[0])
        elif len(fields) > 2 and fields[2].startswith("context-switches"):
            switches = float(fields[0])
    return result["rate"], clock, switches


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--c", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lib", action="append", default=[],
                    help="LABEL=DIR[,CONFIG]: DIR holds libfetchq.so.0; CONFIG (JSON) becomes FQ_BENCH_CONFIG")
    ap.add_argument("--no-anchor", action="store_true")
    ap.add_argument("--p7", metavar="TEMPLATE", help="run p7 searches against this URL template")
    ap.add_argument("--foundation", metavar="ANCHORS",
                    help="with --p7: also run the OperationQueue+URLSession anchor (bench/anchors binary)")
    args = ap.parse_args()

    sides = []
    if not args.no_anchor:
        if args.p7:
            cmd = [os.path.join(BENCH, "curl_jansson_client"), args.p7.replace("{query}", "q1%20%C3%BC"),
                   str(args.n), str(args.c), "results"]
        else:
            cmd = [os.path.join(BENCH, "curl_jansson_client"), args.url, str(args.n), str(args.c)]
        sides.append(("anchor", cmd, None))
    if args.p7 and args.foundation:
        sides.append(("foundation", [args.foundation, "p7", args.p7, str(args.n), str(args.c)], None))
    for spec in args.lib or ["fetchq=" + os.path.join(ROOT, "build", "lib")]:
        label, _, directory = spec.partition("=")
        directory, _, config = directory.partition(",")
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.abspath(directory))
        if config:
            env["FQ_BENCH_CONFIG"] = config
        if args.p7:
            cmd = [os.path.join(BENCH, "fq_bench"), "p7", args.p7, str(args.n), str(args.c)]
        else:
            cmd = [os.path.join(BENCH, "fq_bench"), "p2", args.url, str(args.n), str(args.c)]
        sides.append((label, cmd, env))

    samples = {label: [] for label, _, _ in sides}
    for r in range(args.rounds):
        for label, cmd, env in sides:
            rate, clock, switches = run(cmd, env)
            samples[label].append((rate, clock * 1000 / args.n, switches / args.n))
            print(f"round {r + 1} {label:>10}: {rate:9.0f} req/s  {clock * 1000 / args.n:6.1f} us CPU/req"
                  f"  {switches / args.n:5.2f} cs/req", file=sys.stderr, flush=True)

    # Interference from other jobs only adds CPU time, so the minimum is shown
    # next to the median.
    print(f"\n{'side':>10} {'req/s median':>13} {'min-max':>17} {'CPU us/req':>11} {'(min)':>6} {'cs/req':>7}")
    for label, _, _ in sides:
        rates = [s[0] for s in samples[label]]
        cpu = [s[1] for s in samples[label]]
        print(f"{label:>10} {statistics.median(rates):13.0f} {min(rates):8.0f}-{max(rates):<8.0f}"
              f" {statistics.median(cpu):11.1f} {min(cpu):6.1f}"
              f" {statistics.median(s[2] for s in samples[label]):7.2f}")


if __name__ == "__main__":
    main()
