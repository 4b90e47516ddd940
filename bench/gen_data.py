#!/usr/bin/env python3
"""Writes the documents nginx serves for the benchmarks into DIR:

  DIR/doc.json        the P2-P4 document: a JSON object of about 3 KB
                      ({"id", "kind", "items": [...], "next"})
  DIR/s/qN ü.json     one search response per query "q0 ü" .. "q{N-1} ü" for P7
                      (a space and a non-ASCII letter: every client must
                      percent-encode the query into the URL's path):
                      {"query", "results": [10 items {id, title, score, date,
                      tags}]}, ids overlapping between queries

Deterministic (seeded), so every run serves the same bytes.
"""
import json
import os
import random
import sys


def doc(rng: random.Random) -> dict:
    items = []
    d = {"id": 1, "kind": "listing", "items": items, "next": None}
    i = 0
    while len(json.dumps(d, separators=(",", ":"))) < 3000:
        i += 1
        items.append({"id": i, "name": f"item-{i}", "price": round(rng.uniform(1, 500), 2),
                      "in_stock": rng.random() < 0.7, "tags": rng.sample(["a", "b", "c", "d", "e", "f"], 2)})
    items.pop()
    d["next"] = f"/doc.json?after={i - 1}"
    return d


def search(rng: random.Random, q: str) -> dict:
    results = []
    for _ in range(10):
        n = rng.randrange(1, 2000)
        results.append({"id": n, "title": f"post {n} about {q}", "score": round(rng.random() * 100, 3),
                        "date": f"2025-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
                        "tags": [q, rng.choice(["swift", "c", "json", "http"])]})
    return {"query": q, "results": results}


def query(k: int) -> str:
    """P7's k-th query (bench/fq_bench.c and bench/anchors write the same)."""
    return f"q{k} ü"


def main() -> None:
    out, n = sys.argv[1], int(sys.argv[2])
    rng = random.Random(9)
    os.makedirs(os.path.join(out, "s"), exist_ok=True)
    body = json.dumps(doc(rng), separators=(",", ":"))
    with open(os.path.join(out, "doc.json"), "w") as f:
        f.write(body)
    for k in range(n):
        q = query(k)
        with open(os.path.join(out, "s", q + ".json"), "w", encoding="utf-8") as f:
            json.dump(search(rng, q), f, separators=(",", ":"))
    print(len(body))


if __name__ == "__main__":
    main()
