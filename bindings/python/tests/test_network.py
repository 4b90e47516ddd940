"""Requests, searches and search-all against the shared test server:
responses, every network error class, progress, in-flight cancellation."""

from __future__ import annotations

import concurrent.futures as cf
import gzip
import http.server
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from typing import Any, Dict, List, Tuple

import pytest

import fetchq

from conftest import TIMEOUT, Server, needs_network, start_server, stop_server

pytestmark = needs_network

METRIC_KEYS = {"queue_wait_ms", "connect_ms", "first_byte_ms", "total_ms", "bytes",
               "redirects", "attempts", "http_version", "reused_connection"}


def wait_until(pred: Any, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.01)


# -- requests ----------------------------------------------------------------

def test_get_json_response(net_engine: fetchq.Engine, server: Server) -> None:
    r = net_engine.queue("n").get(server.url("/json?size=500")).result(timeout=TIMEOUT)
    assert isinstance(r, fetchq.Response)
    assert r.status == 200 and r.ok
    assert r.headers["content-type"] == "application/json"
    assert r.headers["content-length"] == str(len(r.body))
    assert r.parsed and r.json() == json.loads(r.body)
    assert r.json()["items"][0] == {"id": 0, "name": "item-000000", "value": 0, "ok": False}
    assert set(r.metrics) >= METRIC_KEYS and r.metrics["bytes"] == len(r.body)
    assert r.text == r.body.decode()
    assert r.op_id > 0


def test_text_decodes_with_utf8_when_the_charset_cannot_decode_it(net_engine: fetchq.Engine) -> None:
    """The tenth review: Response.text raised (UnicodeError) for a charset
    Python has a codec of, which cannot decode with "replace" ("undefined",
    "idna", "punycode"). The test server cannot send a chosen Content-Type,
    so a small server of this test's own does."""
    body = b"caf\xc3\xa9 \xff done"

    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = TIMEOUT                       # per connection

        def do_GET(self) -> None:
            charset = urllib.parse.unquote(self.path.rpartition("/")[2])
            sent = b"Hello World" if self.path.startswith("/ascii/") else body
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=" + charset)
            self.send_header("Content-Length", str(len(sent)))
            self.end_headers()
            self.wfile.write(sent)

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    limit = threading.Timer(120.0, srv.shutdown)    # in any case
    limit.start()
    try:
        q = net_engine.queue("charsets")
        base = "http://127.0.0.1:%d/" % srv.server_address[1]
        utf8 = "caf\u00e9 \ufffd done"
        for charset, text in [("utf-8", utf8), ("latin-1", body.decode("latin-1")), ("bogus", utf8),
                              ("base64", utf8), ("undefined", utf8), ("idna", utf8), ("punycode", utf8), ("charmap", utf8)]:
            r = q.get(base + charset).result(timeout=TIMEOUT)
            assert r.headers["content-type"] == "text/plain; charset=" + charset
            assert r.text == text, charset
        # Codecs that are no charsets, decoding ASCII without an error: punycode
        # made "Hello World" other letters (the tenth review's check of its
        # changes).
        for charset in ["punycode", "idna", "undefined", "unicode_escape", "raw_unicode_escape", "charmap", "ascii"]:
            r = q.get(base + "ascii/" + charset).result(timeout=TIMEOUT)
            assert r.text == "Hello World", charset
    finally:
        limit.cancel()
        srv.shutdown()
        srv.server_close()
        thread.join(TIMEOUT)


