"""Deterministic search corpora for the fetchq test server.

Two corpora, both built from a fixed seed so every run (and every suite) sees
exactly the same items:

* ``test``  -- 80 items, 8 tags, most items carry 2-3 tags so that merging the
  results of several queries has duplicates to remove.  Texts never contain a
  tag name as a word, so ``/search?q=<tag>`` and ``/corpus?tag=<tag>`` select
  the same items.
* ``demo``  -- 400 items that read like real posts: varied authors, sentences
  that mention their topics, dates spread over two years, 15 tags.

Every item has the shape::

    {"id": "q-0001", "author": "...", "text": "...",
     "created_at": "2026-03-01T12:00:00Z", "tags": ["swift", "c"]}

``created_at`` values are distinct within a corpus and corpus order is *not*
date order, so a client that sorts by date is actually tested.
"""

from __future__ import annotations

import random
import re
from datetime import datetime, timedelta, timezone

TEST_TAGS = ("swift", "c", "python", "rust", "go", "json", "http", "queue")

DEMO_TAGS = (
    "swift", "c", "python", "rust", "go", "json", "http", "queue",
    "linux", "database", "testing", "performance", "security",
    "concurrency", "networking",
)

_TEST_SEED = 20260301
_DEMO_SEED = 20240301


def _iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def word_pattern(query: str) -> "re.Pattern[str]":
    """Regex that finds ``query`` (already lower-cased) as a whole word or phrase.

    A match may not be preceded or followed by a letter or digit, so ``go``
    matches "go" and "go," but not "good"; ``c`` matches "C" but not "cache".
    """
    return re.compile(r"(?<![0-9a-z])" + re.escape(query) + r"(?![0-9a-z])")


def matches(item: dict, query_lower: str) -> bool:
    """The search rule: the query equals a tag, or appears as a word in the text."""
    if not query_lower:
        return False
    if query_lower in item["tags"]:
        return True
    return word_pattern(query_lower).search(item["text"].lower()) is not None


# --------------------------------------------------------------------------
# test corpus

_TEST_AUTHORS = (
    "ada", "brian", "carol", "dmitri", "erin", "farah", "gus", "hana",
    "jürgen", "kofi",
)
_TEST_SUBJECTS = (
    "parser", "cache", "scheduler", "buffer", "socket", "thread pool",
    "timer", "allocator", "stream", "retry budget", "event loop", "decoder",
)
_TEST_ACTIONS = (
    "measured", "rewrote", "profiled", "simplified", "documented", "fixed",
    "benchmarked", "reviewed", "refactored", "tested",
)
_TEST_DETAILS = (
    "latency dropped by half",
    "no more leaks under load",
    "the edge cases are covered now",
    "throughput is steady at peak",
    "the API reads better",
    "errors carry a message",
    "cancellation works end to end",
    "memory stays flat",
)


def _build_test() -> list[dict]:
    rng = random.Random(_TEST_SEED)
    n = 80
    base = datetime(2026, 3, 1, 0, 0, 0, tzinfo=timezone.utc)
    minutes = list(range(n))
    rng.shuffle(minutes)
    items = []
    for i in range(n):
        k = rng.choices((1, 2, 3), weights=(25, 45, 30))[0]
        # Rotate the first tag so every tag is well represented.
        first = TEST_TAGS[i % len(TEST_TAGS)]
        others = [t for t in TEST_TAGS if t != first]
        tags = [first] + rng.sample(others, k - 1)
        text = "{} the {}: {} (note {}).".format(
            rng.choice(_TEST_ACTIONS).capitalize(),
            rng.choice(_TEST_SUBJECTS),
            rng.choice(_TEST_DETAILS),
            i + 1,
        )
        items.append({
            "id": "q-%04d" % (i + 1),
            "author": rng.choice(_TEST_AUTHORS),
            "text": text,
            "created_at": _iso(base + timedelta(minutes=37 * minutes[i], seconds=i)),
            "tags": tags,
        })
    # The property tests rely on: a tag name never appears as a word in a text.
    for item in items:
        low = item["text"].lower()
        for tag in TEST_TAGS:
            assert word_pattern(tag).search(low) is None, (tag, item["text"])
    return items


# --------------------------------------------------------------------------
# demo corpus

_DEMO_FIRST = (
    "Alice", "Bogdan", "Chiara", "Deepak", "Elena", "Femi", "Greta", "Hiro",
    "Ines", "José", "Katya", "Liam", "Mei", "Nadia", "Oscar", "Priya",
    "Quentin", "Rosa", "Sven", "Tomás", "Uma", "Viktor", "Wen", "Yusuf", "Zoë",
)
_DEMO_LAST = (
    "Novak", "Okafor", "Lindqvist", "Tanaka", "García", "Müller", "Rossi",
    "Kowalski", "Haddad", "Nguyen", "Ibrahim", "Schmidt", "Silva", "Chen",
)

