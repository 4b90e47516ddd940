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
