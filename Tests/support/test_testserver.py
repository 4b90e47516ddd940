"""Tests for the fault-injecting test server (Tests/support/testserver.py).

Run:  python3 -m pytest -q Tests/support/test_testserver.py

The server runs as a subprocess; every check goes over a real socket with
http.client or raw sockets. Deadlines here only turn a hang into a failure.
"""

from __future__ import annotations

import contextlib
import email.utils
import gzip
import http.client
import json
import os
import re
import selectors
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from urllib.parse import quote

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "testserver.py")
# Beside the clone, as CI has it (README, "Set up"); a missing suite fails
# the tests that read it (test_the_suite_is_there), it is not a skip.
SUITE = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "data", "JSONTestSuite", "test_parsing"))
SUITE_DIR = SUITE if os.path.isdir(SUITE) else None

TIMEOUT = 10.0  # generous: only to fail instead of hang
TEST_TAGS = ["swift", "c", "python", "rust", "go", "json", "http", "queue"]
ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


# ----------------------------------------------------------------------------
# server process helpers


def _read_port_line(proc: subprocess.Popen, timeout: float = TIMEOUT) -> int:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise AssertionError("server printed nothing within %.0f s" % timeout)
        line = proc.stdout.readline().decode()
    finally:
        sel.close()
    m = re.fullmatch(r"PORT (\d+)\n", line)
    assert m, "unexpected first line: %r" % line
    return int(m.group(1))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
    if proc.stdout:
        proc.stdout.close()


@contextlib.contextmanager
def run_server(*extra: str, parent_pid: int | None = None):
    args = [sys.executable, SERVER, "--max-seconds", "300"]
    args += ["--parent-pid", str(parent_pid if parent_pid is not None else os.getpid())]
    args += list(extra)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE)
    try:
        port = _read_port_line(proc)
        yield proc, port
    finally:
        _stop(proc)


def wait_until(pred, timeout: float = TIMEOUT, step: float = 0.02):
    """Poll pred() until it returns a truthy value; bounded in time and count."""
    deadline = time.monotonic() + timeout
    value = None
    for _ in range(int(timeout / step) + 1):
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            break
        time.sleep(step)
    raise AssertionError("condition not met within %.0f s (last value %r)" % (timeout, value))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port_file = tmp_path_factory.mktemp("ts") / "port"
    extra = ["--port-file", str(port_file)]
    if SUITE_DIR:
        extra += ["--files", SUITE_DIR]
    with run_server(*extra) as (proc, port):
        yield {"proc": proc, "port": port, "port_file": port_file}


@pytest.fixture
def port(server):
    return server["port"]


# ----------------------------------------------------------------------------
# HTTP helpers


def request(port, path, method="GET", headers=None, body=None, host="127.0.0.1"):
    """One request on a fresh connection; returns (status, headers, body)."""
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def get_json(port, path, **kw):
    status, headers, body = request(port, path, **kw)
    assert headers.get("content-type") == "application/json", headers
    return status, json.loads(body)


def stats(port):
    return get_json(port, "/stats")[1]


def reset_stats(port):
    status, body = get_json(port, "/stats/reset", method="POST")
    assert status == 200 and body == {"reset": True}


def raw_connect(port) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    return s


def raw_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """Read until the end of the response head; returns (head, extra bytes)."""
    data = b""
    for _ in range(10000):
        i = data.find(b"\r\n\r\n")
        if i >= 0:
            return data[:i], data[i + 4:]
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError("EOF before end of head: %r" % data)
        data += chunk
    raise AssertionError("head too long")


def read_to_eof(sock: socket.socket, limit: int = 1 << 26) -> bytes:
    data = b""
    for _ in range(100000):
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
        assert len(data) <= limit
    raise AssertionError("no EOF")


