"""bench/report.py names the commit that was measured, not the one the
report happened to be regenerated at."""
import importlib.util
import os
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("bench_report", os.path.join(ROOT, "bench", "report.py"))
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

HEAD = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                      capture_output=True, text=True, check=True).stdout.strip()


def fetchq_line(meta):
    return dict(report.versions(ROOT, meta))["fetchq"]


def test_the_measured_commit_is_named_when_the_report_is_regenerated_later():
    line = fetchq_line({"commit": "abc1234", "dirty": False})
    assert f"(commit abc1234; this report was regenerated from its results at {HEAD})" in line


def test_the_head_commit_alone_when_it_was_measured():
    line = fetchq_line({"commit": HEAD, "dirty": False})
    assert line.endswith(f"(commit {HEAD})")


def test_uncommitted_changes_at_measuring_time_are_said():
    line = fetchq_line({"commit": "abc1234", "dirty": True})
    assert "(commit abc1234, with uncommitted changes in Sources/ or include/; this report was regenerated" in line


def test_results_from_before_the_commit_was_recorded_fall_back_to_head():
    line = fetchq_line({})
    assert f"(commit {HEAD}" in line


def _rec(id_, side, rate):
    return {"id": id_, "side": side, "result": {"rate": rate}}


def test_a_ceiling_that_skips_the_parse_gives_no_verdict_on_the_goal():
    # P3 at 8 concurrent: wrk 100 k; the parsing client 25 k (0.25x: no);
    # the GET-only client 60 k (0.6x: above the goal, but not P3's work).
    recs = [_rec("P3-c8", "anchor", 100_000), _rec("P2-c8", "curlj2", 25_000),
            _rec("P2-c8", "curlget2", 60_000), _rec("P2-c8", "fetchq", 27_000)]
    rows = [line for line in report.ceilings(recs) if line.startswith("| P3 ")]
    assert len(rows) == 2
    parse, get_only = rows
    assert "0.25× wrk" in parse and "| not with this program; fetchq is faster than it" in parse
    assert parse.endswith("| 1.08× |")
    assert "0.60× wrk" in get_only and "| yes, without the parse, which P3 includes |" in get_only
    assert get_only.endswith("| — |")


def _lat(id_, wait50, total50, cb50):
    lat = {"queue_wait_ms": {"p50": wait50, "p99": wait50 * 2}, "total_ms": {"p50": total50, "p99": total50 * 2},
           "callback_ms": {"p50": cb50, "p99": cb50 * 2}}
    return {"id": id_, "side": "fetchq", "result": {"rate": 1000.0, "latency": lat}}


def test_latency_rows_come_from_the_latency_runs_not_the_rate_runs():
    # The rate runs (P2-c8, P7) read no metrics: "latency" is null there.
    recs = [{"id": "P2-c8", "side": "fetchq", "result": {"rate": 20_000.0, "latency": None}},
            {"id": "P7", "side": "fetchq", "result": {"rate": 30_000.0, "latency": None}},
            _lat("P2l-c8", 1.0, 0.25, 2.0), _lat("P2l-c8", 3.0, 0.75, 4.0), _lat("P2l-c8", 2.0, 0.5, 3.0),
            _lat("P7l", 40.0, 0.5, 41.0)]
    lines = report.latency(recs)
    assert lines[2] == ("| P2, 8 concurrent, all submitted at once | 2.0 ms | 4.0 ms | 0.50 ms | 1.0 ms "
                        "| 3.0 ms | 6.0 ms |")
    assert lines[3].startswith("| P7 searches, 8 concurrent, all submitted at once | 40.0 ms | 80.0 ms |")
    assert len(lines) == 4  # no row for the runs that read nothing


def test_latency_has_no_rows_when_only_rate_runs_are_recorded():
    recs = [{"id": "P2-c8", "side": "fetchq", "result": {"rate": 20_000.0, "latency": None}}]
    assert len(report.latency(recs)) == 2


def _round(id_, side, rnd, result):
    return {"id": id_, "side": side, "round": rnd, "result": result}


