"""How responses are received: framing, trailers, header lines and size caps,
against a raw server that sends exactly the bytes each test scripts (the
third review, twenty-sixth session)."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

import pytest

import fetchq

from conftest import TIMEOUT

# A scripted answer: the bytes, or a function of the connection and the
# request head that writes the answer itself (it may stream until the client
# goes away); it returns whether the connection stays open.
Answer = Union[bytes, Callable[[socket.socket, str], bool]]


class Listener:
    """A TCP listener on 127.0.0.1 handing each connection to `handle` on a
    thread of its own, for at most 120 s or until `stop`."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        deadline = time.monotonic() + 120
        while not self.stopping and time.monotonic() < deadline:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def stop(self) -> None:
        self.stopping = True
        self.thread.join(5)
        self.listener.close()


class RawServer(Listener):
    """HTTP/1.1 on 127.0.0.1 answering each path with its scripted bytes
    (keep-alive unless the answer closes), counting requests per path."""

    def __init__(self, answers: Dict[str, Answer], tls: "Optional[ssl.SSLContext]" = None) -> None:
        self.answers = answers
        self.tls = tls
        self.requests: List[str] = []
        self.heads: List[str] = []
        super().__init__()

    def url(self, path: str) -> str:
        return "%s://127.0.0.1:%d%s" % ("https" if self.tls else "http", self.port, path)

    def count(self, path: str) -> int:
        return sum(1 for p in self.requests if p == path)

    def handle(self, conn: socket.socket) -> None:
        conn.settimeout(TIMEOUT)
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                return
        buf = b""
        with conn:
            for _ in range(100):                       # requests on this connection
                while b"\r\n\r\n" not in buf:
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                self.requests.append(path)
                self.heads.append(head.decode("latin-1"))
                answer = self.answers[path]
                try:
                    if callable(answer):
                        if not answer(conn, head.decode("latin-1")):
                            return
                        continue
                    conn.sendall(answer)
                except OSError:
                    return


@pytest.fixture
def engine() -> Iterator[fetchq.Engine]:
    e = fetchq.Engine(timeout_ms=10000)
    yield e
    e.close()
    assert e._core.violations == []


OK_JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def first_request_only() -> Callable[[socket.socket, str], bool]:
    """An answer that answers the first request on each connection and
    reads the next, then closes it without an answer."""
    served: Dict[int, int] = {}                       # requests per connection (client port)

    def answer(conn: socket.socket, head: str) -> bool:
        port = conn.getpeername()[1]
        served[port] = served.get(port, 0) + 1
        if served[port] == 1:
            conn.sendall(OK_JSON)
            return True
        return False

    return answer


def serve(answers: Dict[str, Answer], tls: "Optional[ssl.SSLContext]" = None) -> Iterator[RawServer]:
    s = RawServer(answers, tls)
    try:
        yield s
    finally:
        s.stop()


def test_trailer_fields_are_not_merged_into_the_headers(engine: fetchq.Engine) -> None:
    """A trailer made the response cacheable and parsed it as JSON (RFC 9110
    §6.5.1: not merged unless the field's definition allows it)."""
    body = b'{"a": 1}'
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n"
              b"Trailer: Cache-Control, Content-Type\r\n\r\n"
              + b"%x\r\n" % len(body) + body + b"\r\n0\r\n"
              b"Cache-Control: max-age=3600\r\nContent-Type: application/json\r\nX-T: t\r\n\r\n")
    for s in serve({"/t": answer}):
        q = engine.queue("t")
        for _ in range(2):
            r = q.get(s.url("/t")).result(timeout=TIMEOUT)
            assert r.status == 200 and r.body == body
            assert r.headers.get("content-type") == "text/plain"
            assert "cache-control" not in r.headers and "x-t" not in r.headers
            assert r.metrics["from_cache"] is False
        assert s.count("/t") == 2                     # the trailer did not make it cacheable


