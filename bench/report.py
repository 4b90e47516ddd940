#!/usr/bin/env python3
"""Writes BENCHMARKS.md from bench/run.sh's results.

  report.py --results build/bench/results.jsonl --meta build/bench/meta.json \
            --root . --out BENCHMARKS.md

Every number in the file comes from the results of this run; the only
hand-written text is bench/findings.md (the profiling analysis), included
verbatim at the end.
"""
import argparse
import ctypes
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
from typing import Any, Callable, Dict, List, Optional, Tuple


def sh(*cmd: str) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (p.stdout + p.stderr).strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else "?"


def machine() -> List[Tuple[str, str]]:
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        m = re.search(r"^model name\s*:\s*(.*)$", f.read(), re.M)
        cpu = m.group(1) if m else cpu
    with open("/proc/meminfo") as f:
        mem_kb = int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1))
    return [("CPUs (nproc)", sh("nproc")), ("CPU model", cpu), ("memory", f"{mem_kb / 1024 / 1024:.1f} GiB"),
            ("kernel", f"{platform.system()} {platform.release()}"),
            ("OS", sh("sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"))]


def versions(root: str, meta: Dict[str, Any]) -> List[Tuple[str, str]]:
    lib = os.path.join(root, "build/lib/libfetchq.so.0")
    try:
        fq = ctypes.CDLL(lib)
        fq.fq_version_string.restype = ctypes.c_char_p
        fetchq = fq.fq_version_string().decode()
    except OSError:
        fetchq = "?"
    head = sh("git", "-C", root, "rev-parse", "--short", "HEAD")
    later = ""
    if "commit" in meta:  # the commit measured, recorded by run.sh
        commit, dirty = meta["commit"], meta.get("dirty", False)
        if commit != head:
            later = f"; this report was regenerated from its results at {head}"
    else:
        commit = head
        dirty = sh("git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", "Sources", "include")
    pyver = {}
    for mod in ("aiohttp", "httpx"):
        pyver[mod] = sh("python3", "-c", f"import {mod}; print({mod}.__version__)")
    wrk = first_line(sh("wrk", "-v"))
    nginx = first_line(sh(os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx" or "nginx", "-v"))
    return [
        ("fetchq", f"{fetchq} (commit {commit}{', with uncommitted changes in Sources/ or include/' if dirty else ''}"
                   f"{later})"),
        ("Swift", first_line(sh("swift", "--version"))),
        ("libcurl", sh("pkg-config", "--modversion", "libcurl")),
        ("jansson", sh("pkg-config", "--modversion", "jansson")),
        ("nginx", nginx.replace("nginx version: ", "")),
        ("wrk", wrk),
        ("Python", platform.python_version()),
        ("aiohttp", pyver["aiohttp"]),
        ("httpx", pyver["httpx"]),
        ("C compiler", first_line(sh("cc", "--version"))),
    ]


# ---- results ---------------------------------------------------------------

Records = List[Dict[str, Any]]


def values(recs: Records, id_: str, side: str, key: Callable[[Dict[str, Any]], float]) -> List[float]:
    return [key(r["result"]) for r in recs if r["id"] == id_ and r["side"] == side and r.get("result")]


def errors(recs: Records, id_: str, side: str) -> List[str]:
    return [r["error"] for r in recs if r["id"] == id_ and r["side"] == side and r.get("error")]


def fmt(x: Optional[float], unit: str = "") -> str:
    if x is None:
        return "—"
    if unit == "ms":
        return f"{x:.2f} ms" if x < 1 else f"{x:.1f} ms" if x < 100 else f"{x:.0f} ms"
    if unit == "B":
        return f"{x:,.0f} B"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.2f}"


def span(v: List[float], unit: str = "") -> str:
    return f"{fmt(min(v), unit)}–{fmt(max(v), unit)}" if v else "—"


RATE = (lambda r: r["rate"])
# (id, results id, benchmark, anchor name, anchor side, unit, goal text, check(ratio or value) -> bool, kind)
#   kind "ratio": fetchq median / anchor median (rates); "value": fetchq median alone.
ROWS = [
    ("P1", "P1-plain", "{p1_n} no-op ops, queue max 2", "Foundation OperationQueue", "anchor", "ops/s", "≥ 10×",
     lambda x: x >= 10, "ratio"),
    ("P1", "P1-prio", "{p1_n} no-op ops, max 2, 5 priorities", "Foundation OperationQueue", "anchor", "ops/s",
     "≥ 10×", lambda x: x >= 10, "ratio"),
    ("P1", "P1-chain", "{p1_chain_n} no-op ops, max 2, a chain of dependencies", "Foundation OperationQueue",
     "anchor", "ops/s", "≥ 10×", lambda x: x >= 10, "ratio"),
    ("P2", "P2-c8", "{p2_n} GET + JSON parse (3 KB), 8 concurrent", "C: libcurl multi + jansson", "anchor",
     "req/s", "≥ 1.0×", lambda x: x >= 1.0, "ratio"),
    ("P2", "P2-c64", "{p2_n} GET + JSON parse (3 KB), 64 concurrent", "C: libcurl multi + jansson", "anchor",
     "req/s", "≥ 1.0×", lambda x: x >= 1.0, "ratio"),
    ("P2", "P2-c8", "same, 8 concurrent, config \"delivery\": \"inline\"", "C: libcurl multi + jansson", "anchor",
     "req/s", "≥ 1.0×", lambda x: x >= 1.0, "ratio", "fetchq-inline"),
    ("P2", "P2-c64", "same, 64 concurrent, config \"delivery\": \"inline\"", "C: libcurl multi + jansson", "anchor",
     "req/s", "≥ 1.0×", lambda x: x >= 1.0, "ratio", "fetchq-inline"),
    ("P3", "P3-c8", "same as P2, 8 concurrent", "wrk (no parse)", "anchor", "req/s", "≥ 0.5×",
     lambda x: x >= 0.5, "ratio"),
    ("P3", "P3-c64", "same as P2, 64 concurrent", "wrk (no parse)", "anchor", "req/s", "≥ 0.5×",
     lambda x: x >= 0.5, "ratio"),
    ("P4", "P4-c8", "{p4_n} GET + JSON parse from Python asyncio, 8 concurrent", "aiohttp", "aiohttp", "req/s",
     "≥ 3×", lambda x: x >= 3, "ratio"),
    ("P4", "P4-c8", "{p4_n} GET + JSON parse from Python asyncio, 8 concurrent (httpx: {p4_httpx_n})", "httpx",
     "httpx", "req/s",
     "≥ 3×", lambda x: x >= 3, "ratio"),
    ("P4", "P4-c64", "{p4_n} GET + JSON parse from Python asyncio, 64 concurrent", "aiohttp", "aiohttp", "req/s",
     "≥ 3×", lambda x: x >= 3, "ratio"),
    ("P4", "P4-c64", "{p4_n} GET + JSON parse from Python asyncio, 64 concurrent (httpx: {p4_httpx_n})", "httpx",
     "httpx", "req/s",
     "≥ 3×", lambda x: x >= 3, "ratio"),
    ("P5", "P5-block", "{p5_n} block ops queued on a suspended queue", "—", None, "B/op", "≤ 1 KB (1024 B)",
     lambda x: x <= 1024, "value"),
    ("P5+", "P5-request", "{p5_n} GET requests queued on a suspended queue (no goal)", "—", None, "B/op", "—",
     None, "value"),
    ("P6", "P6", "cancel-all of {p6_n} queued ops until every callback ran", "—", None, "ms", "≤ 100 ms",
     lambda x: x <= 100, "value"),
    ("P7", "P7", "{p7_n} searches, max_concurrent 8", "OperationQueue + URLSession + JSONSerialization", "anchor",
     "searches/s", "≥ 10×", lambda x: x >= 10, "ratio"),
    ("P7", "P7", "same, config \"delivery\": \"inline\"", "OperationQueue + URLSession + JSONSerialization",
     "anchor", "searches/s", "≥ 10×", lambda x: x >= 10, "ratio", "fetchq-inline"),
    ("P7+", "P7", "one search document (q1) GET + parse only, 1 thread (no goal)", "C: libcurl multi + jansson", "curlj",
     "req/s", "—", None, "ratio", "fetchq-inline"),
]

VALUE_KEY = {"P5-block": lambda r: r["bytes_per_op"], "P5-request": lambda r: r["bytes_per_op"],
             "P6": lambda r: r["ms"]}
VALUE_UNIT = {"P5-block": "B", "P5-request": "B", "P6": "ms"}


def fetchq_id(res_id: str) -> str:
    """P3 compares wrk with P2's fetchq runs (the same rounds)."""
    return res_id.replace("P3-", "P2-")


def round_ratios(recs: Records, fid: str, fside: str, aid: str, aside: str) -> List[float]:
    """fetchq's rate over the anchor's, for each round that has both."""
    def by_round(id_: str, side: str) -> Dict[int, float]:
        return {r["round"]: r["result"]["rate"] for r in recs
                if r["id"] == id_ and r["side"] == side and r.get("result") and "round" in r}
    f, a = by_round(fid, fside), by_round(aid, aside)
    return [f[k] / a[k] for k in sorted(f) if k in a and a[k] > 0]


def per_round(v: List[float], check: Optional[Callable[[float], bool]], ratios: bool) -> str:
    """The last column: for ratios their range; for a goal, in how many of
    the rounds it was met (for a value row, such as P5 or P6, that alone)."""
    if not v:
        return "—"
    text = f"{min(v):.2f}–{max(v):.2f}×" if ratios else "—"
    if check is None:
        return text
    met = f"{sum(1 for x in v if check(x))} of {len(v)}"
    return f"{text}, {met}" if ratios else met


def table(recs: Records, meta: Dict[str, Any]) -> Tuple[List[str], List[str]]:
    lines = ["| id | benchmark | anchor | fetchq median | anchor median | ratio | goal | status | fetchq min–max "
             "| anchor min–max | per round: ratio min–max, rounds meeting the goal |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    problems = []
    for pid, res_id, bench, anchor, aside, unit, goal, check, kind, *rest in ROWS:
        fside = rest[0] if rest else "fetchq"
        bench = bench.format(**{k: f"{v:,}".replace(",", " ") if isinstance(v, int) else v
                                for k, v in meta.items()})
        if kind == "ratio":
            f = values(recs, fetchq_id(res_id), fside, RATE)
            a = values(recs, res_id, aside, RATE)
            fm = statistics.median(f) if f else None
            am = statistics.median(a) if a else None
            ratio = fm / am if fm and am else None
            status = "—" if ratio is None or check is None else ("**met**" if check(ratio) else "not met")
            cells = [f"{fmt(fm)} {unit}" if fm else "—", f"{fmt(am)} {unit}" if am else "—",
                     f"{ratio:.2f}×" if ratio else "—", goal, status, span(f), span(a),
                     per_round(round_ratios(recs, fetchq_id(res_id), fside, res_id, aside), check, True)]
            for side, sid in ((fside, fetchq_id(res_id)), (aside, res_id)):
                for e in errors(recs, sid, side):
                    problems.append(f"{res_id} {side}: {e.strip().splitlines()[-1] if e.strip() else e}")
        else:
            f = values(recs, res_id, "fetchq", VALUE_KEY[res_id])
            fm = statistics.median(f) if f else None
            u = VALUE_UNIT[res_id]
            status = "—" if fm is None or check is None else ("**met**" if check(fm) else "not met")
            cells = [fmt(fm, u), "—", "—", goal, status, span(f, u), "—", per_round(f, check, False)]
            for e in errors(recs, res_id, "fetchq"):
                problems.append(f"{res_id}: {e.strip().splitlines()[-1] if e.strip() else e}")
        if status == "not met":
            cells[4] = "not met — see Findings"
        lines.append(f"| {pid} | {bench} | {anchor} | " + " | ".join(cells) + " |")
    return lines, problems


# Ceilings: the least program that does a benchmark's work on this machine,
# run in the same rounds. (id, fetchq results id, ceiling side, what it is,
# anchor results id, anchor side, anchor name, goal ratio)
CEILINGS = [
    ("P1", "P1-plain", "bare", "a bare mutex-and-FIFO queue in C on 2 threads (`bench/bare_queue.c`)",
     "P1-plain", "anchor", "OperationQueue", 10.0),
    ("P2", "P2-c8", "curlj2", "the curl+jansson client on 2 threads, 8 concurrent", "P2-c8", "anchor",
     "curl+jansson (1 thread)", 1.0),
    ("P2", "P2-c64", "curlj2", "the curl+jansson client on 2 threads, 64 concurrent", "P2-c64", "anchor",
     "curl+jansson (1 thread)", 1.0),
    ("P3", "P2-c8", "curlj2", "the curl+jansson client on 2 threads, 8 concurrent", "P3-c8", "anchor", "wrk", 0.5),
    ("P3", "P2-c64", "curlj2", "the curl+jansson client on 2 threads, 64 concurrent", "P3-c64", "anchor", "wrk",
     0.5),
    # Not the goal's work (no parse): how far any libcurl client gets, whatever it does with the body.
    ("P3", "P2-c8", "curlget2", "the same libcurl client on 2 threads without the parse (GET only), 8 concurrent",
     "P3-c8", "anchor", "wrk", 0.5, "without the parse, which P3 includes"),
    ("P3", "P2-c64", "curlget2", "the same libcurl client on 2 threads without the parse (GET only), 64 concurrent",
     "P3-c64", "anchor", "wrk", 0.5, "without the parse, which P3 includes"),
    ("P7", "P7", "curlj2", "the curl+jansson client on 2 threads, GET + parse of a search response, 8 concurrent",
     "P7", "anchor", "URLSession design", 10.0),
]


def swings(recs: Records, meta: Dict[str, Any], spread: float = 3.0) -> List[str]:
    """Rows whose anchor's fastest round ran at least `spread` times its
    slowest: there the status follows which of its modes the anchor's
    median fell in, so each is also compared with the anchor's best round."""
    out, seen = [], set()
    for pid, res_id, bench, anchor, aside, unit, goal, check, kind, *rest in ROWS:
        if kind != "ratio" or check is None or (res_id, aside) in seen:
            continue
        seen.add((res_id, aside))
        f = values(recs, fetchq_id(res_id), rest[0] if rest else "fetchq", RATE)
        a = values(recs, res_id, aside, RATE)
        if not f or not a or min(a) <= 0 or max(a) / min(a) < spread:
            continue
        fm, best = statistics.median(f), max(a)
        verdict = "meets" if check(fm / best) else "does not meet"
        bench = bench.format(**{k: f"{v:,}".replace(",", " ") if isinstance(v, int) else v
                                for k, v in meta.items()})
        out.append(f"- **{pid}, {bench}**: the anchor's rounds ran at {span(a)} {unit} "
                   f"({max(a) / min(a):.0f}× apart). Against its fastest round, fetchq's median is "
                   f"{fm / best:.2f}×, which {verdict} the goal ({goal}): this row's status depends on "
                   "which of the anchor's modes its median falls in.")
    return out


def ceilings(recs: Records) -> List[str]:
    lines = ["| goal | the least program doing the work | its rate (median) | vs the anchor | goal "
             "| can a bare program meet it here? | fetchq (better of default and inline) | fetchq / bare program |",
             "|---|---|---|---|---|---|---|---|"]
    for pid, fid, cside, what, aid, aside, aname, goal, *partial in CEILINGS:
        c = values(recs, fid, cside, RATE)
        a = values(recs, aid, aside, RATE)
        if not c or not a:
            continue
        cm, am = statistics.median(c), statistics.median(a)
        best = max(((statistics.median(v), side) for side in ("fetchq", "fetchq-inline")
                    for v in [values(recs, fid, side, RATE)] if v), default=None)
        reach = "yes" if cm / am >= goal else "**no**"
        fcells = (f"{fmt(best[0])} ({'inline' if best[1] == 'fetchq-inline' else 'default'})",
                  f"{best[0] / cm:.2f}×") if best else ("—", "—")
        if partial:  # a ceiling that skips part of the goal's work: no verdict, no comparison
            reach = f"{reach}, {partial[0]}"
            fcells = (fcells[0], "—")
        elif best and best[0] > cm and cm / am < goal:
            # fetchq itself is faster: this program is no bound, and its "no"
            # says only that its way of doing the work (json_loadb) falls short.
            reach = "not with this program; fetchq is faster than it, so it bounds nothing"
        lines.append(f"| {pid} | {what} | {fmt(cm)}/s ({span(c)}) | {cm / am:.2f}× {aname} | ≥ {goal:g}× | {reach} "
                     f"| {fcells[0]} | {fcells[1]} |")
    return lines


def latency(recs: Records) -> List[str]:
    lines = ["| run | queue wait p50 | queue wait p99 | request total p50 | request total p99 "
             "| submit→callback p50 | submit→callback p99 |", "|---|---|---|---|---|---|---|"]
    for id_, label in (("P2l-c8", "P2, 8 concurrent, all submitted at once"),
                       ("P2l-c64", "P2, 64 concurrent, all submitted at once"),
                       ("P2w-c8", "P2, 8 concurrent, at most 16 in the engine"),
                       ("P2w-c64", "P2, 64 concurrent, at most 128 in the engine"),
                       ("P7l", "P7 searches, 8 concurrent, all submitted at once")):
        rs = [r["result"]["latency"] for r in recs if r["id"] == id_ and r["side"] == "fetchq"
              and r.get("result") and r["result"].get("latency")]
        if not rs:
            continue
        cells = []
        for metric in ("queue_wait_ms", "total_ms", "callback_ms"):
            for p in ("p50", "p99"):
                cells.append(fmt(statistics.median(x[metric][p] for x in rs), "ms"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def commands(recs: Records, root: str) -> List[str]:
    seen, out = set(), []
    for r in recs:
        key = (r["id"], r["side"])
        if key in seen:
            continue
        seen.add(key)
        cmd = r["cmd"].replace(root + "/", "")
        cmd = re.sub(r"/tmp/fetchq-bench\.\w+", "$TMP", cmd)
        cmd = re.sub(r"http://127\.0\.0\.1:\d+", "http://127.0.0.1:$PORT", cmd)
        out.append(f"| {r['id']} | {r['side']} | `{cmd}` |")
    return ["| id | side | command (one round) |", "|---|---|---|"] + out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--meta", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    with open(a.results) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    with open(a.meta) as f:
        meta = json.load(f)
    meta.setdefault("p4_httpx_n", meta.get("p4_n"))  # runs before it had its own N

    rows, problems = table(recs, meta)
    chain1m = values(recs, "P1-chain-1M", "fetchq", RATE)
    md: List[str] = []
    w = md.append
    w("# fetchq benchmarks")
    w("")
    ran = datetime.datetime.fromtimestamp(os.path.getmtime(a.meta))
    # The knobs that differ from bench/run.sh's defaults are part of the command.
    defaults = {"pairs": 3, "p1_n": 1000000, "p1_chain_n": 20000, "p2_n": 50000, "p4_n": 50000,
                "p4_httpx_n": 10000}
    knobs = " ".join(f"{k.upper()}={meta[k]}" for k, v in defaults.items() if k in meta and meta[k] != v)
    command = f"{knobs} make bench" if knobs else "make bench"
    w(f"Generated by `{command}`, run finished {ran.strftime('%Y-%m-%d %H:%M')} "
      f"({meta['seconds'] // 60} min {meta['seconds'] % 60} s). Do not edit by hand: "
      "`bench/run.sh` runs everything and `bench/report.py` writes this file; the analysis at the end "
      "is `bench/findings.md`. `make bench` also keeps the run's raw records beside it, "
      "`bench/results/results.jsonl` and `bench/results/meta.json`, from which every figure here "
      "can be recomputed.")
    w("")
    w("## Results")
    w("")
    w(f"Each benchmark ran as {meta['pairs']} rounds of alternating runs (anchor, fetchq, anchor, fetchq, …, "
      "each round's runs in the order below in odd rounds and in reverse in even ones; "
      "P2/P3 as curl+jansson, wrk, fetchq, fetchq inline, then the 2-thread client with and without the "
      "parse (below), and fetchq's two latency runs, all at once and with at most 2C requests in the engine; "
      "P4 as aiohttp, httpx, fetchq; P7 as URLSession, "
      "curl+jansson on 1 and 2 threads, fetchq, fetchq inline, and fetchq's latency run), so slow phases of this shared "
      "machine hit both sides. Medians of the rounds; the ratio is fetchq's median over the anchor's "
      "(higher is better for fetchq); min–max over the rounds. The last column divides each round's "
      "fetchq run by the same round's anchor run and counts the rounds whose own ratio meets the goal: "
      "how far a status stands from the goal on this machine, where a row's rounds spread widely. "
      "P2 and P7 run fetchq twice: with the "
      "default config (callbacks on the delivery thread) and with config `\"delivery\": \"inline\"` "
      "(callbacks still one at a time and in order, but run by the worker that ended the operation "
      "when nothing else is being delivered: one thread hand-off less per operation; `include/fetchq.h`).")
    w("")
    md.extend(rows)
    w("")
    swung = swings(recs, meta)
    if swung:
        w("Anchors whose rounds ran at very different rates:")
        w("")
        md.extend(swung)
        w("")
    if chain1m:
        w(f"P1 with a chain of {meta['p1_n']:,} dependencies (fetchq only; the anchor cannot run it, "
          f"see Findings): {fmt(chain1m[0])} ops/s.")
        w("")
    parse = values(recs, "parse", "info", lambda r: r["us_per_parse"])
    parse_s = values(recs, "parse-search", "info", lambda r: r["us_per_parse"])
    build = values(recs, "parse", "info", lambda r: r.get("us_per_build"))
    build_s = values(recs, "parse-search", "info", lambda r: r.get("us_per_build"))
    if parse:
        w(f"jansson alone (`bench/jansson_parse.c`, CPU time of `json_loadb` + `json_decref`): "
          f"{parse[0]:.1f} µs for the {meta['doc_bytes']}-byte document of P2–P4, i.e. at most "
          f"{1e6 / parse[0]:,.0f} parses per second per core"
          + (f"; {parse_s[0]:.1f} µs for a P7 search response ({1e6 / parse_s[0]:,.0f} per core)" if parse_s else "")
          + ". The machine has 2 cores, shared with nginx.")
        if build and build[0] is not None:
            w("")
            w(f"fetchq builds the same jansson values without `json_loadb` (`fqs_json_build`, what the engine "
              f"runs for a valid body; Findings, Fifteenth round): {build[0]:.1f} µs for the document of P2–P4"
              + (f", {build_s[0]:.1f} µs for a P7 search response" if build_s and build_s[0] is not None else "")
              + " (same program, same CPU-time measure; it checks that both give equal values).")
        w("")
    ceiling_rows = ceilings(recs)
    if len(ceiling_rows) > 2:
        w("### What this machine allows: the least program doing each unmet goal's work")
        w("")
        w("Run in the same rounds as the table above. Where even a bare program — no queue features, "
          "nothing but the benchmark's own work — stays below a goal on these 2 cores while fetchq stays "
          "below that program, the goal is beyond this machine for a client that does the work that "
          "program's way; where it reaches the goal, the gap is fetchq's own work per operation (Findings, "
          "Eighth round). The curl+jansson programs parse with `json_loadb`: where fetchq, which builds the "
          "same values with its own scan, is faster than such a program, that program is no ceiling, and "
          "the row says so instead of a verdict.")
        w("")
        md.extend(ceiling_rows)
        w("")
    if problems:
        w("Runs that failed (they count as missing, not as numbers):")
        w("")
        for p in problems:
            w(f"- {p}")
        w("")
    w("### Latency from the engine's own metrics")
    w("")
    w("These come from runs of their own, in every round (`FQ_BENCH_LATENCY=1`): there each "
      "completion callback also reads its result's metrics, which costs fetchq about 5 % of P7's "
      "rate, so the rate runs of the tables above read none, like the anchors "
      "(bench/findings.md, Seventeenth round). "
      "Medians over the rounds of each run's percentiles. *queue wait* and *request total* are the "
      "`queue_wait_ms` and `total_ms` of `fq_result_metrics` (total = libcurl's TOTAL_TIME of the "
      "transfer); *submit→callback* is measured by `bench/fq_bench.c` from the submit call to the "
      "completion callback. When all operations are submitted at once, queue wait is the backlog: its "
      "p50 is about half the run's length by construction. The *at most 2C in the engine* rows "
      "(`FQ_BENCH_WINDOW`: each callback submits the next request) show steady-state latency; "
      "their rates were " + ", ".join(
          f"{fmt(statistics.median(v))} req/s ({c} concurrent)" for c in (8, 64)
          for v in [values(recs, f"P2w-c{c}", "fetchq", RATE)] if v) + ".")
    w("")
    md.extend(latency(recs))
    w("")
    w("## Machine")
    w("")
    w("| | |")
    w("|---|---|")
    for k, v in machine():
        w(f"| {k} | {v} |")
    w(f"| load average (1, 5, 15 min) | {meta['load_start']} at the start, {meta['load_end']} at the end |")
    w("")
    w("The machine is shared: other jobs (compilers, test suites) ran during the benchmarks; the load "
      "average above shows how busy it was. Client, server and the other jobs share the same CPUs.")
    w("")
    w("## Versions")
    w("")
    w("| | |")
    w("|---|---|")
    for k, v in versions(root, meta):
        w(f"| {k} | {v} |")
    w("")
    w("## Method and commands")
    w("")
    w("Run with `make bench` (= `make lib` in release mode, then `bash bench/run.sh`). "
      f"nginx ({meta['nginx_workers']} worker, `bench/nginx.conf.in`, access log off, keep-alive) serves "
      f"a generated {meta['doc_bytes']}-byte JSON document (`bench/gen_data.py`) at `/doc.json` and "
      f"{meta['p7_n']:,} search responses (10 items each) at `/s/qN ü.json` on 127.0.0.1 (queries `qN ü`: a space and a non-ASCII letter, "
      "percent-encoded into the path by each client).")
    w("")
    w("- **P1**: fetchq: `fq_submit_block` with a no-op body and a completion callback that counts, "
      "queue max_concurrent 2, timed from the first submit until `fq_queue_wait` returns. Anchor: "
      "`BlockOperation`s on an `OperationQueue` with maxConcurrentOperationCount 2, until "
      "`waitUntilAllOperationsAreFinished` returns. Priorities cycle over the 5 levels "
      "(`queuePriority` / `\"priority\"`); the chain makes every op depend on the previous one "
      f"(`addDependency` / `\"depends_on\"`) and runs {meta['p1_chain_n']:,} ops on both sides: "
      "OperationQueue on Linux slows down superlinearly with a chain and cannot release a 1M-long one "
      "(Findings, F1).")
    w("- **P2/P3**: every request has its own URL (`/doc.json?i=N`; nginx serves the static file "
      "whatever the query) and fetchq runs with `\"coalesce\": false`, so the server answers every "
      "request. fetchq: all N submitted to a queue of max_concurrent C with `\"parse\": \"json\"`, "
      "engine `max_per_host` C; the callback checks the parsed value and reads nothing else (the "
      "latency runs also read its metrics: `FQ_BENCH_LATENCY=1`). Anchor: `bench/curl_jansson_client.c`, "
      "one multi handle and C reused easy handles, `json_loadb` on every body. wrk runs "
      f"{meta['wrk_seconds']} s per round with `-t2 -cC` on one URL and does not parse.")
    w("- **P4**: `bench/py_bench.py`: fetchq through `bindings/python` (`AsyncEngine`, poll delivery on "
      "the asyncio loop), all N submitted at once with `parse=\"json\"`, each response checked by a done-callback "
      "as it completes (`json()`) and then dropped (holding all N parsed "
      "responses to the end costs about 50 µs per response in Python's cyclic GC: Findings, Fifth round). "
      "The binding submits requests with `\"lazy_parse\"` and `\"marshal\"`: the engine's transfer "
      "thread checks every body as JSON (invalid JSON fails the request), builds no jansson value, and "
      "writes the value in Python's marshal format, which `json()` reads with "
      "`PyMarshal_ReadObjectFromString` on the asyncio thread — the JSON text is scanned on the "
      "transfer thread, not on the loop's (Findings, Sixth and Nineteenth rounds); the aiohttp and "
      "httpx clients run `json.loads` on the loop's thread. An `AsyncEngine` "
      "runs one transfer thread unless told otherwise (Findings, Seventh round). aiohttp and httpx with C worker coroutines sharing one "
      f"client limited to C connections, `response.json()` each. Every client's module is imported before the "
      f"clock starts; creating the engine or session is timed. N = {meta['p4_n']:,} for fetchq and "
      f"aiohttp, {meta['p4_httpx_n']:,} for httpx, to keep `make bench` within its time budget: httpx "
      "does 500–2 000 req/s here, so 50 000 requests would take up to 100 s per run.")
    w("- **P5**: RSS from `/proc/self/statm` after a warm-up, before and after submitting the ops "
      "to a suspended queue; (after − before) / N.")
    w("- **P6**: a suspended queue holding N ops; from `fq_queue_cancel_all` until `fq_queue_wait` "
      "returns, i.e. every callback (outcome CANCELLED, checked) has run.")
    w("- **P7**: fetchq: `fq_submit_search` with the engine's search config (results pointer "
      "`/results`, sort by `/score` desc), queue max_concurrent 8; the callback checks the value "
      "(the latency run also reads its metrics). Anchor (`bench/anchors`): an "
      "asynchronous `Operation` per search on an `OperationQueue` (max 8) starting a `URLSession` "
      "data task (httpMaximumConnectionsPerHost 8, no URL cache), parsing with `JSONSerialization`, "
      "extracting and sorting the results by score before finishing.")
    w("- **Ceilings** (not anchors, no goal): `bench/bare_queue.c` runs P1 plain's N no-op tasks on a "
      "mutex, a condition variable, a FIFO of malloc'd tasks and 2 threads, each task counting as the "
      "anchor's block does. `curl_jansson_client ... 2` is the P2 anchor split over 2 threads, each with its own "
      "multi handle and half the connections; for P7 it fetches one search response (`/s/q1%20%C3%BC.json?i=N`) "
      "like the P7+ row. `curl_jansson_client ... - 2` is the same without the parse (a 200 with a body "
      "counts): the most a libcurl client gets from these 2 cores, whatever it does with the body.")
    w("")
    md.extend(commands(recs, root))
    w("")
    notes = os.path.join(root, "bench/findings.md")
    if os.path.exists(notes):
        w(open(notes).read().rstrip())
        w("")
    with open(a.out, "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()
