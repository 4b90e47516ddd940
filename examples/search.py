#!/usr/bin/env python3
"""Search a few tags at once and print the merged, de-duplicated results.

    python3 examples/search.py BASE_URL [TAG...]

BASE_URL is a server with the demo search API, e.g. the test server started
with `python3 Tests/support/testserver.py --corpus demo` (or `make demo`).
The binding is found in bindings/python when it is not installed, and the
library through FETCHQ_LIBRARY, a copy inside the package, or the system.
"""

from __future__ import annotations

import os
import sys

try:
    import fetchq
except ImportError:  # running from a checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
    import fetchq

DEFAULT_TAGS = ["swift", "rust", "go"]
SHOW = 10


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    base = argv[1].rstrip("/")
    tags = argv[2:] or DEFAULT_TAGS

    search = {
        "url": base + "/search?q={query}&rpp=100",
        "results": "/results",   # JSON Pointer to the results array
        "id": "/id",             # de-duplicate merged results by this
        "sort": "/created_at",   # newest first
        "order": "desc",
    }
    with fetchq.Engine(search=search, timeout_ms=10_000) as engine:
        queue = engine.queue("search", max_concurrent=4)

        def on_child(child: fetchq.Result) -> None:
            if child.ok:
                print("  %-14s %3d results" % (child.query, child.value["count"]))
            else:
                print("  %-14s failed: %s" % (child.query, child.error))

        print("searching %s at %s" % (", ".join(tags), base))
        try:
            merged = queue.search_all(tags, on_child=on_child).result(timeout=30)
        except fetchq.FetchqError as exc:
            print("search failed: %s" % exc, file=sys.stderr)
            return 1

    failed = {q: r for q, r in merged["queries"].items() if "error" in r}
    print("\n%d distinct posts for %d tags (newest first):" % (merged["count"], len(tags)))
    for item in merged["items"][:SHOW]:
        text = item.get("text", "").replace("\n", " ")
        if len(text) > 60:
            text = text[:57] + "..."
        print("  %s  %-28.28s %s" % (item.get("created_at", "?")[:10], item.get("author", "?"), text))
    if merged["count"] > SHOW:
        print("  ... and %d more" % (merged["count"] - SHOW))
    return 1 if failed and len(failed) == len(set(tags)) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