@pytest.mark.parametrize("value", [b"0x12", b"1 8", b"2, 18", b"18\r\nContent-Length: 2", b"+18",
                                   b"99999999999999999999999", b""])
def test_an_invalid_content_length_fails_the_response(engine: fetchq.Engine, value: bytes) -> None:
    """libcurl framed the body by the value's leading digits ("0x12": an
    empty 200, "2, 18": 2 bytes); RFC 9112 §6.3: an unrecoverable error."""
    body = b'{"items": [1, 2]}\n'
    assert len(body) == 18
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + value + \
        b"\r\nConnection: close\r\n\r\n" + body
    for s in serve({"/cl": answer}):
        with pytest.raises(fetchq.NetworkError, match="Content-Length"):
            engine.queue("cl").get(s.url("/cl")).result(timeout=TIMEOUT)


@pytest.mark.parametrize("value", [b"18, 18\r\nContent-Length: 18", b"000000000000000000000018",
                                   b"18,,18", b"18, , 18", b"18,"])
def test_a_valid_content_length_is_accepted(engine: fetchq.Engine, value: bytes) -> None:
    """Repeated equal values, leading zeros, and empty list elements (RFC 9110 §5.6.1)."""
    body = b'{"items": [1, 2]}\n'
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + value
              + b"\r\n\r\n" + body)
    for s in serve({"/cl": answer}):
        assert engine.queue("cl").get(s.url("/cl")).result(timeout=TIMEOUT).json() == {"items": [1, 2]}


def test_a_followed_redirects_body_counts_against_the_cap(engine: fetchq.Engine) -> None:
    """GET and POST redirects are followed by libcurl, which read their whole
    body (200 MB, or a chunked body for ever) past max_response_bytes."""
    streamed: List[int] = []

    def endless_chunked(conn: socket.socket, head: str) -> bool:
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /ok\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n" % 65536 + b"x" * 65536 + b"\r\n"
        sent, end = 0, time.monotonic() + 15
        while time.monotonic() < end:                 # until the client goes away
            conn.sendall(chunk)
            sent += 65536
            streamed.append(sent)
        return False

    big = b"HTTP/1.1 302 Found\r\nLocation: /ok\r\nContent-Length: 5000000\r\n\r\n" + b"x" * 5_000_000
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    for s in serve({"/big": big, "/endless": endless_chunked, "/ok": ok}):
        q = engine.queue("r")
        for method in ("GET", "POST"):
            with pytest.raises(fetchq.TooLarge):
                q.request(method, s.url("/big"), max_response_bytes=100_000).result(timeout=TIMEOUT)
        t0 = time.monotonic()
        with pytest.raises(fetchq.TooLarge):
            q.get(s.url("/endless"), max_response_bytes=100_000, timeout_ms=0).result(timeout=TIMEOUT)
        assert time.monotonic() - t0 < 5
        assert s.count("/ok") == 0
        # A redirect body within the cap is still read and the redirect followed.
        small = b"HTTP/1.1 302 Found\r\nLocation: /ok\r\nContent-Length: 1000\r\n\r\n" + b"y" * 1000
        s.answers["/small"] = small
        assert q.get(s.url("/small"), max_response_bytes=100_000).result(timeout=TIMEOUT).json() == {}


def test_malformed_header_lines_are_dropped_and_a_bare_cr_is_a_space(engine: fetchq.Engine) -> None:
    answer = (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx y: 1\r\nx-bad : 2\r\n: 3\r\nX-Tab\t: 4\r\n"
              b"X-CR: one\rtwo\r\nX-Good: 5\r\nBad Name: b\r\n folded\r\n\r\n{}")
    for s in serve({"/h": answer}):
        r = engine.queue("h").get(s.url("/h")).result(timeout=TIMEOUT)
        assert {k: v for k, v in r.headers.items() if k.startswith("x") or not k} == \
            {"x-cr": "one two", "x-good": "5"}