# Per tag: phrases that read naturally in a sentence about that topic.
_DEMO_TOPICS = {
    "swift": ("Swift concurrency checks", "a Swift package", "Swift 6 strict mode",
              "the Swift toolchain on Linux"),
    "c": ("the C API", "a C header", "C callbacks", "a small C harness"),
    "python": ("the Python bindings", "a Python script", "pytest fixtures",
               "Python asyncio code"),
    "rust": ("a Rust crate", "Rust lifetimes", "the Rust port", "cargo builds"),
    "go": ("a Go service", "Go channels", "the Go client", "goroutines in Go"),
    "json": ("JSON parsing", "a JSON schema", "JSON Pointer lookups",
             "streaming JSON"),
    "http": ("HTTP keep-alive", "HTTP/2 multiplexing", "HTTP redirects",
             "an HTTP cache"),
    "queue": ("the operation queue", "a work queue", "queue priorities",
              "queue back-pressure"),
    "linux": ("Linux epoll", "a Linux container", "the Linux scheduler",
              "Linux perf"),
    "database": ("a database migration", "SQLite indexes", "database upserts",
                 "the database pool"),
    "testing": ("the test suite", "fuzz testing", "flaky tests",
                "integration testing"),
    "performance": ("tail latency", "allocation counts", "a flame graph",
                    "throughput numbers"),
    "security": ("TLS verification", "credential handling", "input validation",
                 "a security review"),
    "concurrency": ("lock contention", "data races", "a thread pool",
                    "async cancellation"),
    "networking": ("connection reuse", "DNS timeouts", "socket buffers",
                   "proxy settings"),
}

_DEMO_TEMPLATES = (
    "Spent the morning on {a}; turns out {b} was the real bottleneck.",
    "Finally shipped {a}. Next up: {b}.",
    "Hot take: {a} matters more than {b} for most teams.",
    "Notes from today's review of {a} and {b}.",
    "TIL how {a} interacts with {b}. Surprising!",
    "Wrote up a short guide to {a}, with a section on {b}.",
    "Benchmarked {a} against {b}: numbers in the thread.",
    "Bug of the week: {a} broke under load because of {b}.",
    "Pairing session on {a}. We also cleaned up {b}.",
    "Is anyone else seeing odd behaviour with {a} after upgrading {b}?",
    "Small win: {a} is now twice as fast thanks to {b}.",
    "Reading list for the weekend: {a}, {b}, and a good novel.",
)


def _build_demo() -> list[dict]:
    rng = random.Random(_DEMO_SEED)
    n = 400
    authors = sorted({"%s %s" % (rng.choice(_DEMO_FIRST), rng.choice(_DEMO_LAST))
                      for _ in range(60)})
    handles = {a: re.sub(r"[^a-z]", "", a.split()[0].lower()
                         .replace("é", "e").replace("á", "a").replace("ë", "e")
                         .replace("ü", "u")) + "_" + str(rng.randrange(10, 99))
               for a in authors}
    base = datetime(2024, 3, 1, 0, 0, 0, tzinfo=timezone.utc)
    span = 2 * 365 * 24 * 3600
    offsets = rng.sample(range(span), n)  # distinct seconds, random order
    items = []
    for i in range(n):
        k = rng.choices((1, 2, 3), weights=(30, 45, 25))[0]
        tags = rng.sample(DEMO_TAGS, k)
        a = rng.choice(_DEMO_TOPICS[tags[0]])
        b = rng.choice(_DEMO_TOPICS[tags[-1]] if k > 1 else _DEMO_TOPICS[tags[0]])
        if a == b:
            b = "the docs"
        text = rng.choice(_DEMO_TEMPLATES).format(a=a, b=b)
        author = rng.choice(authors)
        items.append({
            "id": "q-%04d" % (i + 1),
            "author": "%s (@%s)" % (author, handles[author]),
            "text": text,
            "created_at": _iso(base + timedelta(seconds=offsets[i])),
            "tags": tags,
        })
    return items


_CACHE: dict[str, list[dict]] = {}


def build(name: str) -> list[dict]:
    """Return the corpus ``name`` ("test" or "demo"); same list on every call."""
    if name not in _CACHE:
        if name == "test":
            _CACHE[name] = _build_test()
        elif name == "demo":
            _CACHE[name] = _build_demo()
        else:
            raise ValueError("unknown corpus %r (expected 'test' or 'demo')" % name)
    return _CACHE[name]


if __name__ == "__main__":  # pragma: no cover - handy for a quick look
    import json
    import sys

    which = sys.argv[1] if len(sys.argv) > 1 else "test"
    json.dump(build(which), sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")
