"""examples/search.py against the demo corpus."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import BINDING, REPO, Server, needs_network

EXAMPLE = REPO / "examples" / "search.py"


@needs_network
def test_search_example(demo_server: Server) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(BINDING)
    out = subprocess.run([sys.executable, str(EXAMPLE), demo_server.base, "swift", "rust", "swift"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    counts = {tag: len(demo_server.get_json("/corpus?tag=" + tag)["results"]) for tag in ("swift", "rust")}
    ids = {i["id"] for tag in counts for i in demo_server.get_json("/corpus?tag=" + tag)["results"]}
    for tag, n in counts.items():
        assert re.search(r"^\s+%s\s+%d results$" % (tag, n), out.stdout, re.M), out.stdout
    assert "%d distinct posts for 3 tags" % len(ids) in out.stdout
    dates = re.findall(r"^  (\d{4}-\d{2}-\d{2})  ", out.stdout, re.M)
    assert len(dates) == 10 and dates == sorted(dates, reverse=True)


def test_search_example_usage() -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "BASE_URL" in out.stderr