def test_a_response_header_line_over_libcurls_limit_is_too_large_and_not_retried(
        engine: fetchq.Engine) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Big: " + b"b" * 150_000 + b"\r\n\r\n{}"
    for s in serve({"/big-header": answer}):
        with pytest.raises(fetchq.TooLarge, match="100 KiB"):
            engine.queue("h").get(s.url("/big-header"), retry={"max": 2, "base": 0.01}).result(timeout=TIMEOUT)
        assert s.count("/big-header") == 1


def test_a_parse_error_keeps_the_response(engine: fetchq.Engine) -> None:
    """The exception carried no status, headers or body (the C result has them)."""
    page = b"<html>not json</html>"
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(page) + page
    for s in serve({"/html": answer}):
        with pytest.raises(fetchq.ParseError) as info:
            engine.queue("p").get(s.url("/html"), parse="json").result(timeout=TIMEOUT)
        e = info.value
        assert e.status == 200 and e.body == page and e.headers["content-type"] == "text/html"
        assert e.response is not None and e.response.body == page


def test_a_request_curl_would_send_again_is_sent_again_only_if_idempotent(engine: fetchq.Engine) -> None:
    """libcurl 7.88 sends any request again on a new connection when a reused
    one closes before the first byte of an answer. The server may have acted
    on it: a POST (or PATCH) is not sent again (RFC 9112 §9.3.1.1) unless the
    retry policy allows any method; a GET still is."""
    for s in serve({"/order": first_request_only()}):
        q = engine.queue("resend", max_concurrent=1)
        for method in ("POST", "PATCH"):
            before = s.count("/order")
            assert q.request(method, s.url("/order"), json={"pay": 1}).result(timeout=TIMEOUT).status == 200
            with pytest.raises(fetchq.NetworkError, match="not sent again"):
                q.request(method, s.url("/order"), json={"pay": 2}).result(timeout=TIMEOUT)
            assert s.count("/order") == before + 2    # never a third
        # The retry policy may send it again: counted as an attempt.
        before = s.count("/order")
        assert q.request("POST", s.url("/order"), json={"pay": 3}).result(timeout=TIMEOUT).status == 200
        r = q.request("POST", s.url("/order"), json={"pay": 4},
                      retry={"max": 1, "base": 0.01, "any_method": True}).result(timeout=TIMEOUT)
        assert r.status == 200 and r.metrics["attempts"] == 2
        assert s.count("/order") == before + 3
    for s in serve({"/item": first_request_only()}):      # a server of its own: no connection to reuse yet
        # A GET is sent again by libcurl on a new connection, as before.
        q = engine.queue("resend-get", max_concurrent=1)
        assert q.get(s.url("/item")).result(timeout=TIMEOUT).status == 200
        r = q.get(s.url("/item")).result(timeout=TIMEOUT)
        assert r.status == 200 and r.metrics["attempts"] == 1
        assert s.count("/item") == 3


def test_an_unsolicited_101_fails_at_once(engine: fetchq.Engine) -> None:
    """fetchq never asks for an upgrade: a 101 to a plain GET waited on the
    connection until timeout_ms (for ever without one) and ended as a timeout."""
    def switch(conn: socket.socket, head: str) -> bool:
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        time.sleep(3)                                 # keeps the connection open
        return False

    for s in serve({"/ws": switch}):
        started = time.monotonic()
        with pytest.raises(fetchq.NetworkError, match="switched protocols"):
            engine.queue("101").get(s.url("/ws"), timeout_ms=20_000).result(timeout=TIMEOUT)
        assert time.monotonic() - started < 2.5