def test_the_per_round_column_pairs_each_round_with_its_own_anchor_run():
    # P7 by default: medians 26.5 k over 2.9 k (9.14x, not met); by round
    # 30/2.5 = 12x (met), 28/2.9 = 9.66x, 20/3.0 = 6.67x; round 4 has no
    # anchor run: in the median, not in the per-round column. P6: two of
    # three rounds within 100 ms.
    recs = [_round("P7", "anchor", 1, {"rate": 2500.0}), _round("P7", "fetchq", 1, {"rate": 30000.0}),
            _round("P7", "anchor", 2, {"rate": 2900.0}), _round("P7", "fetchq", 2, {"rate": 28000.0}),
            _round("P7", "anchor", 3, {"rate": 3000.0}), _round("P7", "fetchq", 3, {"rate": 20000.0}),
            _round("P7", "fetchq", 4, {"rate": 25000.0}),
            _round("P6", "fetchq", 1, {"ms": 40.0}), _round("P6", "fetchq", 2, {"ms": 120.0}),
            _round("P6", "fetchq", 3, {"ms": 60.0})]
    meta = {"p1_n": 1000000, "p1_chain_n": 20000, "p2_n": 50000, "p4_n": 50000, "p4_httpx_n": 10000, "p5_n": 100000,
            "p6_n": 100000, "p7_n": 5000}
    rows, _ = report.table(recs, meta)
    p7 = next(line for line in rows if line.startswith("| P7 | 5 000 searches"))
    assert p7.endswith("| 6.67–12.00×, 1 of 3 |")
    assert "| not met — see Findings |" in p7
    p6 = next(line for line in rows if line.startswith("| P6 "))
    assert p6.endswith("| 2 of 3 |") and "| **met** |" in p6
    # A row without an anchor run in any round: no per-round figure.
    p1 = next(line for line in rows if "no-op ops, queue max 2" in line)
    assert p1.endswith("| — |")


def test_a_ceiling_that_fetchq_does_not_reach_keeps_its_verdict():
    recs = [_rec("P3-c8", "anchor", 100_000), _rec("P2-c8", "curlj2", 25_000), _rec("P2-c8", "fetchq", 20_000)]
    rows = [line for line in report.ceilings(recs) if line.startswith("| P3 ")]
    assert len(rows) == 1 and "| **no** |" in rows[0] and rows[0].endswith("| 0.80× |")


def test_an_anchor_with_two_modes_is_also_compared_with_its_fastest_round():
    # P1's chain: the anchor at 5 k, 6 k and 150 k (30x apart), fetchq at
    # 1 M: 166x its median, 6.67x its fastest round (goal 10x: not met).
    # P7's anchor stays within 3x: no line for it.
    recs = [_round("P1-chain", "anchor", 1, {"rate": 5000.0}), _round("P1-chain", "anchor", 2, {"rate": 6000.0}),
            _round("P1-chain", "anchor", 3, {"rate": 150000.0}),
            _round("P1-chain", "fetchq", 1, {"rate": 1e6}), _round("P1-chain", "fetchq", 2, {"rate": 1e6}),
            _round("P1-chain", "fetchq", 3, {"rate": 1e6}),
            _round("P7", "anchor", 1, {"rate": 2500.0}), _round("P7", "anchor", 2, {"rate": 3000.0}),
            _round("P7", "fetchq", 1, {"rate": 30000.0}), _round("P7", "fetchq", 2, {"rate": 28000.0})]
    meta = {"p1_n": 1000000, "p1_chain_n": 20000, "p2_n": 50000, "p4_n": 50000, "p4_httpx_n": 10000, "p5_n": 100000,
            "p6_n": 100000, "p7_n": 5000}
    lines = report.swings(recs, meta)
    assert len(lines) == 1
    assert lines[0].startswith("- **P1, 20 000 no-op ops, max 2, a chain of dependencies**: "
                               "the anchor's rounds ran at 5,000–150,000 ops/s (30× apart).")
    assert "fetchq's median is 6.67×, which does not meet the goal (≥ 10×)" in lines[0]
