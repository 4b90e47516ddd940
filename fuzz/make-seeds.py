#!/usr/bin/env python3
"""Regenerates the committed seed corpora under fuzz/corpus/ (run from anywhere):

    python3 fuzz/make-seeds.py

- config/: engine configurations and submit options covering every key documented
  in include/fetchq.h (valid and slightly wrong values), one JSON object per file;
- response/: response bodies of the shared test server (Tests/support/testserver.py),
  one per route that returns JSON (or pretends to);
- search/: "<results pointer>\\n<key pointer>\\n<body>" built from those bodies.

JSONTestSuite (../shared/data/JSONTestSuite/test_parsing) is not copied: `fuzz/run.sh`
passes it to libFuzzer as an extra seed directory. Standard library only."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

FUZZ = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(FUZZ)
CORPUS = os.path.join(FUZZ, "corpus")

CONFIGS = {
    "empty": {},
    "engine-all": {
        "delivery": "poll", "workers": 2, "aging_ms": 500, "history": 100, "max_per_host": 4,
        "connect_timeout_ms": 1000, "timeout_ms": 5000, "max_wait_ms": 100, "max_redirects": 3,
        "max_response_bytes": 1048576, "max_json_depth": 64, "verify_tls": False,
        "ca_file": "/etc/ssl/certs/ca-certificates.crt", "user_agent": "fuzz/1", "log": "error",
        "cache": {"max_bytes": 1048576, "path": "cache.sqlite"},
        "rate_limits": {"127.0.0.1:8080": {"per_second": 10, "burst": 5}, "*": {"per_second": 0.5}},
        "search": {"url": "http://127.0.0.1:9/search?q={query}&rpp=50", "results": "/results",
                   "id": "/id", "sort": "/created_at", "order": "asc"},
    },
    "engine-bad-types": {"workers": "2", "delivery": "push", "rate_limits": [1]},
    "engine-range": {"workers": 0, "history": -1, "max_per_host": 100000},
    "search-template-missing": {"search": {"url": "http://x/no-placeholder"}},
    "search-pointer-bad": {"search": {"url": "http://x/?q={query}", "results": "items", "sort": "/a~2"}},
    "common": {"priority": "high", "qos": "user-initiated", "group": "g1", "depends_on": [1, 2],
               "barrier": False, "max_wait_ms": 50},
    "common-int-priority": {"priority": -4, "qos": "background"},
    "request": {"method": "POST", "url": "http://127.0.0.1:9/echo?x=1#frag",
                "headers": {"X-A": "1", "Content-Type": "text/plain"},
                "query": {"q": "a b&c", "n": 3, "f": 1.5, "t": True}, "body": {"k": [1, 2]}},
    "request-bad-header": {"url": "http://h/", "headers": {"Bad Name": "v", "X": "a\r\nb"}},
    "request-ipv6": {"url": "https://user:pw@[::1]:8443/p", "method": "PURGE", "body": "text"},
    "request-options": {"parse": "json", "accept_status": [404, "5xx"], "progress": True,
                        "progress_interval_ms": 10, "coalesce": False, "timeout_ms": 100, "cache": "reload",
                        "retry": {"max": 2, "base": 0.01, "max_delay": 1, "on": [503, "network", "timeout"],
                                  "any_method": True}},
    "search-options": {"url": "http://127.0.0.1:9/s?q={query}", "results": "/results", "id": "/id",
                       "sort": "/created_at", "order": "desc", "max_json_depth": 32, "cache": "only-if-cached",
                       "store": {"path": "x.sqlite", "collection": "posts", "merge": "keep-local"}},
    "search-all-options": {"fail_fast": True, "child_events": True, "results": "/results",
                           "url": "http://127.0.0.1:9/s?q={query}", "priority": "very-low"},
    "unknown-key": {"workers": 1, "wrokers": 2},
}

ROUTES = [
    ("search-swift", "/search?q=swift&rpp=20"), ("search-empty", "/search?q="),
    ("search-notarray", "/search?q=__notarray"), ("search-bad", "/search?q=__bad"),
    ("search-fail", "/search?q=__fail"), ("corpus-tag-c", "/corpus?tag=c"),
    ("json-600", "/json?size=600"), ("json-0", "/json?size=0"), ("deep-40", "/deep?n=40"),
    ("deep-600", "/deep?n=600"), ("invalid-utf8", "/invalid-utf8"), ("gzip", "/gzip"),
    ("echo", "/echo?a=1"), ("status-404", "/status/404"), ("index", "/"),
    ("flaky", "/flaky?key=seed&fail=1"), ("etag", "/etag?key=seed"), ("file-y-string-utf8", "/file/y_string_utf8.json"),
]

SEARCH_POINTERS = {
    "search-swift": ("/results", "/created_at"), "corpus-tag-c": ("/results", "/id"),
    "json-600": ("/items", "/value"), "search-notarray": ("/results", "/x"),
    "deep-40": ("/0/0", "/0"), "echo": ("/headers", "/host"), "gzip": ("/items", "/name"),
}
EXTRA_SEARCH = {
    "mixed-types": ("/r", "/k", {"r": [{"k": 2}, {"k": 2.5}, {"k": "2"}, {"k": None}, {"k": True},
                                       {"k": [1]}, {"k": {}}, {}, {"k": -9223372036854775808},
                                       {"k": 9.3e18}, {"k": 1}, {"k": False}, 7]}),
    "escaped-pointer": ("/a~1b/m~0n", "/", {"a/b": {"m~n": [{"": 1}, {"": 1}, {"": "x"}]}}),
    "array-index": ("/0/items", "/id/0", [{"items": [{"id": [1]}, {"id": [1]}, {"id": [2, 1]}]}]),
}


def start_server():
    work = tempfile.mkdtemp(prefix="fetchq-seeds.")
    port_file = os.path.join(work, "port")
    files = os.path.join(os.path.dirname(ROOT), "shared", "data", "JSONTestSuite", "test_parsing")
    args = [sys.executable, os.path.join(ROOT, "Tests", "support", "testserver.py"), "--port", "0",
            "--parent-pid", str(os.getpid()), "--max-seconds", "120"]
    if os.path.isdir(files):
        args += ["--files", files]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE)
    port = int(proc.stdout.readline().split()[1])
    return proc, port, work


def fetch(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            body = r.read()
    except urllib.error.HTTPError as e:
        body = e.read()
    if path == "/gzip":
        import gzip
        body = gzip.decompress(body)  # what the transport hands to the parser
    return body


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    shutil.rmtree(CORPUS, ignore_errors=True)
    for name, obj in CONFIGS.items():
        write("config", name + ".json", json.dumps(obj, ensure_ascii=False).encode())
    proc, port, work = start_server()
    try:
        for name, path in ROUTES:
            body = fetch(port, path)
            write("response", name + ".json", body)
            results, key = SEARCH_POINTERS.get(name, ("", "/id"))
            write("search", name, f"{results}\n{key}\n".encode() + body)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    for name, (results, key, doc) in EXTRA_SEARCH.items():
        write("search", name, f"{results}\n{key}\n".encode() + json.dumps(doc).encode())
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(CORPUS) for f in fs)
    print(f"fuzz/corpus: {sum(len(fs) for _, _, fs in os.walk(CORPUS))} files, {total} bytes")


if __name__ == "__main__":
    main()