def test_response_headers_over_libcurls_total_are_too_large_and_not_retried(engine: fetchq.Engine) -> None:
    """300 header lines of 1 KB pass libcurl's 100 KiB per line but not its
    300 KiB in all: FQ_ERR_TOO_LARGE, as for one long line, not a network
    error retried."""
    lines = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1024) for i in range(300))
    answer = b"HTTP/1.1 200 OK\r\n" + lines + b"Content-Length: 2\r\n\r\n{}"
    for s in serve({"/many": answer}):
        with pytest.raises(fetchq.TooLarge, match="Too large response headers"):
            engine.queue("hdr").get(s.url("/many"), retry={"max": 2, "base": 0.01}).result(timeout=TIMEOUT)
        assert s.count("/many") == 1


def test_a_tls_handshake_reset_by_the_server_is_a_network_error_and_retried(engine: fetchq.Engine) -> None:
    """A server (a load balancer under load) that resets or closes the
    connection during the TLS handshake: FQ_ERR_TLS, never retried, where
    the same over http is FQ_ERR_NETWORK and retried."""
    accepted: List[int] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def reset_each() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            accepted.append(1)
            conn.settimeout(2)
            try:
                conn.recv(4096)                       # the ClientHello
            except OSError:
                pass
            if len(accepted) % 2:                     # a reset, then a plain close
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.close()

    thread = threading.Thread(target=reset_each, daemon=True)
    thread.start()
    try:
        for _ in range(2):
            before = len(accepted)
            with pytest.raises(fetchq.NetworkError):
                engine.queue("tls").get("https://127.0.0.1:%d/" % port,
                                        retry={"max": 2, "base": 0.01}).result(timeout=TIMEOUT)
            assert len(accepted) - before == 3        # retried twice
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_running_out_of_descriptors_is_said_in_the_message(tmp_path: Any) -> None:
    """curl says "Couldn't connect to server" for a refused port and for a
    process out of file descriptors alike; the message now names the
    system's reason."""
    script = tmp_path / "emfile.py"
    script.write_text(
        "import os, socket, sys\n"
        "import fetchq\n"
        "listener = socket.socket(); listener.bind(('127.0.0.1', 0)); listener.listen(4)\n"
        "url = 'http://127.0.0.1:%d/' % listener.getsockname()[1]\n"
        "engine = fetchq.Engine(timeout_ms=5000)\n"
        "q = engine.queue('q')\n"
        "held = []\n"
        "try:\n"
        "    while len(held) < 100000:\n"
        "        held.append(os.open(os.devnull, os.O_RDONLY))\n"
        "except OSError:\n"
        "    pass\n"
        "try:\n"
        "    q.get(url).result(timeout=20)\n"
        "    print('no error')\n"
        "except fetchq.NetworkError as e:\n"
        "    print(e)\n"
        "for fd in held:\n"
        "    os.close(fd)\n"
        "engine.close()\n")
    import resource
    import subprocess
    import sys

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    import os
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(fetchq.__file__)),
               FETCHQ_LIBRARY=fetchq.library_path())      # this binding and library, not an installed one
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         preexec_fn=low_limit, env=env)
    assert out.returncode == 0, out.stderr
    assert "Too many open files" in out.stdout, out.stdout


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_408_on_a_reused_idle_connection_sends_the_request_again(engine: fetchq.Engine, method: str) -> None:
    """A server that times an idle keep-alive connection out sends 408 and
    closes it (RFC 9110 §15.5.9); a request put on that connection read the
    408 as its answer though the server never received it. It is sent again,
    once, on a new connection, whatever its method."""

    def answer_then_time_out(conn: socket.socket, head: str) -> bool:
        conn.sendall(OK_JSON)
        time.sleep(0.2)
        conn.sendall(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        return False

    for s in serve({"/a": answer_then_time_out}):
        q = engine.queue("408")
        assert q.request(method, s.url("/a"), data=b"x" if method == "POST" else None).result(timeout=TIMEOUT).status == 200
        time.sleep(1.2)
        r = q.request(method, s.url("/a"), data=b"x" if method == "POST" else None).result(timeout=TIMEOUT)
        assert r.status == 200 and r.metrics["reused_connection"] is False
        assert s.count("/a") == 2


def test_a_408_on_a_new_connection_is_the_answer(engine: fetchq.Engine) -> None:
    """Sent again once only: a 408 on the new connection is the result."""
    answer = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    for s in serve({"/t": answer}):
        with pytest.raises(fetchq.HTTPError) as caught:
            engine.queue("408b").get(s.url("/t")).result(timeout=TIMEOUT)
        assert caught.value.status == 408
        assert s.count("/t") == 1


def test_a_timeout_after_a_redirect_says_the_whole_time(engine: fetchq.Engine) -> None:
    """curl's "timed out after N milliseconds" counts from the last hop."""
    def slow_redirect(conn: socket.socket, head: str) -> bool:
        time.sleep(0.5)
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /slow\r\nContent-Length: 0\r\n\r\n")
        return True

    def stall(conn: socket.socket, head: str) -> bool:
        time.sleep(3)
        return False

    for s in serve({"/r": slow_redirect, "/slow": stall}):
        with pytest.raises(fetchq.Timeout, match=r"ms in all, timeout_ms 1000\)"):
            engine.queue("tr").get(s.url("/r"), timeout_ms=1000).result(timeout=TIMEOUT)


def test_a_location_that_does_not_parse_is_the_servers_fault(engine: fetchq.Engine) -> None:
    """A control character in a redirect's Location failed GET and POST
    with FQ_ERR_INVALID, the caller's status (the fifth review), and PUT
    with FQ_ERR_NETWORK: every method now says the server's doing."""
    bad = b"HTTP/1.1 302 Found\r\nLocation: /next\tpage\r\nContent-Length: 0\r\n\r\n"
    for s in serve({"/r": bad}):
        q = engine.queue("badloc")
        for method in ("GET", "POST", "PUT"):
            with pytest.raises(fetchq.NetworkError) as caught:
                q.request(method, s.url("/r"), retry={"max": 0}).result(timeout=TIMEOUT)
            assert caught.value.code == -12
            assert not isinstance(caught.value, ValueError)
            if method == "PUT":  # fetchq's own follower
                assert "a Location with a control character: /next\\x09page" in str(caught.value)
        assert s.count("/r") == 3  # nothing retried: "max" 0


class ConnectProxy(Listener):
    """An HTTP proxy on 127.0.0.1 that only tunnels (CONNECT)."""

    def __init__(self) -> None:
        super().__init__()
        self.url = "http://127.0.0.1:%d" % self.port

    def handle(self, client: socket.socket) -> None:
        client.settimeout(TIMEOUT)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                client.close()
                return
            head += chunk
        target = head.split(b" ")[1].decode()
        host, port = target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

        def pump(a: socket.socket, b: socket.socket) -> None:
            try:
                while True:
                    data = a.recv(65536)
                    if not data:
                        break
                    b.sendall(data)
            except OSError:
                pass
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        pump(client, upstream)


def test_a_post_through_a_connect_tunnel_is_not_sent_again_either(tmp_path: Any) -> None:
    """Through an HTTPS proxy libcurl opens a new tunnel to send the request
    again, and the proxy's "200 Connection established" counted as an
    answer: the POST reached the server twice (the review of the session's
    own changes)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    context.set_alpn_protocols(["http/1.1"])
    proxy = ConnectProxy()
    try:
        for s in serve({"/order": first_request_only()}, tls=context):
            with fetchq.Engine(timeout_ms=10000, proxy=proxy.url, ca_file=str(cert)) as e:
                q = e.queue("tunnel", max_concurrent=1)
                assert q.request("POST", s.url("/order"), json={"pay": 1}).result(timeout=TIMEOUT).status == 200
                with pytest.raises(fetchq.NetworkError, match="not sent again"):
                    q.request("POST", s.url("/order"), json={"pay": 2}).result(timeout=TIMEOUT)
            assert s.count("/order") == 2
    finally:
        proxy.stop()


def test_the_408_resend_stays_within_timeout_ms(engine: fetchq.Engine) -> None:
    """The request sent again after a 408 took a whole timeout_ms of its
    own: an attempt could last twice the limit."""
    served: Dict[int, int] = {}

    def slow(conn: socket.socket, head: str) -> bool:
        port = conn.getpeername()[1]
        served[port] = served.get(port, 0) + 1
        if served[port] == 1 and len(served) == 1:
            conn.sendall(OK_JSON)                     # warms a kept-alive connection
            return True
        time.sleep(1.5)
        if served[port] == 2:
            conn.sendall(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return False
        conn.sendall(OK_JSON)
        return True

    for s in serve({"/s": slow}):
        q = engine.queue("408t", max_concurrent=1)
        assert q.get(s.url("/s")).result(timeout=TIMEOUT).status == 200
        # 1.5 s to the 408, then 1.5 s to the resend's 200: within one
        # timeout_ms of 2 s that is a Timeout; a resend with a limit of its
        # own would end 200.
        with pytest.raises(fetchq.Timeout):
            q.get(s.url("/s"), timeout_ms=2000).result(timeout=TIMEOUT)


def test_json_content_types_that_auto_parses(engine: fetchq.Engine) -> None:
    """text/json and application/x-json were left unparsed by "auto" (the
    fifth review); text/plain still is."""
    def answer(ctype: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\nContent-Length: 8\r\n\r\n{\"a\": 1}"
    types = {"/tj": b"text/json", "/xj": b"Application/X-JSON; charset=utf-8", "/pj": b"application/problem+json",
             "/tp": b"text/plain"}
    for s in serve({path: answer(t) for path, t in types.items()}):
        q = engine.queue("ctypes")
        for path in ("/tj", "/xj", "/pj"):
            r = q.get(s.url(path)).result(timeout=TIMEOUT)
            assert r.parsed and r.json() == {"a": 1}
        assert not q.get(s.url("/tp")).result(timeout=TIMEOUT).parsed


def test_a_byte_order_mark_is_named_in_the_parse_error(engine: fetchq.Engine) -> None:
    """jansson's message quoted the invisible U+FEFF ("invalid token near '\\ufeff'")."""
    body = b'\xef\xbb\xbf{"a": 1}'
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    for s in serve({"/bom": answer}):
        with pytest.raises(fetchq.ParseError, match="starts with a UTF-8 byte order mark") as caught:
            engine.queue("bom").get(s.url("/bom")).result(timeout=TIMEOUT)
        assert "\ufeff" not in str(caught.value)


def test_credentials_in_a_location_go_only_to_the_first_origin(engine: fetchq.Engine) -> None:
    """libcurl (GET, POST) sends the credentials of a followed Location only
    to the first request's origin; fetchq's own follower (PUT, PATCH,
    DELETE) sent them to any host (the fifth review). Now both alike."""
    def auth_of(s: RawServer, path: str) -> List[str]:
        return [line for head in s.heads if head.split(" ")[1] == path
                for line in head.split("\r\n") if line.lower().startswith("authorization:")]

    for other in serve({"/elsewhere": OK_JSON}):
        for s in serve({}):
            s.answers["/away"] = (b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://u:pw@127.0.0.1:%d"
                                  b"/elsewhere\r\nContent-Length: 0\r\n\r\n" % other.port)
            s.answers["/here"] = (b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://u:pw@127.0.0.1:%d"
                                  b"/same\r\nContent-Length: 0\r\n\r\n" % s.port)
            s.answers["/same"] = OK_JSON
            # Absolute, to the first origin, without credentials: the first
            # URL's go on (as libcurl keeps its login there).
            s.answers["/kept"] = (b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:%d"
                                  b"/same2\r\nContent-Length: 0\r\n\r\n" % s.port)
            s.answers["/same2"] = OK_JSON
            q = engine.queue("userinfo")
            for method in ("GET", "PUT"):
                other.heads.clear()
                s.heads.clear()
                assert q.request(method, s.url("/away")).result(timeout=TIMEOUT).status == 200
                assert q.request(method, s.url("/here")).result(timeout=TIMEOUT).status == 200
                assert len(other.heads) == 1 and auth_of(other, "/elsewhere") == [], method
                assert auth_of(s, "/same") == ["Authorization: Basic dTpwdw=="], method
                with_login = s.url("/kept").replace("http://", "http://u:pw@")
                assert q.request(method, with_login).result(timeout=TIMEOUT).status == 200
                assert auth_of(s, "/same2") == ["Authorization: Basic dTpwdw=="], method


def test_many_repeated_response_headers_are_joined_in_order(engine: fetchq.Engine) -> None:
    """Repeated names are joined with ", " in arrival order (joined once
    all are known now: joining as each came was quadratic, the fifth
    review); other names stay as sent."""
    lines = b"".join(b"X-N: %d\r\n" % i for i in range(3000))
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + lines
              + b"Y: a\r\nX-Once: b\r\ny: c\r\nContent-Length: 2\r\n\r\n{}")
    for s in serve({"/h": answer}):
        r = engine.queue("hdrs").get(s.url("/h")).result(timeout=TIMEOUT)
        assert r.headers["x-n"] == ", ".join(str(i) for i in range(3000))
        assert r.headers["y"] == "a, c"
        assert r.headers["x-once"] == "b"