def pattern(n: int) -> bytes:
    block = bytes(range(251)) * 4096
    return (block * (n // len(block) + 1))[:n]


# ----------------------------------------------------------------------------
# startup


def test_port_line_and_port_file(server):
    assert server["port_file"].read_text().strip() == str(server["port"])
    assert not [p for p in server["port_file"].parent.iterdir() if ".tmp" in p.name]


def test_unknown_path_is_404_json(port):
    status, body = get_json(port, "/no/such/route")
    assert status == 404 and body == {"error": "not found"}


# ----------------------------------------------------------------------------
# search and corpus


def test_corpus_shape(port):
    status, body = get_json(port, "/corpus")
    assert status == 200
    items = body["results"]
    assert body["count"] == len(items) == 80
    ids = [it["id"] for it in items]
    assert ids == ["q-%04d" % (i + 1) for i in range(80)]
    for it in items:
        assert set(it) == {"id", "author", "text", "created_at", "tags"}
        assert ISO.match(it["created_at"]), it
        assert it["tags"] and set(it["tags"]) <= set(TEST_TAGS)
        assert len(set(it["tags"])) == len(it["tags"])
    assert len({it["created_at"] for it in items}) == 80
    dates = [it["created_at"] for it in items]
    assert dates != sorted(dates) and dates != sorted(dates, reverse=True)
    multi = [it for it in items if len(it["tags"]) >= 2]
    assert len(multi) >= 40
    assert {t for it in items for t in it["tags"]} == set(TEST_TAGS)


def test_search_by_tag_matches_corpus_by_tag(port):
    for tag in TEST_TAGS:
        _, s = get_json(port, "/search?q=%s&rpp=500" % tag)
        _, c = get_json(port, "/corpus?tag=%s" % tag)
        assert s["query"] == tag
        assert s["results"] == c["results"], tag
        assert len(c["results"]) >= 10
        assert all(tag in it["tags"] for it in c["results"])
        ids = [it["id"] for it in s["results"]]
        assert ids == sorted(ids)  # corpus order, not sorted by date


def test_search_overlap_allows_dedup_tests(port):
    _, a = get_json(port, "/search?q=swift&rpp=500")
    _, b = get_json(port, "/search?q=c&rpp=500")
    ida = {it["id"] for it in a["results"]}
    idb = {it["id"] for it in b["results"]}
    assert ida & idb, "queries should share items"


def test_search_rpp_and_case(port):
    _, default = get_json(port, "/search?q=rust")
    _, full = get_json(port, "/corpus?tag=rust")
    assert default["results"] == full["results"][:50]
    _, three = get_json(port, "/search?q=rust&rpp=3")
    assert three["results"] == full["results"][:3]
    _, upper = get_json(port, "/search?q=RUST&rpp=500")
    assert upper["query"] == "RUST"
    assert upper["results"] == full["results"]
    status, err = get_json(port, "/search?q=rust&rpp=501")
    assert status == 400 and "rpp" in err["error"]
    status, _ = get_json(port, "/search?q=rust&rpp=abc")
    assert status == 400


def test_search_text_match_is_word_based(port):
    _, body = get_json(port, "/search?q=Latency&rpp=500")
    assert body["results"]
    for it in body["results"]:
        assert re.search(r"\blatency\b", it["text"].lower())
    _, allc = get_json(port, "/corpus")
    expected = [it for it in allc["results"] if "latency" in it["text"].lower()]
    assert body["results"] == expected
    _, phrase = get_json(port, "/search?q=%s&rpp=500" % quote("memory stays flat"))
    assert phrase["results"] and all("memory stays flat" in it["text"].lower()
                                     for it in phrase["results"])
    _, q = get_json(port, "/corpus?q=latency")
    assert q["results"] == expected
    _, none = get_json(port, "/search?q=zzznothing")
    assert none == {"query": "zzznothing", "results": []}


def test_search_special_queries(port):
    status, body = get_json(port, "/search?q=__fail")
    assert status == 500 and "error" in body
    t0 = time.monotonic()
    status, body = get_json(port, "/search?q=__slow")
    assert time.monotonic() - t0 >= 0.29
    assert status == 200 and body["results"] == []
    status, headers, raw = request(port, "/search?q=__bad")
    assert status == 200 and headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
    status, body = get_json(port, "/search?q=__notarray")
    assert status == 200 and body["results"] == {"x": 1}


def test_corpora_are_deterministic_and_demo_is_realistic(port):
    here = request(port, "/corpus")[2]
    with run_server("--corpus", "test") as (_, p2):
        assert request(p2, "/corpus")[2] == here
    with run_server("--corpus", "demo") as (_, p3):
        _, demo = get_json(p3, "/corpus")
        with run_server("--corpus", "demo") as (_, p4):
            assert request(p4, "/corpus")[2] == request(p3, "/corpus")[2]
        _, demo_search = get_json(p3, "/search?q=linux&rpp=500")
        _, tls = get_json(p3, "/search?q=tls&rpp=500")
    items = demo["results"]
    assert 350 <= len(items) <= 450
    tags = {t for it in items for t in it["tags"]}
    assert 13 <= len(tags) <= 17
    assert len({it["author"] for it in items}) >= 20
    assert len({it["text"] for it in items}) >= 300
    dates = sorted(it["created_at"] for it in items)
    assert len(set(dates)) == len(items)
    span = (email.utils.parsedate_to_datetime(_http(dates[-1]))
            - email.utils.parsedate_to_datetime(_http(dates[0])))
    assert span.days >= 500
    # demo search matches tags, and words in the text
    assert len(demo_search["results"]) >= 30
    assert all("linux" in it["tags"] or "linux" in it["text"].lower()
               for it in demo_search["results"])
    assert tls["results"] and all("tls" in it["text"].lower() for it in tls["results"])
    assert all("tls" not in it["tags"] for it in tls["results"])


def _http(iso: str) -> str:
    t = time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")
    return time.strftime("%a, %d %b %Y %H:%M:%S GMT", t)


# ----------------------------------------------------------------------------
# generated documents


@pytest.mark.parametrize("size", [0, 100, 3000, 100_000, 2_000_000])
def test_json_size(port, size):
    status, headers, body = request(port, "/json?size=%d" % size)
    assert status == 200 and headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert isinstance(doc["items"], list)
    assert size <= len(body) <= max(size, 12) + 100
    assert int(headers["content-length"]) == len(body)


def test_json_default_size(port):
    _, _, body = request(port, "/json")
    assert 3000 <= len(body) <= 3100
    assert len(json.loads(body)["items"]) > 10


def test_deep(port):
    _, _, body = request(port, "/deep?n=1000")
    assert body == b"[" * 1000 + b"]" * 1000


def test_invalid_utf8(port):
    status, headers, body = request(port, "/invalid-utf8")
    assert status == 200 and headers["content-type"] == "application/json"
    assert body.startswith(b'{"text": "') and body.endswith(b'"}')
    with pytest.raises(UnicodeDecodeError):
        body.decode("utf-8")


def test_empty_and_204(port):
    status, headers, body = request(port, "/empty")
    assert (status, headers["content-length"], body) == (200, "0", b"")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/204")
        r = conn.getresponse()
        assert r.status == 204 and r.getheader("content-length") is None
        assert r.read() == b""
        conn.request("GET", "/json?size=10")  # connection still usable
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read()) == {"items": []}
    finally:
        conn.close()


def test_gzip(port):
    status, headers, body = request(port, "/gzip")
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert int(headers["content-length"]) == len(body)
    doc = json.loads(gzip.decompress(body))
    assert doc["gzip"] is True and len(doc["items"]) == 50


def test_bad_gzip(port):
    status, headers, body = request(port, "/bad-gzip")
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert body
    with pytest.raises(gzip.BadGzipFile):
        gzip.decompress(body)


@pytest.mark.parametrize("n", [0, 1, 250, 251, 70_000, 16 * 1024 * 1024 + 1])
def test_bytes(port, n):
    status, headers, body = request(port, "/bytes?n=%d" % n)
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    assert int(headers["content-length"]) == n
    assert len(body) == n and body == pattern(n)


@pytest.mark.parametrize("n", [0, 5, 16 * 1024 * 1024 + 1])
def test_bytes_chunked(port, n):
    status, headers, body = request(port, "/bytes?n=%d&chunked=1" % n)
    assert status == 200
    assert headers["transfer-encoding"] == "chunked"
    assert "content-length" not in headers
    assert body == pattern(n)


# ----------------------------------------------------------------------------
# socket effects


def test_delay(port):
    t0 = time.monotonic()
    status, body = get_json(port, "/delay?ms=200")
    assert time.monotonic() - t0 >= 0.19
    assert status == 200 and body == {"delayed": 200}


def test_delay_is_in_flight_until_answered(port):
    reset_stats(port)
    result = {}

    def call():
        result["r"] = get_json(port, "/delay?ms=1500")

    t = threading.Thread(target=call)
    t.start()
    try:
        wait_until(lambda: stats(port)["in_flight"] == 1)
    finally:
        t.join(TIMEOUT)
    assert result["r"] == (200, {"delayed": 1500})
    st = stats(port)
    assert st["in_flight"] == 0 and st["max_in_flight"] == 1


def test_stall_never_answers_and_frees_on_close(port):
    reset_stats(port)
    s = raw_connect(port)
    try:
        s.sendall(b"GET /stall HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(0.5)
        with pytest.raises(socket.timeout):
            s.recv(1)
        st = stats(port)
        assert st["in_flight"] == 1 and st["open_connections"] == 1
    finally:
        s.close()
    wait_until(lambda: (lambda st: st["open_connections"] == 0 and st["in_flight"] == 0)(
        stats(port)))


def test_drip(port):
    s = raw_connect(port)
    try:
        t0 = time.monotonic()
        s.sendall(b"GET /drip?bytes=30&chunk=10&interval_ms=200 HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = raw_head(s)
        assert b"Content-Length: 30" in head
        pieces = [body] if body else []
        for _ in range(100):
            if sum(map(len, pieces)) >= 30:
                break
            chunk = s.recv(65536)
            assert chunk
            pieces.append(chunk)
        elapsed = time.monotonic() - t0
        data = b"".join(pieces)
        assert len(data) == 30 and json.loads(data) == {"drip": "x" * 19}
        assert len(pieces) >= 2, "body should arrive in several pieces"
        assert all(len(p) <= 30 for p in pieces)
        assert elapsed >= 0.55
    finally:
        s.close()


def test_close_mid_body(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/close-mid-body?bytes=1000")
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("content-length") == "1000"
        with pytest.raises(http.client.IncompleteRead) as ei:
            r.read()
        assert len(ei.value.partial) == 500
    finally:
        conn.close()


def test_reset(port):
    s = raw_connect(port)
    try:
        s.sendall(b"GET /reset HTTP/1.1\r\nHost: x\r\n\r\n")
        with pytest.raises(ConnectionResetError):
            for _ in range(10):
                if not s.recv(1024):
                    break
    finally:
        s.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/reset")
        with pytest.raises(ConnectionResetError):
            conn.getresponse()
    finally:
        conn.close()


def test_reset_after_headers(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/reset-after-headers")
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("content-length") == "1000"
        with pytest.raises(ConnectionResetError):
            r.read()
    finally:
        conn.close()


def test_wrong_length_short(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/wrong-length?declared=100&actual=50")
        r = conn.getresponse()
        assert r.getheader("content-length") == "100"
        with pytest.raises(http.client.IncompleteRead) as ei:
            r.read()
        assert len(ei.value.partial) == 50
    finally:
        conn.close()


def test_wrong_length_long(port):
    s = raw_connect(port)
    try:
        s.sendall(b"GET /wrong-length?declared=10&actual=50 HTTP/1.1\r\nHost: x\r\n\r\n")
        head, rest = raw_head(s)
        assert b"Content-Length: 10\r\n" in head
        body = rest + read_to_eof(s)
        assert len(body) == 50
    finally:
        s.close()


# ----------------------------------------------------------------------------
# redirects


def test_redirect_chain(port):
    path = "/redirect?n=3"
    hops = []
    for _ in range(10):
        status, headers, body = request(port, path)
        if status != 302:
            break
        hops.append(headers["location"])
        path = headers["location"]
    assert hops == ["/redirect?n=2", "/redirect?n=1", "/json"]
    assert status == 200 and "items" in json.loads(body)
    status, _, body = request(port, "/redirect?n=0")
    assert status == 200 and "items" in json.loads(body)


def test_redirect_loop(port):
    status, headers, _ = request(port, "/redirect-loop")
    assert status == 302 and headers["location"] == "/redirect-loop"


def test_redirect_to_and_headers_log(port):
    target = "http://localhost:%d/echo?hop=2" % port
    status, headers, _ = request(
        port, "/redirect-to?url=%s&status=307" % quote(target, safe=""))
    assert status == 307 and headers["location"] == target
    status, headers, _ = request(port, "/redirect-to?url=%s" % quote(target, safe=""))
    assert status == 302
    reset_stats(port)
    request(port, "/redirect-to?url=x", headers={"Authorization": "Bearer secret"})
    request(port, "/echo?hop=2", host="localhost")
    st = stats(port)
    log = st["headers_log"]
    assert [e["path"] for e in log] == ["/redirect-to", "/echo"]
    assert log[0]["headers"]["authorization"] == "Bearer secret"
    assert "authorization" not in log[1]["headers"]
    assert log[1]["headers"]["host"] == "localhost:%d" % port
    assert st["last_headers"] == log[1]["headers"]
    status, _ = get_json(port, "/redirect-to")
    assert status == 400


# ----------------------------------------------------------------------------
# status, echo, files


@pytest.mark.parametrize("code", [200, 201, 299, 400, 404, 418, 429, 500, 503, 599])
def test_status(port, code):
    for method in ("GET", "POST", "DELETE"):
        status, body = get_json(port, "/status/%d" % code, method=method)
        assert status == code and body == {"status": code}


@pytest.mark.parametrize("code", [204, 304])
def test_status_without_body(port, code):
    status, headers, body = request(port, "/status/%d" % code)
    assert status == code and body == b"" and "content-length" not in headers


@pytest.mark.parametrize("bad", ["99", "600", "abc", ""])
def test_status_bad(port, bad):
    status, _ = get_json(port, "/status/" + bad)
    assert status == 400


def test_echo_custom_method_and_body(port):
    status, body = get_json(port, "/echo?a=1&b=x%20y&c=%C3%A9", method="PURGE",
                            headers={"X-Test": "yes", "Content-Type": "text/plain"},
                            body=b"hello \xc3\xa9")
    assert status == 200
    assert body["method"] == "PURGE" and body["path"] == "/echo"
    assert body["query"] == {"a": "1", "b": "x y", "c": "é"}
    assert body["headers"]["x-test"] == "yes"
    assert body["headers"]["content-length"] == "8"
    assert body["body"] == "hello é"


def test_echo_chunked_request_body(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("POST", "/echo", body=iter([b"abc", b"", b"defg", b"h" * 5000]),
                     encode_chunked=True, headers={"Transfer-Encoding": "chunked"})
        r = conn.getresponse()
        body = json.loads(r.read())
        assert body["body"] == "abcdefg" + "h" * 5000
        assert body["headers"]["transfer-encoding"] == "chunked"
        conn.request("GET", "/echo?again=1")  # keep-alive after a chunked body
        assert json.loads(conn.getresponse().read())["query"] == {"again": "1"}
    finally:
        conn.close()


def test_echo_expect_100_continue(port):
    s = raw_connect(port)
    try:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        head, rest = raw_head(s)
        assert head == b"HTTP/1.1 100 Continue" and rest == b""
        s.sendall(b"data")
        head, rest = raw_head(s)
        assert head.startswith(b"HTTP/1.1 200 OK")
        n = int(re.search(rb"Content-Length: (\d+)", head).group(1))
        for _ in range(100):
            if len(rest) >= n:
                break
            rest += s.recv(65536)
        assert json.loads(rest)["body"] == "data"
    finally:
        s.close()


def test_head_has_no_body(port):
    status, headers, body = request(port, "/json?size=500", method="HEAD")
    assert status == 200 and body == b""
    assert int(headers["content-length"]) >= 500


def test_the_suite_is_there():
    assert SUITE_DIR is not None, "JSONTestSuite not found at %s" % SUITE
    assert len(os.listdir(SUITE_DIR)) == 318, "JSONTestSuite incomplete at %s" % SUITE


def test_file_serves_every_jsontestsuite_file(port):
    assert SUITE_DIR is not None, "JSONTestSuite not found at %s" % SUITE
    names = sorted(os.listdir(SUITE_DIR))
    assert len(names) > 300
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        for name in names:
            conn.request("GET", "/file/" + quote(name, safe=""))
            r = conn.getresponse()
            data = r.read()
            assert r.status == 200, name
            assert r.getheader("content-type") == "application/json"
            with open(os.path.join(SUITE_DIR, name), "rb") as f:
                assert data == f.read(), name
    finally:
        conn.close()
    # a literal '+' in the path is not a space
    status, _, data = request(port, "/file/n_number_++.json")
    assert status == 200 and data == b"[++1234]"


@pytest.mark.parametrize("path,code", [
    ("/file/..", 400), ("/file/%2E%2E", 400), ("/file/..%2Fetc%2Fpasswd", 400),
    ("/file/a%2Fb.json", 400), ("/file/a%5Cb.json", 400), ("/file/a%00b", 400),
    ("/file/.", 400), ("/file/", 400), ("/file/no_such_file.json", 404),
])
def test_file_rejects(port, path, code):
    status, _ = get_json(port, path)
    assert status == code


def test_file_without_files_dir():
    with run_server() as (_, p):
        status, body = get_json(p, "/file/x.json")
        assert status == 404


# ----------------------------------------------------------------------------
# retries and caching


def test_flaky(port):
    key = "k-%d" % time.monotonic_ns()
    got = [get_json(port, "/flaky?key=%s&fail=2" % key) for _ in range(4)]
    assert [s for s, _ in got] == [503, 503, 200, 200]
    assert [b["attempt"] for _, b in got] == [1, 2, 3, 4]
    got = [get_json(port, "/flaky?key=%s-b&fail=1&status=500" % key)[0] for _ in range(2)]
    assert got == [500, 200]
    assert get_json(port, "/flaky?key=%s-c&fail=0" % key)[0] == 200
    t0 = time.monotonic()
    got = [get_json(port, "/flaky?key=%s-d&fail=1&ms=150" % key) for _ in range(2)]
    assert [s for s, _ in got] == [503, 200]
    assert [b["attempt"] for _, b in got] == [1, 2]
    assert time.monotonic() - t0 >= 0.3


def test_retry_after_seconds(port):
    key = "ra-%d" % time.monotonic_ns()
    status, headers, _ = request(port, "/retry-after?key=%s&fail=1&after=2" % key)
    assert status == 429 and headers["retry-after"] == "2"
    status, body = get_json(port, "/retry-after?key=%s&fail=1&after=2" % key)
    assert status == 200 and body == {"attempt": 2}


def test_retry_after_date(port):
    key = "rd-%d" % time.monotonic_ns()
    status, headers, _ = request(port, "/retry-after?key=%s&fail=1&after=3&date=1" % key)
    assert status == 429
    when = email.utils.parsedate_to_datetime(headers["retry-after"]).timestamp()
    assert 2 <= when - time.time() <= 6
    assert request(port, "/retry-after?key=%s&fail=1&after=3&date=1" % key)[0] == 200


def test_etag(port):
    key = "e-%d" % time.monotonic_ns()
    status, headers, body = request(port, "/etag?key=" + key)
    assert status == 200 and headers["etag"] == '"v1"'
    assert headers["cache-control"] == "max-age=0"
    assert json.loads(body)["count"] == 1
    status, headers, body = request(port, "/etag?key=" + key,
                                    headers={"If-None-Match": '"v1"'})
    assert status == 304 and body == b"" and headers["etag"] == '"v1"'
    status, _, body = request(port, "/etag?key=" + key, headers={"If-None-Match": '"v0"'})
    assert status == 200 and json.loads(body)["count"] == 3
    status, headers, _ = request(port, "/etag?key=%s&version=v2" % key,
                                 headers={"If-None-Match": '"v1"'})
    assert status == 200 and headers["etag"] == '"v2"'


def test_cache(port):
    status, headers, body = request(port, "/cache?max_age=60")
    assert status == 200 and headers["cache-control"] == "max-age=60"
    lm = headers["last-modified"]
    assert email.utils.parsedate_to_datetime(lm).timestamp() < time.time()
    status, _, body = request(port, "/cache?max_age=60", headers={"If-Modified-Since": lm})
    assert status == 304 and body == b""
    older = email.utils.formatdate(
        email.utils.parsedate_to_datetime(lm).timestamp() - 3600, usegmt=True)
    status, _, _ = request(port, "/cache?max_age=60", headers={"If-Modified-Since": older})
    assert status == 200
    _, headers, _ = request(port, "/cache?max_age=5&no_store=1")
    assert headers["cache-control"] == "max-age=5, no-store"
    _, headers, _ = request(port, "/cache?max_age=0&must_revalidate=1")
    assert headers["cache-control"] == "max-age=0, must-revalidate"


# ----------------------------------------------------------------------------
# stats, keep-alive, concurrency


def test_stats_counts_and_reset(port):
    reset_stats(port)
    st = stats(port)
    assert st["requests"] == 0 and st["arrivals"] == [] and st["by_path"] == {}
    assert st["connections_total"] == 0 and st["open_connections"] == 0
    request(port, "/json?size=10", headers={"X-One": "1"})
    request(port, "/json?size=20")
    request(port, "/status/404")
    st = stats(port)
    assert st["requests"] == 3
    assert st["arrivals"] == ["/json?size=10", "/json?size=20", "/status/404"]
    assert st["by_path"] == {"/json": 2, "/status/404": 1}
    assert st["connections_total"] == 3
    assert st["open_connections"] == 0
    assert st["in_flight"] == 0 and st["max_in_flight"] == 1
    assert [e["target"] for e in st["headers_log"]] == st["arrivals"]
    assert st["headers_log"][0]["headers"]["x-one"] == "1"
    assert "x-one" not in st["last_headers"]
    reset_stats(port)
    assert get_json(port, "/stats/reset")[0] == 200  # GET works too
    assert stats(port)["requests"] == 0


def test_stats_logs_are_bounded(port):
    reset_stats(port)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        for i in range(1100):
            conn.request("GET", "/status/200?i=%d" % i)
            conn.getresponse().read()
    finally:
        conn.close()
    st = stats(port)
    assert st["requests"] == 1100
    assert len(st["arrivals"]) == 1000 and st["arrivals"][-1] == "/status/200?i=1099"
    assert st["arrivals"][0] == "/status/200?i=100"
    assert len(st["headers_log"]) == 50
    assert st["connections_total"] == 1


def test_keep_alive_and_pipelining(port):
    reset_stats(port)
    s = raw_connect(port)
    try:
        reqs = b"".join(b"GET /echo?i=%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(5))
        s.sendall(reqs)
        buf = b""
        seen = []
        for _ in range(1000):
            if len(seen) == 5:
                break
            i = buf.find(b"\r\n\r\n")
            if i >= 0:
                n = int(re.search(rb"Content-Length: (\d+)", buf[:i]).group(1))
                if len(buf) >= i + 4 + n:
                    seen.append(json.loads(buf[i + 4:i + 4 + n])["query"]["i"])
                    buf = buf[i + 4 + n:]
                    continue
            chunk = s.recv(65536)
            assert chunk
            buf += chunk
        assert seen == ["0", "1", "2", "3", "4"] and buf == b""
        st = stats(port)
        assert st["connections_total"] == 1 and st["open_connections"] == 1
    finally:
        s.close()
    wait_until(lambda: stats(port)["open_connections"] == 0)


def test_connection_close_header(port):
    s = raw_connect(port)
    try:
        s.sendall(b"GET /json?size=10 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = read_to_eof(s)
        assert b"Connection: close" in data and data.endswith(b'{"items":[]}')
    finally:
        s.close()


def test_64_concurrent_connections_in_flight(port):
    reset_stats(port)
    socks = []
    try:
        for i in range(64):
            s = raw_connect(port)
            socks.append(s)
            s.sendall(b"GET /delay?ms=30000&i=%d HTTP/1.1\r\nHost: x\r\n\r\n" % i)
        st = wait_until(lambda: (lambda st: st if st["in_flight"] == 64 else None)(
            stats(port)))
        assert st["max_in_flight"] == 64
        assert st["open_connections"] == 64 and st["connections_total"] == 64
    finally:
        for s in socks:
            s.close()
    # the server notices the closed clients: nothing in flight, nothing leaked
    wait_until(lambda: (lambda st: st["in_flight"] == 0 and st["open_connections"] == 0)(
        stats(port)))
    assert stats(port)["max_in_flight"] == 64


def test_many_requests_on_parallel_connections(port):
    reset_stats(port)
    errors = []

    def worker(w):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        try:
            for i in range(250):
                conn.request("GET", "/search?q=swift&rpp=5")
                r = conn.getresponse()
                body = json.loads(r.read())
                if r.status != 200 or len(body["results"]) != 5:
                    errors.append((w, i, r.status))
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append((w, repr(e)))
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    st = stats(port)
    assert st["requests"] == 2000 and st["by_path"] == {"/search": 2000}
    assert st["connections_total"] == 8
    assert 1 <= st["max_in_flight"] <= 8


def test_http10_keep_alive(port):
    s = raw_connect(port)
    try:
        s.sendall(b"GET /json?size=10 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        head, rest = raw_head(s)
        assert b"\r\nConnection: keep-alive" in head and rest == b'{"items":[]}'
        s.sendall(b"GET /json?size=10 HTTP/1.0\r\n\r\n")  # 1.0 default: close
        data = read_to_eof(s)
        assert b"\r\nConnection: close" in data and data.endswith(b'{"items":[]}')
    finally:
        s.close()


def test_malformed_request_is_400(port):
    s = raw_connect(port)
    try:
        s.sendall(b"NONSENSE\r\n\r\n")
        data = read_to_eof(s)
        assert data.startswith(b"HTTP/1.1 400 ")
    finally:
        s.close()


# ----------------------------------------------------------------------------
# lifecycle


def test_exits_after_max_seconds():
    proc = subprocess.Popen([sys.executable, SERVER, "--max-seconds", "1"],
                            stdout=subprocess.PIPE)
    try:
        _read_port_line(proc)
        assert proc.wait(timeout=TIMEOUT) == 0
    finally:
        _stop(proc)


def test_exits_on_sigterm_and_sigint():
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen([sys.executable, SERVER], stdout=subprocess.PIPE)
        try:
            port = _read_port_line(proc)
            assert request(port, "/json")[0] == 200
            proc.send_signal(sig)
            assert proc.wait(timeout=TIMEOUT) == 0
        finally:
            _stop(proc)


def test_exits_when_parent_pid_is_gone():
    parent = subprocess.Popen(["sleep", "60"])
    try:
        with run_server(parent_pid=parent.pid) as (proc, port):
            s = raw_connect(port)  # a stalled connection must not keep it alive
            s.sendall(b"GET /stall HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.6)
            assert proc.poll() is None
            parent.kill()
            parent.wait(timeout=TIMEOUT)
            assert proc.wait(timeout=TIMEOUT) == 0
            s.settimeout(TIMEOUT)
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(1) == b""
            s.close()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=TIMEOUT)


# ----------------------------------------------------------------------------
# TLS


def test_tls_self_signed_is_rejected_by_verification(tmp_path):
    # make deps installs openssl: its absence is a failure, not a skip.
    assert shutil.which("openssl") is not None, "openssl CLI not found"
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60)
    with run_server("--tls-cert", str(cert), "--tls-key", str(key)) as (_, p):
        conn = http.client.HTTPSConnection("localhost", p, timeout=TIMEOUT,
                                           context=ssl.create_default_context())
        try:
            with pytest.raises(ssl.SSLCertVerificationError):
                conn.request("GET", "/json")
        finally:
            conn.close()
        ctx = ssl.create_default_context(cafile=str(cert))
        conn = http.client.HTTPSConnection("localhost", p, timeout=TIMEOUT, context=ctx)
        try:
            conn.request("GET", "/json?size=100")
            r = conn.getresponse()
            assert r.status == 200 and "items" in json.loads(r.read())
            conn.request("GET", "/echo")  # keep-alive over TLS
            assert json.loads(conn.getresponse().read())["method"] == "GET"
        finally:
            conn.close()