def test_request_with_params_headers_and_json(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("n")
    r = q.request("POST", server.url("/echo"), headers={"X-Token": "t 1"},
                  params={"a": 1, "b": "x y&z", "c": True},
                  json={"k": [1, 2.5, None], "s": "ü"}).result(timeout=TIMEOUT)
    echo = r.json()
    assert echo["method"] == "POST"
    assert echo["query"] == {"a": "1", "b": "x y&z", "c": "true"}
    assert echo["headers"]["x-token"] == "t 1"
    assert echo["headers"]["content-type"] == "application/json"
    assert json.loads(echo["body"]) == {"k": [1, 2.5, None], "s": "ü"}


def test_params_and_headers_as_pairs_refuse_a_repeated_name(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("n")
    echo = q.request("GET", server.url("/echo"), params=[("a", "1"), ("b", "2")],
                     headers=[("X-A", "x")]).result(timeout=TIMEOUT).json()
    assert echo["query"] == {"a": "1", "b": "2"} and echo["headers"]["x-a"] == "x"
    # What dict() reads as a mapping still is one (an email.message.Message).
    import email.message
    m = email.message.Message()
    m["X-M"] = "m"
    assert q.request("GET", server.url("/echo"), headers=m).result(timeout=TIMEOUT).json()["headers"]["x-m"] == "m"
    # A repeated name was dropped silently (only the last value was sent).
    with pytest.raises(ValueError, match="params: 'tag' is given twice"):
        q.request("GET", server.url("/echo"), params=[("tag", "a"), ("tag", "b")])
    with pytest.raises(ValueError, match="headers: 'X-A' is given twice"):
        q.request("GET", server.url("/echo"), headers=[("X-A", "1"), ("X-A", "2")])
    # Two-character strings unpacked as pairs: ["ab", "cd"] was sent as {"a": "b", "c": "d"}.
    with pytest.raises(TypeError, match=r"headers: each item must be a \(name, value\) pair, not 'ab'"):
        q.request("GET", server.url("/echo"), headers=["ab", "cd"])
    with pytest.raises(TypeError, match="params: each item must be a"):
        q.request("GET", server.url("/echo"), params=[("a", "1", "extra")])
    with pytest.raises(TypeError, match="headers must be a mapping or an iterable of"):
        q.request("GET", server.url("/echo"), headers="X-A: 1")
    with pytest.raises(TypeError, match="params must be a mapping or an iterable of"):
        q.request("GET", server.url("/echo"), params=5)
    # lists as pairs are pairs too
    echo = q.request("GET", server.url("/echo"), params=[["c", "3"]]).result(timeout=TIMEOUT).json()
    assert echo["query"] == {"c": "3"}


def test_json_string_body_is_sent_as_json(net_engine: fetchq.Engine, server: Server) -> None:
    echo = net_engine.queue("n").request("POST", server.url("/echo"), json="hi").result(
        timeout=TIMEOUT).json()
    assert echo["body"] == '"hi"' and echo["headers"]["content-type"] == "application/json"


def test_data_str_and_bytes_are_sent_as_is(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("n")
    echo = q.request("PUT", server.url("/echo"), data="plain text ü",
                     headers={"Content-Type": "text/plain"}).result(timeout=TIMEOUT).json()
    assert echo["body"] == "plain text ü" and echo["headers"]["content-type"] == "text/plain"
    assert echo["headers"]["content-length"] == str(len("plain text ü".encode()))
    echo = q.request("PUT", server.url("/echo"), data=b"a\x00b\xc3\xa9").result(timeout=TIMEOUT).json()
    assert echo["body"] == "a\x00bé" and echo["headers"]["content-length"] == "5"


def test_non_utf8_bytes_are_a_type_error(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("n")
    with pytest.raises(TypeError, match="UTF-8"):
        q.request("POST", server.url("/echo"), data=b"\xff\xfe")
    with pytest.raises(TypeError):
        q.request("POST", server.url("/echo"), data=b"x", json={"a": 1})
    with pytest.raises(TypeError):
        q.request("POST", server.url("/echo"), data=123)  # type: ignore[arg-type]
    assert net_engine.pending_count == 0


def test_custom_method_and_head(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("n")
    assert q.request("PURGE", server.url("/echo")).result(timeout=TIMEOUT).json()["method"] == "PURGE"
    head = q.request("HEAD", server.url("/json?size=100")).result(timeout=TIMEOUT)
    assert head.status == 200 and head.body == b"" and int(head.headers["content-length"]) > 0


def test_parse_none_and_octet_stream(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("n")
    r = q.get(server.url("/json?size=100"), parse="none").result(timeout=TIMEOUT)
    assert not r.parsed and r.json()["items"]          # json() parses the body itself
    r = q.get(server.url("/bytes?n=1000")).result(timeout=TIMEOUT)
    assert not r.parsed and r.body == bytes(i % 251 for i in range(1000))


def test_gzip_is_decoded(net_engine: fetchq.Engine, server: Server) -> None:
    r = net_engine.queue("n").get(server.url("/gzip")).result(timeout=TIMEOUT)
    assert r.json()["gzip"] is True and len(r.json()["items"]) == 50
    assert json.loads(r.body)["gzip"] is True


def test_redirects_are_followed_and_counted(net_engine: fetchq.Engine, server: Server) -> None:
    r = net_engine.queue("n").get(server.url("/redirect?n=3")).result(timeout=TIMEOUT)
    assert r.status == 200 and r.metrics["redirects"] == 3 and "items" in r.json()


def test_http_error_carries_status_body_and_response(net_engine: fetchq.Engine, server: Server) -> None:
    f = net_engine.queue("n").request("DELETE", server.url("/status/503"))
    with pytest.raises(fetchq.HTTPError) as info:
        f.result(timeout=TIMEOUT)
    err = info.value
    assert err.code == -11 and err.status == 503 and json.loads(err.body) == {"status": 503}
    assert err.headers["content-type"] == "application/json"
    assert err.response.status == 503 and err.response.json() == {"status": 503}
    assert "503" in str(err) and err.op_id == f.op_id  # type: ignore[attr-defined]


def test_accept_status(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("n")
    assert q.get(server.url("/status/404"), accept_status=[404]).result(timeout=TIMEOUT).status == 404
    assert q.get(server.url("/status/418"), accept_status=["4xx"]).result(timeout=TIMEOUT).status == 418
    with pytest.raises(fetchq.HTTPError):
        q.get(server.url("/status/500"), accept_status=["4xx"]).result(timeout=TIMEOUT)


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


@pytest.mark.parametrize("path,options,exc", [
    ("/reset", {}, fetchq.NetworkError),
    ("/close-mid-body?bytes=10000", {}, fetchq.NetworkError),
    ("/stall", {"timeout_ms": 200}, fetchq.Timeout),
    ("/redirect-loop", {}, fetchq.RedirectError),
    ("/redirect?n=3", {"max_redirects": 2}, fetchq.RedirectError),
    ("/bytes?n=100000", {"max_response_bytes": 1000}, fetchq.TooLarge),
    ("/search?q=__bad", {}, fetchq.ParseError),
    ("/json?size=100", {"parse": "json", "max_json_depth": 2}, fetchq.ParseError),
    ("/invalid-utf8", {"parse": "json"}, fetchq.ParseError),
])
def test_network_errors_map_to_exceptions(net_engine: fetchq.Engine, server: Server, path: str,
                                          options: Dict[str, Any], exc: type) -> None:
    f = net_engine.queue("errs", max_concurrent=8).get(server.url(path), **options)
    with pytest.raises(exc) as info:
        f.result(timeout=TIMEOUT)
    assert type(info.value) is exc and info.value.message


def test_connection_refused_is_network_error(net_engine: fetchq.Engine) -> None:
    f = net_engine.queue("n").get("http://127.0.0.1:%d/" % closed_port())
    with pytest.raises(fetchq.NetworkError):
        f.result(timeout=TIMEOUT)


@pytest.mark.parametrize("reply", [b"GARBAGE\r\n\r\n", b"HTTP/1.1 199 Weird\r\nContent-Length: 0\r\n\r\n"])
def test_a_reply_that_is_not_http_is_a_network_error_and_retried(net_engine: fetchq.Engine,
                                                                  reply: bytes) -> None:
    # The server's fault, not the caller's: NetworkError (not InvalidArgument),
    # and retried like any other network failure.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(TIMEOUT)
    port = listener.getsockname()[1]
    accepted: List[int] = []

    def serve() -> None:
        for _ in range(3):                     # one connection per attempt
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(TIMEOUT)
                conn.recv(65536)               # the request head
                conn.sendall(reply)
                accepted.append(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        f = net_engine.queue("not-http").get("http://127.0.0.1:%d/x" % port,
                                             retry={"max": 2, "base": 0.01})
        with pytest.raises(fetchq.NetworkError) as info:
            f.result(timeout=TIMEOUT)
        assert type(info.value) is fetchq.NetworkError
        thread.join(timeout=TIMEOUT)
        assert len(accepted) == 3
    finally:
        listener.close()


def test_invalid_requests_fail_at_submit(net_engine: fetchq.Engine) -> None:
    q = net_engine.queue("n")
    with pytest.raises(fetchq.InvalidArgument, match="ftp"):
        q.get("ftp://example.com/")
    with pytest.raises(fetchq.InvalidArgument):
        q.get("http://127.0.0.1/", headers={"X": "a\r\nb"})
    with pytest.raises(fetchq.InvalidArgument):
        q.request("NOT A TOKEN", "http://127.0.0.1/")
    with pytest.raises(fetchq.InvalidArgument, match="parse"):
        q.get("http://127.0.0.1/", parse="yaml")
    # A NUL in what the message quotes is written \0: the message used to end there.
    with pytest.raises(fetchq.InvalidArgument) as info:
        q.get("http://127.0.0.1/echo\0x")
    assert info.value.message == ('url "http://127.0.0.1/echo\\0x": contains a space or a control '
                                  'character (percent-encode it)')
    with pytest.raises(fetchq.InvalidArgument) as info:
        q.request("GE\0T", "http://127.0.0.1/")
    assert 'GE\\0T' in info.value.message and len(info.value.message) > 20, info.value.message
    assert net_engine.pending_count == 0


def test_request_framing_and_hygiene_are_checked_at_submit(net_engine: fetchq.Engine, server: Server) -> None:
    """What the library sends must be one well-formed request: refused at
    submit (nothing sent, no callback) where it could not be."""
    q = net_engine.queue("n")
    server.reset()
    echo = server.url("/echo")
    refused = [
        # A caller's framing header let a body be read as a second request (smuggling).
        (dict(method="POST", headers={"Content-Length": "0"}, data="GET /status/418 HTTP/1.1\r\nHost: x\r\n\r\n"),
         'header "Content-Length": set by fetchq from the body, it cannot be given'),
        (dict(method="POST", headers={"transfer-encoding": "chunked"}, data="x"),
         'header "transfer-encoding": set by fetchq from the body, it cannot be given'),
        # Control characters other than HTAB went onto the wire.
        (dict(method="GET", headers={"X-A": "1\x01z"}), 'header "X-A": the value contains a control character'),
        (dict(method="GET", headers={"X-A": "\x1b[31m"}), 'header "X-A": the value contains a control character'),
        (dict(method="GET", user_agent="a\x7fb"), "options.user_agent: must not contain a control character"),
        # Failed only in the callback.
        (dict(method="HEAD", data=""), "a HEAD request cannot have a body"),
        (dict(method="TRACE", data="abc"), "a TRACE request cannot have a body"),
        (dict(method="CONNECT"), "method CONNECT is not supported"),
        # Over libcurl's request-head buffer: it failed as a retried network error.
        (dict(method="GET", headers={"X-Big": "x" * 1_000_000}), "over the limit of 1000000"),
    ]
    for kwargs, message in refused:
        method = kwargs.pop("method")
        with pytest.raises(fetchq.InvalidArgument) as info:
            q.request(method, echo, **kwargs)
        assert message in info.value.message, (method, kwargs, info.value.message)
    with pytest.raises(fetchq.InvalidArgument, match="the host is not ASCII"):
        q.get("http://\u00e9.localhost:1/a")
    assert net_engine.pending_count == 0
    assert server.stats()["requests"] == 0
    assert q.get(echo, headers={"X-Tab": "a\tb"}).result(timeout=TIMEOUT).json()["headers"]["x-tab"] == "a\tb"

    # Bytes that are not ASCII are percent-encoded in the path and the query
    # alike (the query's were sent raw), with uppercase hex.
    server.reset()
    with pytest.raises(fetchq.HTTPError, match="404"):  # not a route: the target is what counts
        q.get(server.url("/echo/caf\u00e9?q=\u00e9&r=%c3%a9")).result(timeout=TIMEOUT)
    assert server.stats()["arrivals"] == ["/echo/caf%C3%A9?q=%C3%A9&r=%c3%a9"]
    # A PUT or PATCH without a body says Content-Length: 0, as a POST does (RFC 9110 §8.6).
    for method in ["PUT", "PATCH", "POST"]:
        sent = q.request(method, echo).result(timeout=TIMEOUT).json()
        assert sent["headers"].get("content-length") == "0", (method, sent["headers"])


def test_proxy_config_and_option(server: Server, monkeypatch: Any) -> None:
    """"proxy": a URL sends every request through it; "" sends none through
    a proxy, whatever the environment says; absent, libcurl's http_proxy
    (and all_proxy, no_proxy) apply."""
    origin = "http://127.0.0.1:1/echo?via=proxy"  # nothing listens there: only a proxy can answer
    with fetchq.Engine(proxy=server.url("")) as engine:
        server.reset()
        r = engine.queue("p").get(origin).result(timeout=TIMEOUT)
        assert r.json()["query"] == {"via": "proxy"}
        assert server.stats()["arrivals"] == [origin]  # absolute-form: it was asked as a proxy
        with pytest.raises(fetchq.NetworkError):  # the option overrides the config: no proxy
            engine.queue("p").get(origin, proxy="").result(timeout=TIMEOUT)
    monkeypatch.setenv("http_proxy", server.url(""))
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with fetchq.Engine() as engine:
        server.reset()
        assert engine.queue("p").get(origin).result(timeout=TIMEOUT).status == 200
        assert server.stats()["arrivals"] == [origin]
    with fetchq.Engine(proxy="") as engine:
        with pytest.raises(fetchq.NetworkError):
            engine.queue("p").get(origin).result(timeout=TIMEOUT)
    with pytest.raises(fetchq.InvalidArgument, match="config.proxy: expected"):
        fetchq.Engine(proxy="socks5 ://x")


def test_a_password_in_the_url_is_not_shown_in_messages(net_engine: fetchq.Engine) -> None:
    with pytest.raises(fetchq.NetworkError) as info:
        net_engine.queue("n").get("http://alice:s3cret@127.0.0.1:1/x").result(timeout=TIMEOUT)
    assert "s3cret" not in str(info.value)
    assert "http://alice:***@127.0.0.1:1/x" in str(info.value), str(info.value)
    # A user name without a password is often a token ("https://TOKEN@host").
    for url in ("http://ghp_T0KEN@127.0.0.1:1/x", "http://ghp_T0KEN:@127.0.0.1:1/x"):
        with pytest.raises(fetchq.NetworkError) as info:
            net_engine.queue("n").get(url).result(timeout=TIMEOUT)
        assert "T0KEN" not in str(info.value)
        assert "http://***@127.0.0.1:1/x" in str(info.value), str(info.value)


def test_a_password_in_a_redirect_is_not_shown_in_messages(server: Server, net_engine: fetchq.Engine) -> None:
    """fetchq follows a POST's redirects itself; its messages hide the
    passwords of the URL and of the Location as every other message does
    (user name kept, password ***)."""
    target = "ftp://bob:pw123@127.0.0.1:1/y"
    url = server.url("/redirect-to?url=" + urllib.parse.quote(target, safe=""))
    url = url.replace("http://", "http://alice:s3cret@", 1)
    with pytest.raises(fetchq.NetworkError) as info:
        net_engine.queue("n").request("POST", url, data=b"x").result(timeout=TIMEOUT)
    message = str(info.value)
    # (the request's own query names the Location percent-encoded)
    assert "s3cret" not in message and "bob:pw123@" not in message, message
    assert "http://alice:***@127.0.0.1:" in message, message
    assert "to ftp://bob:***@127.0.0.1:1/y, not an http or https URL" in message, message
    # not URLs as written, but read with userinfo by browsers
    for target, shown in ((r"http:\\bob:pw123@127.0.0.1:1\y", r"http:\\bob:***@127.0.0.1:1\y"),
                          ("mailto:bob:pw123@h", "mailto:bob:***@h")):
        url = server.url("/redirect-to?status=307&url=" + urllib.parse.quote(target, safe=""))
        with pytest.raises(fetchq.NetworkError) as info:
            net_engine.queue("n").request("POST", url, data=b"x").result(timeout=TIMEOUT)
        assert "bob:pw123@" not in str(info.value) and "to " + shown + "," in str(info.value), str(info.value)


def test_a_search_query_of_dots_stays_one_path_segment(server: Server) -> None:
    """A query "." or ".." in a path template was a dot-segment: the request
    went to /api/profile instead of /api/users/../profile's segment."""
    template = server.url("/api/users/{query}/profile?q={query}")
    with fetchq.Engine(search={"url": template, "results": "/results"}) as engine:
        q = engine.queue("s")
        for query, target in [("..", "/api/users/%2E%2E/profile?q=.."), (".", "/api/users/%2E/profile?q=."),
                              ("a.b", "/api/users/a.b/profile?q=a.b")]:
            server.reset()
            with pytest.raises(fetchq.HTTPError):  # no such route: 404
                q.search(query).result(timeout=TIMEOUT)
            assert server.stats()["arrivals"] == [target], query
    with pytest.raises(fetchq.InvalidArgument, match="must stand before the fragment"):
        fetchq.Engine(search={"url": server.url("/s#{query}")})


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: Any) -> Any:
    if not shutil.which("openssl"):
        pytest.fail("openssl not found: install the openssl package (CI does)")
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
    srv = start_server("--tls-cert", cert, "--tls-key", key)
    yield srv, cert
    stop_server(srv.proc)


def test_tls_verification(net_engine: fetchq.Engine, tls_server: Tuple[Server, str]) -> None:
    srv, cert = tls_server
    q = net_engine.queue("tls")
    with pytest.raises(fetchq.TLSError):
        q.get(srv.url("/json?size=10")).result(timeout=TIMEOUT)
    r = q.get(srv.url("/json?size=10"), ca_file=cert).result(timeout=TIMEOUT)
    assert r.status == 200 and "items" in r.json()
    assert q.get(srv.url("/json?size=10"), verify_tls=False).result(timeout=TIMEOUT).status == 200


# -- progress -----------------------------------------------------------------

def test_progress_events_precede_completion(net_engine: fetchq.Engine, server: Server) -> None:
    events: List[Tuple[int, Any, bool, str]] = []
    fut_box: List[Any] = []

    def progress(received: int, expected: Any) -> None:
        events.append((received, expected, fut_box[0].done() if fut_box else False,
                       threading.current_thread().name))

    f = net_engine.queue("p").get(server.url("/drip?bytes=4000&chunk=1000&interval_ms=30"),
                                  progress=progress, progress_interval_ms=1)
    fut_box.append(f)
    r = f.result(timeout=TIMEOUT)
    assert len(r.body) == 4000
    assert len(events) >= 2
    received = [e[0] for e in events]
    assert received == sorted(received) and received[-1] == 4000
    assert all(e[1] == 4000 for e in events)
    assert not any(e[2] for e in events)          # all before the future resolved
    assert all(e[3] != threading.current_thread().name for e in events)
    assert net_engine._core.by_op == {}           # registry cleaned


def test_progress_unknown_length_is_none(net_engine: fetchq.Engine, server: Server) -> None:
    events: List[Tuple[int, Any]] = []
    r = net_engine.queue("p").get(server.url("/bytes?n=300000&chunked=1"),
                                  progress=lambda a, b: events.append((a, b))).result(timeout=TIMEOUT)
    assert len(r.body) == 300000
    # events are throttled (progress_interval_ms, default 100), but the last
    # one reports the total
    received = [e[0] for e in events]
    assert events and received == sorted(received) and received[-1] == 300000
    assert all(e[1] is None for e in events)


@pytest.mark.parametrize("path", ["/gzip", "/gzip?random=300000"])
def test_progress_of_a_gzip_body_counts_it_decoded(net_engine: fetchq.Engine, server: Server, path: str) -> None:
    """Content-Length counts the encoded bytes, the body is decoded: the
    events count the body decoded, never go down, and expect no size (the
    decoded one is not known). They went up to the encoded size, then to
    the decoded one (down, when it was smaller)."""
    events: List[Tuple[int, Any]] = []
    r = net_engine.queue("p").get(server.url(path), progress=lambda a, b: events.append((a, b)),
                                  progress_interval_ms=0).result(timeout=TIMEOUT)
    with urllib.request.urlopen(server.url(path), timeout=TIMEOUT) as raw:  # (urllib does not decode)
        wire = raw.read()
    assert r.headers.get("content-encoding") == "gzip" and r.body == gzip.decompress(wire)
    # the random bytes are larger encoded, the JSON document smaller
    assert (len(wire) > len(r.body)) == ("random" in path)
    received = [e[0] for e in events]
    assert received and received == sorted(received) and received[-1] == len(r.body), received[-5:]
    assert all(e[1] is None for e in events), events[-5:]


@pytest.mark.parametrize("status", [307, 300])
@pytest.mark.parametrize("method", ["GET", "POST", "PUT"])
def test_progress_after_a_redirect_counts_the_final_body_only(net_engine: fetchq.Engine, server: Server,
                                                              method: str, status: int) -> None:
    # (GET is followed by libcurl, POST and PUT by fetchq itself.)
    events: List[Tuple[int, Any]] = []
    url = server.url("/redirect-to?url=%%2Fbytes%%3Fn%%3D10&status=%d&pad=300000" % status)
    r = net_engine.queue("p").request(method, url, data=None if method == "GET" else "x",
                                      progress=lambda a, b: events.append((a, b)),
                                      progress_interval_ms=0).result(timeout=TIMEOUT)
    assert len(r.body) == 10 and r.metrics["redirects"] == 1
    assert events and events[-1] == (10, 10)
    assert all(a <= 10 for a, _ in events)   # none from the redirect's own 300 KB


@pytest.mark.parametrize("path", ["/empty", "/204"])
def test_progress_of_an_empty_body_ends_with_one_event(net_engine: fetchq.Engine, server: Server,
                                                       path: str) -> None:
    events: List[Tuple[int, Any]] = []
    r = net_engine.queue("p").get(server.url(path), progress=lambda a, b: events.append((a, b))
                                  ).result(timeout=TIMEOUT)
    assert r.body == b"" and r.status in (200, 204)
    assert events == [(0, None)]


def test_progress_of_an_empty_body_after_a_retry(net_engine: fetchq.Engine, server: Server) -> None:
    # The failed attempt's size is not the empty answer's.
    events: List[Tuple[int, Any]] = []
    r = net_engine.queue("p").get(server.url("/flaky?key=progress-empty&empty=1"),
                                  retry={"max": 1, "base": 0.01}, progress_interval_ms=0,
                                  progress=lambda a, b: events.append((a, b))).result(timeout=TIMEOUT)
    assert r.body == b"" and r.metrics["attempts"] == 2
    assert events[-1] == (0, None)


def test_progress_of_a_body_a_304_took_from_the_cache(net_engine: fetchq.Engine, server: Server) -> None:
    """A revalidated GET (a transfer answered 304) ends with the cached
    body's size, as any successful transfer does (it had no event)."""
    url = server.url("/etag?key=progress-304")
    first = net_engine.queue("p").get(url).result(timeout=TIMEOUT)
    events: List[Tuple[int, Any]] = []
    r = net_engine.queue("p").get(url, progress=lambda a, b: events.append((a, b))).result(timeout=TIMEOUT)
    assert r.metrics["from_cache"] is True and r.body == first.body and len(r.body) > 0
    assert events and events[-1][0] == len(r.body), events


def test_userinfo_that_is_not_ascii_is_percent_encoded(net_engine: fetchq.Engine, server: Server) -> None:
    import base64
    url = server.url("/echo").replace("http://", "http://us\u00e9r:p\u00fc@")
    r = net_engine.queue("p").get(url).result(timeout=TIMEOUT)
    sent = r.json()["headers"]["authorization"]
    assert sent == "Basic " + base64.b64encode("us\u00e9r:p\u00fc".encode()).decode()


def test_progress_must_be_callable(net_engine: fetchq.Engine, server: Server) -> None:
    with pytest.raises(TypeError):
        net_engine.queue("p").get(server.url("/json"), progress=True)  # type: ignore[arg-type]


def test_progress_callback_exception_is_logged_not_fatal(net_engine: fetchq.Engine, server: Server,
                                                         caplog: Any) -> None:
    def bad(a: int, b: Any) -> None:
        raise RuntimeError("progress boom")

    r = net_engine.queue("p").get(server.url("/drip?bytes=2000&chunk=1000&interval_ms=20"),
                                  progress=bad).result(timeout=TIMEOUT)
    assert len(r.body) == 2000
    assert "progress boom" in caplog.text


# -- cancellation in flight ---------------------------------------------------

def test_cancel_in_flight_request(net_engine: fetchq.Engine, server: Server) -> None:
    server.reset()
    q = net_engine.queue("stall", max_concurrent=4)
    futs = [q.get(server.url("/stall?i=%d" % i)) for i in range(3)]   # distinct: not coalesced
    wait_until(lambda: server.stats()["in_flight"] >= 3, "3 stalled requests")
    assert all(f.cancel() for f in futs)
    done, not_done = cf.wait(futs, timeout=TIMEOUT)
    assert not not_done and all(f.cancelled() for f in futs)
    wait_until(lambda: server.stats()["in_flight"] == 0, "the server to see the requests go")



@pytest.mark.parametrize("coalesce", [
    None,
    False,
])
def test_cancel_group_of_requests(net_engine: fetchq.Engine, server: Server, coalesce: Any) -> None:
    q = net_engine.queue("grp-%s" % coalesce, max_concurrent=2)     # 2 running, 3 queued
    extra = {} if coalesce is None else {"coalesce": coalesce}
    futs = [q.get(server.url("/delay?ms=30000&i=%d" % i), group="slow", **extra) for i in range(5)]
    other = net_engine.queue("grp-other")
    fast = other.get(server.url("/json?size=10"), group="fast")
    assert fast.result(timeout=TIMEOUT).status == 200
    wait_until(lambda: net_engine.stats()["queues"][q.name]["running"] == 2, "2 running")
    try:
        assert net_engine.cancel_group("slow") == 5
        cf.wait(futs, timeout=TIMEOUT)
        assert all(f.cancelled() for f in futs)
    finally:
        q.cancel_all()


def test_queue_limit_seen_from_the_server(net_engine: fetchq.Engine, server: Server) -> None:
    server.reset()
    q = net_engine.queue("limit", max_concurrent=3)
    futs = [q.get(server.url("/delay?ms=100&i=%d" % i)) for i in range(9)]
    assert all(f.result(timeout=TIMEOUT).status == 200 for f in futs)
    assert 1 <= server.stats()["max_in_flight"] <= 3


def test_identical_gets_are_coalesced(net_engine: fetchq.Engine, server: Server) -> None:
    server.reset()
    q = net_engine.queue("coalesce", max_concurrent=8)
    url = server.url("/delay?ms=300&key=coalesce")
    futs = [q.get(url) for _ in range(5)]
    assert futs[0].cancel()                       # detaches only that caller
    rs = [f.result(timeout=TIMEOUT) for f in futs[1:]]
    assert futs[0].cancelled()
    assert len({f.op_id for f in futs}) == 5
    assert all(r.status == 200 and r.json() == {"delayed": 300} for r in rs)
    assert server.stats()["by_path"].get("/delay") == 1
    server.reset()
    own = [q.get(url, coalesce=False) for _ in range(2)]
    assert all(f.result(timeout=TIMEOUT).status == 200 for f in own)
    assert server.stats()["by_path"].get("/delay") == 2


def test_retry(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("retry")
    r = q.get(server.url("/flaky?key=py-retry-1&fail=2"),
              retry={"max": 3, "base": 0.01}).result(timeout=TIMEOUT)
    assert r.status == 200 and r.json() == {"attempt": 3} and r.metrics["attempts"] == 3
    with pytest.raises(fetchq.HTTPError) as info:
        q.get(server.url("/flaky?key=py-retry-2&fail=5"),
              retry={"max": 1, "base": 0.01}).result(timeout=TIMEOUT)
    assert info.value.status == 503 and info.value.response.metrics["attempts"] == 2


def test_request_result_flows_into_a_python_body(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("flow")
    fetch = q.get(server.url("/json?size=300"))

    def count(op: fetchq.Op) -> Any:
        whole = op.dependency(fetch)
        assert whole is not None
        return [len(op.dependency_result(fetch)["items"]), whole.http_status,
                whole.headers["content-type"], len(whole.body) > 0]

    n, status, ctype, has_body = q.submit(count, pass_op=True, depends_on=fetch).result(timeout=TIMEOUT)
    assert n == len(fetch.result().json()["items"]) and status == 200
    assert ctype == "application/json" and has_body


def test_failed_request_fails_its_dependents(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("flow")
    bad = q.get(server.url("/status/500"))
    after = q.submit(lambda: 1, depends_on=bad)
    with pytest.raises(fetchq.DependencyError):
        after.result(timeout=TIMEOUT)


# -- search ---------------------------------------------------------------------

def expected_items(server: Server, tag: str, order: str = "desc") -> List[Dict[str, Any]]:
    items = server.get_json("/corpus?tag=" + tag)["results"]
    return sorted(items, key=lambda i: i["created_at"], reverse=(order == "desc"))


def test_search(net_engine: fetchq.Engine, server: Server) -> None:
    res = net_engine.queue("s").search("swift").result(timeout=TIMEOUT)
    want = expected_items(server, "swift")
    assert res["query"] == "swift" and res["count"] == len(want) > 0
    assert res["items"] == want


def test_search_options_override_config(net_engine: fetchq.Engine, server: Server) -> None:
    res = net_engine.queue("s").search("go", order="asc").result(timeout=TIMEOUT)
    assert res["items"] == expected_items(server, "go", "asc")
    res = net_engine.queue("s").search("go", url=server.url("/search?q={query}&rpp=2")).result(timeout=TIMEOUT)
    assert res["count"] == 2


def test_search_query_is_percent_encoded(net_engine: fetchq.Engine, server: Server) -> None:
    server.reset()
    res = net_engine.queue("s").search("a b&c=ü#").result(timeout=TIMEOUT)
    assert res["query"] == "a b&c=ü#" and res["count"] == 0
    assert "q=a%20b%26c%3D%C3%BC%23" in server.stats()["arrivals"][-1]


def test_search_errors(net_engine: fetchq.Engine) -> None:
    q = net_engine.queue("s")
    with pytest.raises(fetchq.HTTPError) as info:
        q.search("__fail").result(timeout=TIMEOUT)
    assert info.value.status == 500 and json.loads(info.value.body) == {"error": "injected failure"}
    with pytest.raises(fetchq.ParseError):
        q.search("__notarray").result(timeout=TIMEOUT)
    with pytest.raises(fetchq.ParseError):
        q.search("__bad").result(timeout=TIMEOUT)


def test_search_without_endpoint_is_invalid() -> None:
    with fetchq.Engine(workers=1) as e:
        with pytest.raises(fetchq.InvalidArgument, match="search"):
            e.queue("s").search("x")


def test_search_all_merges_dedupes_and_sorts(net_engine: fetchq.Engine, server: Server) -> None:
    children: List[Tuple[str, str, bool]] = []
    fut_box: List[Any] = []
    tags = ["swift", "c", "python", "swift"]
    f = net_engine.queue("sa", max_concurrent=2).search_all(
        tags, on_child=lambda r: children.append((r.query, r.outcome, bool(fut_box) and fut_box[0].done())))
    fut_box.append(f)
    res = f.result(timeout=TIMEOUT)
    merged: Dict[str, Dict[str, Any]] = {}
    for tag in ["swift", "c", "python"]:
        for item in server.get_json("/corpus?tag=" + tag)["results"]:
            merged.setdefault(item["id"], item)
    want = sorted(merged.values(), key=lambda i: i["created_at"], reverse=True)
    assert res["items"] == want and res["count"] == len(want)
    assert set(res["queries"]) == {"swift", "c", "python"}
    assert res["queries"]["c"] == {"count": len(server.get_json("/corpus?tag=c")["results"])}
    assert sorted(c[0] for c in children) == ["c", "python", "swift"]
    assert all(c[1] == "succeeded" and c[2] is False for c in children)


def test_remove_dependency_of_a_search_all_lets_its_queries_go(net_engine: fetchq.Engine) -> None:
    held = net_engine.queue("sa-held", max_concurrent=1)
    held.suspend()
    a = held.submit(lambda: "a")
    q = net_engine.queue("sa-dep", max_concurrent=2)
    f = q.search_all(["go", "c"], depends_on=[a])
    with pytest.raises(cf.TimeoutError):   # its queries wait for a too
        f.result(timeout=0.2)
    net_engine.remove_dependency(f, a)
    res = f.result(timeout=TIMEOUT)
    assert res["count"] > 0 and set(res["queries"]) == {"go", "c"}
    assert all(v["count"] > 0 for v in res["queries"].values()), res["queries"]
    assert net_engine.state(a) == "ready"
    held.resume()
    assert a.result(timeout=TIMEOUT) == "a"


def test_add_dependency_to_a_search_all_holds_back_its_queries(net_engine: fetchq.Engine, server: Server) -> None:
    """As with its "depends_on": the queries are not sent before the
    dependency ends (only the merge waited)."""
    held = net_engine.queue("sa-add-held", max_concurrent=1)
    held.suspend()
    a = held.submit(lambda: "a")
    q = net_engine.queue("sa-add", max_concurrent=2)
    q.suspend()
    f = q.search_all(["go", "c"])
    net_engine.add_dependency(f, a)
    server.reset()
    q.resume()
    with pytest.raises(cf.TimeoutError):
        f.result(timeout=0.3)
    assert server.stats()["requests"] == 0
    held.resume()
    res = f.result(timeout=TIMEOUT)
    assert set(res["queries"]) == {"go", "c"} and res["count"] > 0
    assert server.stats()["requests"] == 2


def test_search_all_partial_and_fail_fast(net_engine: fetchq.Engine) -> None:
    q = net_engine.queue("sa")
    res = q.search_all(["go", "__fail"]).result(timeout=TIMEOUT)
    assert res["queries"]["__fail"]["status"] == -11 and res["queries"]["__fail"]["http_status"] == 500
    assert res["queries"]["go"]["count"] == res["count"] > 0
    with pytest.raises(fetchq.HTTPError) as info:
        q.search_all(["go", "__fail"], fail_fast=True).result(timeout=TIMEOUT)
    # the search-all's own result has no HTTP status: no made-up Response of status 0
    assert (info.value.status, info.value.body, info.value.headers, info.value.response) == (0, b"", {}, None)
    assert 'query "__fail" failed' in str(info.value) and "HTTP status 500" in str(info.value)
    with pytest.raises(TypeError):
        q.search_all("swift")
    with pytest.raises(fetchq.InvalidArgument, match="^search_all needs at least one query$"):
        q.search_all([])


def test_search_all_cancel_cancels_children(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("sa-cancel", max_concurrent=2)
    f = q.search_all(["a", "b", "c"], url=server.url("/delay?ms=30000&q={query}"))
    wait_until(lambda: net_engine.stats()["queues"]["sa-cancel"]["running"] >= 1, "children to start")
    assert f.cancel()
    cf.wait([f], timeout=TIMEOUT)
    assert f.cancelled()
    net_engine.queue("sa-cancel").wait(timeout=TIMEOUT)
    s = net_engine.stats()["queues"]["sa-cancel"]
    assert s["running"] == 0 and s["queued"] == 0 and s["cancelled"] == 4


def test_gzip_body_matches_server_bytes(net_engine: fetchq.Engine, server: Server) -> None:
    import urllib.request
    with urllib.request.urlopen(server.url("/gzip"), timeout=TIMEOUT) as raw:
        want = gzip.decompress(raw.read())
    assert net_engine.queue("n").get(server.url("/gzip")).result(timeout=TIMEOUT).body == want


def test_many_requests_keep_alive(net_engine: fetchq.Engine, server: Server) -> None:
    server.reset()
    q = net_engine.queue("many", max_concurrent=6)
    futs = [q.get(server.url("/json?size=50"), params={"i": i}) for i in range(300)]
    assert all(f.result(timeout=60).status == 200 for f in futs)
    st = server.stats()
    assert st["requests"] == 300 and st["connections_total"] <= 12


def test_requests_check_the_body_and_build_the_engine_value_only_when_read(
        net_engine: fetchq.Engine, server: Server) -> None:
    """Requests ask the engine for "lazy_parse" (json() parses the body in
    Python): the body is still checked, and a dependent still gets the value."""
    q = net_engine.queue("lazy-parse")
    lazy = q.get(server.url("/json?size=400")).result(timeout=TIMEOUT)
    eager = q.get(server.url("/json?size=400"), lazy_parse=False, coalesce=False).result(timeout=TIMEOUT)
    assert lazy.parsed and eager.parsed
    assert lazy.json() == eager.json() and len(lazy.json()["items"]) > 0
    for lazy_parse in (True, False):
        with pytest.raises(fetchq.ParseError, match="not valid JSON"):
            q.get(server.url("/bytes?n=64"), parse="json", lazy_parse=lazy_parse).result(timeout=TIMEOUT)
    plain = q.get(server.url("/json?size=50"), parse="none").result(timeout=TIMEOUT)
    assert not plain.parsed and plain.json()["items"] is not None
    fetch = q.get(server.url("/json?size=200"), coalesce=False)
    seen = q.submit(lambda op: op.dependency_result(fetch), pass_op=True, depends_on=fetch)
    assert seen.result(timeout=TIMEOUT) == fetch.result().json()
    with pytest.raises(fetchq.InvalidArgument, match="lazy_parse"):
        q.get(server.url("/json"), lazy_parse="yes")


# -- many requests at once (fq_submit_requests) ------------------------------

def test_request_many_one_future_per_url_in_order(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("many", max_concurrent=4)
    server.reset()
    urls = [server.url("/echo?i=%d" % i) for i in range(150)]   # more than 2 batches of 64
    futs = q.request_many("POST", urls, headers={"X-Batch": "b"}, params={"q": "a b"},
                          json={"k": 1}, priority=4)
    assert len(futs) == 150
    ids = [f.op_id for f in futs]
    assert ids == sorted(ids) and len(set(ids)) == 150
    for i, f in enumerate(futs):
        echo = f.result(timeout=TIMEOUT).json()
        assert echo["method"] == "POST"
        assert echo["query"] == {"i": str(i), "q": "a b"}
        assert echo["headers"]["x-batch"] == "b"
        assert json.loads(echo["body"]) == {"k": 1}
    assert server.stats()["requests"] == 150
    assert net_engine.pending_count == 0


def test_get_many_coalesces_identical_urls(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("many")
    server.reset()
    futs = q.get_many([server.url("/json?size=200")] * 5)
    bodies = [f.result(timeout=TIMEOUT).json() for f in futs]
    assert all(b == bodies[0] for b in bodies)
    assert server.stats()["requests"] == 1
    assert q.get_many([]) == []


def test_request_many_rejects_everything_when_one_url_is_bad(net_engine: fetchq.Engine,
                                                              server: Server) -> None:
    q = net_engine.queue("many")
    server.reset()
    urls = [server.url("/echo?i=%d" % i) for i in range(10)]
    with pytest.raises(fetchq.InvalidArgument, match=r"urls\[3\]"):
        q.get_many(urls[:3] + ["ftp://127.0.0.1/x"] + urls[3:])
    with pytest.raises(fetchq.InvalidArgument, match="bogus"):
        q.get_many(urls, bogus=1)
    with pytest.raises(ValueError, match="NUL"):
        q.get_many(urls + ["http://127.0.0.1/\0x"])
    with pytest.raises(TypeError, match="single string"):
        q.get_many(urls[0])
    with pytest.raises(TypeError, match="use request"):
        q.get_many(urls, progress=lambda a, b: None)
    assert net_engine.pending_count == 0
    time.sleep(0.1)
    assert server.stats()["requests"] == 0


def test_request_many_on_a_closed_queue_or_engine(server: Server) -> None:
    e = fetchq.Engine(workers=2)
    q = e.queue("many")
    q.close()
    with pytest.raises(fetchq.StateError):
        q.get_many([server.url("/echo")])
    q2 = e.queue("other")
    e.close()
    with pytest.raises(fetchq.ShutdownError):
        q2.get_many([server.url("/echo")])
    assert e._core.violations == []


def test_request_many_stopped_part_way(net_engine: fetchq.Engine, server: Server,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The library returns fewer than n when the queue or engine stops taking
    work during the call: the submitted requests run, the others' futures
    fail at once. Here the real call is given only the first 64 URLs."""
    lib = net_engine._core.lib
    real = lib.fq_submit_requests

    def first_64(h: Any, req: Any, urls: Any, n: int, *rest: Any) -> int:
        return real(h, req, urls, min(n, 64), *rest)

    monkeypatch.setattr(lib, "fq_submit_requests", first_64)
    q = net_engine.queue("many")
    futs = q.get_many([server.url("/echo?i=%d" % i) for i in range(100)], coalesce=False)
    assert len(futs) == 100
    for i, f in enumerate(futs[:64]):
        assert f.result(timeout=TIMEOUT).json()["query"] == {"i": str(i)}
    for f in futs[64:]:
        assert f.done()
        with pytest.raises(fetchq.StateError):
            f.result(timeout=0)
    assert net_engine.pending_count == 0


def test_request_many_from_threads_with_cancels_and_close_exactly_once(server: Server) -> None:
    """4 threads submit batches while a fifth cancels at random and the
    engine closes at the end: every future resolves exactly once, cancel()
    == True means cancelled, the others succeed or were closed."""
    import random
    rng = random.Random(99)
    e = fetchq.Engine(workers=2, timeout_ms=20000)
    queues = [e.queue("t%d" % i, max_concurrent=4) for i in range(4)]
    lock = threading.Lock()
    resolutions: Dict[int, int] = {}
    futs: List[Any] = []
    cancel_true: List[Any] = []

    def count(f: Any) -> None:
        with lock:
            resolutions[id(f)] = resolutions.get(id(f), 0) + 1

    def submitter(k: int) -> None:
        for b in range(5):
            urls = [server.url("/delay?ms=%d&k=%d&b=%d&i=%d" % (i % 3, k, b, i)) for i in range(100)]
            batch = queues[k].get_many(urls, coalesce=False)
            for f in batch:
                f.add_done_callback(count)
            with lock:
                futs.extend(batch)

    def canceller() -> None:
        for _ in range(400):
            with lock:
                target = futs[rng.randrange(len(futs))] if futs else None
            if target is not None and target.cancel():
                with lock:
                    cancel_true.append(target)
            time.sleep(0.001)

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(4)]
    threads.append(threading.Thread(target=canceller))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
        assert not t.is_alive()
    e.close()                           # cancels what is still pending
    assert len(futs) == 2000
    done, not_done = cf.wait(futs, timeout=TIMEOUT)
    assert not not_done
    with lock:
        assert len(resolutions) == 2000 and set(resolutions.values()) == {1}
    assert cancel_true                  # the cancels did hit pending requests
    assert all(f.cancelled() for f in cancel_true)
    for f in futs:
        if not f.cancelled():
            assert f.exception() is None and f.result().status == 200
    assert e._core.violations == []


# -- found by mutation testing (review 34) -------------------------------------

def test_search_all_children_that_failed_or_were_cancelled(net_engine: fetchq.Engine, server: Server) -> None:
    """on_child's Result: ok only for a child that succeeded; exception() is
    HTTPError with the HTTP status and body for one the server failed, and
    fetchq.Cancelled for one cancelled (docs/python.md, "Result")."""
    kids: List[fetchq.Result] = []
    q = net_engine.queue("sa-fail", max_concurrent=1)
    q.search_all(["__fail", "swift"], on_child=kids.append).result(timeout=TIMEOUT)
    by_query = {c.query: c for c in kids}
    failed, fine = by_query["__fail"], by_query["swift"]
    assert fine.ok and fine.exception() is None
    assert not failed.ok and failed.outcome == "failed"
    exc = failed.exception()
    assert isinstance(exc, fetchq.HTTPError) and exc.code == fetchq.HTTPError.code
    assert exc.status == 500 == failed.http_status and exc.body == failed.body and exc.body
    assert exc.headers == failed.headers and exc.headers["content-type"] == "application/json"

    kids.clear()
    held = net_engine.queue("sa-cancel", max_concurrent=1)
    held.suspend()
    f = held.search_all(["swift", "c"], on_child=kids.append)
    assert f.cancel()
    held.resume()
    with pytest.raises(cf.CancelledError):
        f.result(timeout=TIMEOUT)
    assert sorted(c.query for c in kids) == ["c", "swift"]
    for c in kids:
        assert c.outcome == "cancelled" and not c.ok
        assert isinstance(c.exception(), fetchq.Cancelled)