def test_a_request_with_many_headers_sends_them_all_in_order(engine: fetchq.Engine) -> None:
    """The header list is built at its tail (curl_slist_append walks the
    list it is given: n headers took n²/2 steps on the transfer thread)."""
    headers = {"X-H%05d" % i: str(i) for i in range(20000)}
    for s in serve({"/many": OK_JSON}):
        assert engine.queue("many").get(s.url("/many"), headers=headers).result(timeout=TIMEOUT).status == 200
        sent = [line for line in s.heads[0].split("\r\n") if line.startswith("X-H")]
        assert sent == ["X-H%05d: %d" % (i, i) for i in range(20000)]


# -- found by mutation testing (review 34) -------------------------------------

def _plain(status: bytes, ctype: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (status, ctype, len(body), body)


def test_text_reads_the_charset_parameter_as_http_writes_it(engine: fetchq.Engine) -> None:
    """Response.text: a parameter name is case-insensitive and its value may
    be a quoted string (RFC 9110, 5.6.6); without a charset the body is
    UTF-8 (docs/python.md)."""
    latin = "caf\u00e9".encode("latin-1")
    answers: Dict[str, Answer] = {
        "/none": _plain(b"200 OK", b"text/plain", "caf\u00e9".encode("utf-8")),
        "/name": _plain(b"200 OK", b"text/plain; Charset=latin-1", latin),
        "/quoted": _plain(b"200 OK", b'text/plain; charset="latin-1"', latin),
    }
    for s in serve(answers):
        q = engine.queue("charset")
        for path in answers:
            r = q.get(s.url(path)).result(timeout=TIMEOUT)
            assert r.text == "caf\u00e9", path


def test_ok_is_true_for_a_2xx_status_only(engine: fetchq.Engine) -> None:
    """docs/python.md: Response.ok is True for a 2xx status only, also for a
    status that accept_status accepted."""
    answers: Dict[str, Answer] = {
        "/299": _plain(b"299 Fine", b"application/json", b"{}"),
        "/300": _plain(b"300 Multiple Choices", b"application/json", b"{}"),
    }
    for s in serve(answers):
        q = engine.queue("ok")
        r = q.get(s.url("/299")).result(timeout=TIMEOUT)
        assert r.status == 299 and r.ok
        r = q.get(s.url("/300"), accept_status=[300]).result(timeout=TIMEOUT)
        assert r.status == 300 and not r.ok
