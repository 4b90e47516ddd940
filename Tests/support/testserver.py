#!/usr/bin/env python3
"""fetchq fault-injecting HTTP/1.1 test server (Python standard library only).

One server for the Swift, C and Python suites. It speaks HTTP/1.1 with
keep-alive over raw asyncio transports, so that every route can control the
socket: delay, stall, drip, close mid-body, reset, lie about Content-Length.
Routes are documented in README.md next to this file.

    python3 Tests/support/testserver.py [--host 127.0.0.1] [--port 0]
        [--port-file PATH] [--corpus test|demo] [--files DIR]
        [--max-seconds 900] [--parent-pid PID] [--tls-cert F --tls-key K]

After listening it prints ``PORT <n>`` on stdout and, with --port-file, writes
the number to that file atomically. It exits after --max-seconds, on
SIGTERM/SIGINT, and when --parent-pid no longer exists.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import email.utils
import gzip
import json
import os
import random
import signal
import socket
import ssl
import struct
import sys
import time
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus as corpus_mod  # noqa: E402

# ----------------------------------------------------------------------------
# limits (every loop in the server is bounded by one of these or by the
# server's own lifetime, --max-seconds)

MAX_HEAD = 64 * 1024                 # request line + headers
MAX_BODY = 256 * 1024 * 1024         # request body
MAX_REQUESTS_PER_CONN = 10_000_000
MAX_CHUNKS = 1_000_000               # chunks in one chunked request body
MAX_GEN = 512 * 1024 * 1024          # largest generated response body
MAX_DELAY_MS = 600_000
WRITE_SLICE = 256 * 1024

JSON = "application/json"
OCTET = "application/octet-stream"

# Byte i of every generated binary body is i % 251 (a prime, so a dropped or
# repeated block of any power-of-two size shows up). BLOCK is a whole number of
# periods, so consecutive BLOCK-sized slices continue the pattern.
PATTERN_PERIOD = 251
BLOCK = bytes(range(PATTERN_PERIOD)) * 4096          # ~1 MiB

LAST_MODIFIED = "Wed, 01 Jan 2025 00:00:00 GMT"
LAST_MODIFIED_TS = email.utils.parsedate_to_datetime(LAST_MODIFIED).timestamp()


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Status %d" % status


_date_cache = [0, b""]


def http_date() -> bytes:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = email.utils.formatdate(now, usegmt=True).encode()
    return _date_cache[1]


def jbytes(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def json_padded(n: int) -> bytes:
    """A body of exactly n bytes; a valid JSON object whenever n >= 2."""
    if n >= 11:
        return b'{"drip":"' + b"x" * (n - 11) + b'"}'
    if n >= 2:
        return b"{}" + b" " * (n - 2)
    return b" " * max(n, 0)


def pattern_bytes(n: int) -> bytes:
    """The deterministic binary body: byte i is i % 251."""
    if n <= len(BLOCK):
        return BLOCK[:n]
    full, rem = divmod(n, len(BLOCK))
    return BLOCK * full + BLOCK[:rem]


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def qint(query: dict, name: str, default: int, lo: int, hi: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise HttpError(400, "%s must be an integer" % name) from None
    if v < lo or v > hi:
        raise HttpError(400, "%s must be between %d and %d" % (name, lo, hi))
    return v


# ----------------------------------------------------------------------------
# shared state


class Stats:
    def __init__(self) -> None:
        self.generation = 0
        self.reset()
        self.in_flight = 0
        self.open_connections = 0

    def reset(self) -> None:
        self.generation += 1
        self.requests = 0
        self.max_in_flight = getattr(self, "in_flight", 0)
        self.connections_total = 0
        self.arrivals: collections.deque = collections.deque(maxlen=1000)
        self.by_path: dict[str, int] = {}
        self.last_headers: dict[str, str] = {}
        self.headers_log: collections.deque = collections.deque(maxlen=50)
        # per-key state of /flaky, /retry-after, /etag, /cache
        self.keys: dict[tuple, int] = {}

    def bump(self, route: str, key: str) -> int:
        k = (route, key)
        n = self.keys.get(k, 0) + 1
        self.keys[k] = n
        return n

    def snapshot(self) -> dict:
        return {
            "requests": self.requests,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "open_connections": self.open_connections,
            "connections_total": self.connections_total,
            "arrivals": list(self.arrivals),
            "by_path": dict(self.by_path),
            "last_headers": self.last_headers,
            "headers_log": list(self.headers_log),
        }


STATS = Stats()


class Request:
    __slots__ = ("method", "target", "path", "query", "headers", "body",
                 "version", "keep_alive")

    def __init__(self, method, target, path, query, headers, version):
        self.method = method
        self.target = target
        self.path = path
        self.query = query
        self.headers = headers
        self.body = b""
        self.version = version
        self.keep_alive = True


class Response:
    __slots__ = ("status", "body", "ctype", "headers")

    def __init__(self, status: int = 200, body: bytes = b"", ctype: str | None = JSON,
                 headers: list | None = None):
        self.status = status
        self.body = body
        self.ctype = ctype
        self.headers = headers


# Marker returned by a handler that already wrote a complete response.
SENT = Response(0)


def jresp(obj, status: int = 200, headers: list | None = None) -> Response:
    return Response(status, jbytes(obj), JSON, headers)


def build_head(status: int, headers: list, keep_alive: bool, http10: bool = False) -> bytes:
    parts = ["HTTP/1.1 %d %s\r\n" % (status, reason(status))]
    for name, value in headers:
        parts.append("%s: %s\r\n" % (name, value))
    parts.append("Server: fetchq-testserver\r\nDate: ")
    head = "".join(parts).encode("latin-1") + http_date()
    if not keep_alive:
        head += b"\r\nConnection: close"
    elif http10:
        head += b"\r\nConnection: keep-alive"
    return head + b"\r\n\r\n"


# ----------------------------------------------------------------------------
# connection


class ConnectionGone(Exception):
    pass


class Conn(asyncio.Protocol):
    """One client connection: a small buffered reader plus the request loop."""

    def __init__(self, server: "Server"):
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.eof = False
        self.lost = False
        self._data_waiter: asyncio.Future | None = None
        self._drain_waiter: asyncio.Future | None = None
        self._paused = False
        self.gone: asyncio.Future = self.loop.create_future()
        self.counted = False
        self.count_generation = 0
        self.task: asyncio.Task | None = None

    # -- protocol callbacks ------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=0, low=0)
        self._count(True)
        self.server.conns.add(self)
        self.task = self.loop.create_task(self.run())

    def data_received(self, data) -> None:
        self.buf += data
        w = self._data_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def eof_received(self):
        self.eof = True
        self._wake()
        # Keep a half-closed TCP connection writable; TLS cannot do that.
        return not self.server.tls

    def connection_lost(self, exc) -> None:
        self.lost = True
        self.eof = True
        self._wake()
        self._count(False)
        self.server.conns.discard(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        w = self._drain_waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- helpers -------------------------------------------------------------

    def _wake(self) -> None:
        for w in (self._data_waiter, self._drain_waiter):
            if w is not None and not w.done():
                w.set_result(None)
        if not self.gone.done():
            self.gone.set_result(None)

    def _count(self, on: bool) -> None:
        """open_connections / connections_total bookkeeping.

        A connection counts from accept until it closes, except while every
        request it has sent was a /stats* request (so asking for stats does not
        show up in them).
        """
        if on and not self.counted:
            self.counted = True
            self.count_generation = STATS.generation
            STATS.open_connections += 1
            STATS.connections_total += 1
        elif not on and self.counted:
            self.counted = False
            STATS.open_connections -= 1

    def uncount_stats_only(self) -> None:
        if self.counted:
            self.counted = False
            STATS.open_connections -= 1
            if self.count_generation == STATS.generation:
                STATS.connections_total -= 1

    async def _wait_data(self) -> None:
        if self.eof:
            raise ConnectionGone()
        w = self.loop.create_future()
        self._data_waiter = w
        try:
            await w
        finally:
            self._data_waiter = None

    async def read_exactly(self, n: int) -> bytes:
        for _ in range(MAX_BODY):
            if len(self.buf) >= n:
                data = bytes(self.buf[:n])
                del self.buf[:n]
                return data
            await self._wait_data()
        raise ConnectionGone()

    async def read_line(self, limit: int = 8192) -> bytes:
        for _ in range(limit + 1):
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            if len(self.buf) > limit:
                raise HttpError(400, "line too long")
            await self._wait_data()
        raise HttpError(400, "line too long")

    def write(self, data) -> None:
        if self.lost:
            raise ConnectionGone()
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait until everything written so far is handed to the kernel."""
        if self.lost:
            raise ConnectionGone()
        if not self._paused:
            return
        w = self.loop.create_future()
        self._drain_waiter = w
        try:
            await w
        finally:
            self._drain_waiter = None
        if self.lost:
            raise ConnectionGone()

    async def write_big(self, data: bytes) -> None:
        mv = memoryview(data)
        for off in range(0, len(mv), WRITE_SLICE):
            self.write(mv[off:off + WRITE_SLICE])
            await self.drain()

    async def sleep_or_gone(self, seconds: float) -> None:
        """Sleep; raise ConnectionGone if the client closes meanwhile."""
        if self.eof:
            raise ConnectionGone()
        if seconds <= 0:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self.gone), seconds)
        except asyncio.TimeoutError:
            return
        raise ConnectionGone()

    def reset(self) -> None:
        """Close with SO_LINGER 0: the peer gets a TCP RST."""
        if self.lost:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                struct.pack("ii", 1, 0))
            except OSError:
                pass
        self.transport.abort()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- request loop ----------------------------------------------------------

    async def read_request(self) -> Request | None:
        buf = self.buf
        for _ in range(MAX_HEAD + 2):
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buf) > MAX_HEAD:
                raise HttpError(431, "request head too large")
            if self.eof:
                return None  # clean close between requests (or a partial one)
            try:
                await self._wait_data()
            except ConnectionGone:
                return None
        else:
            raise HttpError(431, "request head too large")
        head = bytes(buf[:end]).decode("latin-1")
        del buf[:end + 4]
        lines = head.split("\r\n")
        # Tolerate blank lines before a request line (RFC 9112 2.2).
        while lines and not lines[0]:
            lines.pop(0)
        if not lines:
            raise HttpError(400, "empty request")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise HttpError(400, "bad request line")
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise HttpError(400, "bad header line")
            name = name.strip().lower()
            value = value.strip()
            if name in headers:
                headers[name] += ", " + value
            else:
                headers[name] = value
        qpos = target.find("?")
        if qpos >= 0:
            raw_path = target[:qpos]
            query = dict(parse_qsl(target[qpos + 1:], keep_blank_values=True))
        else:
            raw_path = target
            query = {}
        if raw_path.startswith("http://") or raw_path.startswith("https://"):
            # absolute-form (a client talking to us as a proxy)
            slash = raw_path.find("/", raw_path.find("//") + 2)
            raw_path = raw_path[slash:] if slash >= 0 else "/"
        path = unquote(raw_path, errors="surrogateescape") if "%" in raw_path else raw_path
        req = Request(method, target, path, query, headers, version)
        conn_hdr = headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            req.keep_alive = "keep-alive" in conn_hdr
        else:
            req.keep_alive = "close" not in conn_hdr
        return req

    async def read_body(self, req: Request) -> None:
        h = req.headers
        te = h.get("transfer-encoding")
        cl = h.get("content-length")
        if te is None and cl is None:
            return
        if h.get("expect", "").lower() == "100-continue":
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if te is not None:
            if te.lower().rsplit(",", 1)[-1].strip() != "chunked":
                raise HttpError(501, "unsupported transfer-encoding")
            chunks = []
            total = 0
            for _ in range(MAX_CHUNKS):
                line = await self.read_line()
                size_s = line.split(b";", 1)[0].strip()
                try:
                    size = int(size_s, 16)
                except ValueError:
                    raise HttpError(400, "bad chunk size") from None
                if size == 0:
                    for _ in range(1000):  # trailers
                        if not await self.read_line():
                            break
                    req.body = b"".join(chunks)
                    return
                total += size
                if total > MAX_BODY:
                    raise HttpError(413, "body too large")
                chunks.append(await self.read_exactly(size))
                if await self.read_line() != b"":
                    raise HttpError(400, "bad chunk terminator")
            raise HttpError(400, "too many chunks")
        try:
            n = int(cl)
        except ValueError:
            raise HttpError(400, "bad content-length") from None
        if n < 0:
            raise HttpError(400, "bad content-length")
        if n > MAX_BODY:
            raise HttpError(413, "body too large")
        if n:
            req.body = await self.read_exactly(n)

    async def send(self, req: Request, resp: Response) -> None:
        status = resp.status
        headers = []
        if resp.ctype is not None:
            headers.append(("Content-Type", resp.ctype))
        if resp.headers:
            headers.extend(resp.headers)
        no_body = status in (204, 304) or 100 <= status < 200
        if not no_body:
            headers.append(("Content-Length", len(resp.body)))
        head = build_head(status, headers, req.keep_alive, req.version == "HTTP/1.0")
        body = resp.body
        if no_body or req.method == "HEAD" or not body:
            self.write(head)
        elif len(body) <= WRITE_SLICE:
            self.write(head + body)
        else:
            self.write(head)
            await self.write_big(body)
        await self.drain()

    async def run(self) -> None:
        stats = STATS
        routes = self.server.routes
        prefix_routes = self.server.prefix_routes
        try:
            for _ in range(MAX_REQUESTS_PER_CONN):
                try:
                    req = await self.read_request()
                except HttpError as e:
                    await self.fail_and_close(e)
                    return
                if req is None:
                    return
                path = req.path
                is_stats = path == "/stats" or path.startswith("/stats/")
                if is_stats:
                    self.uncount_stats_only()
                else:
                    self._count(True)
                    stats.requests += 1
                    stats.in_flight += 1
                    if stats.in_flight > stats.max_in_flight:
                        stats.max_in_flight = stats.in_flight
                    stats.arrivals.append(req.target)
                    stats.by_path[path] = stats.by_path.get(path, 0) + 1
                    stats.last_headers = req.headers
                    stats.headers_log.append({"method": req.method, "path": path,
                                              "target": req.target,
                                              "headers": req.headers})
                try:
                    try:
                        await self.read_body(req)
                        entry = routes.get(path)
                        if entry is None:
                            for prefix, e in prefix_routes:
                                if path.startswith(prefix):
                                    entry = e
                                    break
                        if entry is None:
                            resp = jresp({"error": "not found"}, 404)
                        else:
                            resp = entry(self, req)
                            if resp is not None and resp.__class__ is not Response:
                                resp = await resp   # a coroutine
                    except HttpError as e:
                        req.keep_alive = req.keep_alive and e.status < 500 and e.status != 413
                        resp = jresp({"error": e.message}, e.status)
                    if resp is None:        # the handler took over the socket
                        return
                    if resp is not SENT:
                        await self.send(req, resp)
                finally:
                    if not is_stats:
                        stats.in_flight -= 1
                if not req.keep_alive:
                    return
        except ConnectionGone:
            pass
        except Exception as e:  # a bug in a handler: report it, drop the connection
            print("testserver: error: %r" % (e,), file=sys.stderr, flush=True)
            self.reset()
        finally:
            self.close()

    async def fail_and_close(self, e: HttpError) -> None:
        req = Request("GET", "", "", {}, {}, "HTTP/1.1")
        req.keep_alive = False
        try:
            await self.send(req, jresp({"error": e.message}, e.status))
        except ConnectionGone:
            pass


# ----------------------------------------------------------------------------
# routes. A handler is called as handler(conn, req) and returns
#   a Response          -> the connection loop sends it;
#   SENT                -> the handler wrote a complete response itself;
#   None                -> the handler owned the socket; the connection closes;
#   or a coroutine that produces one of those (the socket-effect routes).
# Plain functions keep the common path free of coroutine overhead.


class Routes:
    def __init__(self, corpus_name: str, files_dir: str | None, lifetime: float):
        self.lifetime = lifetime
        self.corpus = corpus_mod.build(corpus_name)
        self.files_dir = os.path.realpath(files_dir) if files_dir else None
        self.item_json = [jbytes(it) for it in self.corpus]
        self.match_cache: dict[str, tuple] = {}
        self.search_cache: dict[tuple, bytes] = {}
        self.json_cache: dict[int, bytes] = {}
        self.gzip_body = gzip.compress(jbytes({
            "gzip": True,
            "items": [{"id": i, "name": "item-%d" % i} for i in range(50)],
        }), mtime=0)

    def table(self):
        """Exact-path routes, and prefix routes tried in order."""
        exact = {
            "/": self.index, "/search": self.search, "/corpus": self.corpus_route,
            "/json": self.json_doc, "/delay": self.delay, "/stall": self.stall,
            "/drip": self.drip, "/close-mid-body": self.close_mid_body,
            "/reset": self.reset, "/reset-after-headers": self.reset_after_headers,
            "/wrong-length": self.wrong_length, "/redirect": self.redirect,
            "/redirect-loop": self.redirect_loop, "/redirect-to": self.redirect_to,
            "/gzip": self.gzip, "/bad-gzip": self.bad_gzip, "/bad-trailer": self.bad_trailer,
            "/bytes": self.bytes_route,
            "/deep": self.deep, "/invalid-utf8": self.invalid_utf8,
            "/empty": self.empty, "/204": self.no_content, "/echo": self.echo, "/reals": self.reals,
            "/flaky": self.flaky, "/retry-after": self.retry_after,
            "/etag": self.etag, "/cache": self.cache, "/steps": self.steps, "/stats": self.stats,
            "/stats/reset": self.stats_reset,
        }
        prefixes = [("/status/", self.status), ("/file/", self.file)]
        return exact, prefixes

    # -- search ---------------------------------------------------------------

    def matching(self, q: str) -> tuple:
        ql = q.lower()
        hit = self.match_cache.get(ql)
        if hit is None:
            hit = tuple(i for i, it in enumerate(self.corpus)
                        if corpus_mod.matches(it, ql))
            if len(self.match_cache) > 4096:
                self.match_cache.clear()
            self.match_cache[ql] = hit
        return hit

    def results_body(self, head: bytes, idx) -> bytes:
        return head + b",".join(self.item_json[i] for i in idx) + b"]}"

    def search(self, conn, req):
        q = req.query.get("q", "")
        rpp = qint(req.query, "rpp", 50, 0, 500)
        if q.startswith("__"):
            if q == "__fail":
                return jresp({"error": "injected failure"}, 500)
            if q == "__bad":
                return Response(200, b'{"query": "__bad", "results": [{"id": "q-0001",')
            if q == "__notarray":
                return jresp({"query": q, "results": {"x": 1}})
            if q == "__slow":
                return self._slow(conn, q, rpp)
            if q == "__dup":  # one id three times in one response
                return jresp({"query": q, "results": [
                    {"id": "x", "v": 1, "created_at": "2026-01-01T00:00:01Z"},
                    {"id": "x", "v": 2, "created_at": "2026-01-01T00:00:03Z"},
                    {"id": "x", "v": 3, "created_at": "2026-01-01T00:00:02Z"},
                    {"id": "y", "v": 4, "created_at": "2026-01-01T00:00:00Z"}]})
        key = (q, rpp)
        body = self.search_cache.get(key)
        if body is None:
            body = self.results_body(b'{"query": ' + jbytes(q) + b', "results": [',
                                     self.matching(q)[:rpp])
            if len(self.search_cache) > 4096:
                self.search_cache.clear()
            self.search_cache[key] = body
        max_age = req.query.get("max_age")
        if max_age is not None and max_age.isdigit():
            # Lets clients cache search responses (the engine's HTTP cache).
            return Response(200, body, headers=[("Cache-Control", "max-age=" + max_age)])
        return Response(200, body)

    async def _slow(self, conn, q, rpp):
        await conn.sleep_or_gone(0.3)
        return Response(200, self.results_body(
            b'{"query": ' + jbytes(q) + b', "results": [', self.matching(q)[:rpp]))

    def corpus_route(self, conn, req):
        tag = req.query.get("tag")
        q = req.query.get("q")
        if tag is not None:
            idx = [i for i, it in enumerate(self.corpus) if tag in it["tags"]]
        elif q is not None:
            idx = self.matching(q)
        else:
            idx = range(len(self.corpus))
        return Response(200, self.results_body(
            b'{"count": %d, "results": [' % len(idx), idx))

    # -- generated JSON ---------------------------------------------------------

    def json_doc(self, conn, req):
        size = qint(req.query, "size", 3000, 0, MAX_GEN)
        body = self.json_cache.get(size)
        if body is None:
            body = self._make_json(size)
            if len(self.json_cache) > 64:
                self.json_cache.clear()
            self.json_cache[size] = body
        return Response(200, body)

    @staticmethod
    def _make_json(size: int) -> bytes:
        parts = []
        total = len(b'{"items":[]}')
        i = 0
        while total < size and i < MAX_GEN:
            item = b'{"id":%d,"name":"item-%06d","value":%d,"ok":%s}' % (
                i, i, (i * 7919) % 10007, b"true" if i % 3 else b"false")
            total += len(item) + (1 if parts else 0)
            parts.append(item)
            i += 1
        return b'{"items":[' + b",".join(parts) + b"]}"

    def deep(self, conn, req):
        n = qint(req.query, "n", 100, 0, MAX_GEN // 2)
        return Response(200, b"[" * n + b"]" * n)

    def invalid_utf8(self, conn, req):
        return Response(200, b'{"text": "valid \xc3\xa9 then invalid \xff\xfe\xc3( end"}')

    def empty(self, conn, req):
        return Response(200, b"")

    def no_content(self, conn, req):
        return Response(204, b"", None)

    def gzip(self, conn, req):
        # random=N: N bytes that do not compress (the same ones each time),
        # gzip-encoded: more bytes sent than the body has once decoded.
        n = qint(req.query, "random", 0, 0, 64 * 1024 * 1024)
        if n:
            data = random.Random(n).randbytes(n)
            return Response(200, gzip.compress(data, mtime=0), "application/octet-stream",
                            [("Content-Encoding", "gzip")])
        return Response(200, self.gzip_body, JSON, [("Content-Encoding", "gzip")])

    def bad_gzip(self, conn, req):
        if req.query.get("trailing") == "1":
            # A whole gzip body followed by bytes that are not gzip.
            return Response(200, self.gzip_body + b"garbage", JSON, [("Content-Encoding", "gzip")])
        return Response(200, b"this is not gzip data, just plain bytes",
                        JSON, [("Content-Encoding", "gzip")])

    def index(self, conn, req):
        return jresp({"server": "fetchq-testserver", "corpus_items": len(self.corpus)})

    # -- status / echo / files ------------------------------------------------------

    def status(self, conn, req):
        try:
            n = int(req.path[len("/status/"):])
        except ValueError:
            raise HttpError(400, "status must be an integer") from None
        if n < 200 or n > 599:
            raise HttpError(400, "status must be between 200 and 599")
        if n in (204, 304):
            return Response(n, b"", None)
        return jresp({"status": n}, n)

    def reals(self, conn, req):
        # Numbers with a fraction or an exponent, as a server writes them.
        return Response(200, b'{"price":19.99,"ratio":0.1,"tiny":1e-7,"big":1.5e300,'
                             b'"sum":0.30000000000000004,"whole":100.0,"neg":-2.5}')

    def echo(self, conn, req):
        return jresp({
            "method": req.method,
            "path": req.path,
            "query": req.query,
            "headers": req.headers,
            "body": req.body.decode("utf-8", "replace"),
        })

    def file(self, conn, req):
        name = req.path[len("/file/"):]
        # One path segment only: no "."/"..", no slash or backslash (also when
        # percent-encoded, since the path is decoded first), no NUL. Names that
        # merely contain ".." (n_number_-1.0..json) are fine.
        if name in ("", ".", "..") or any(c in name for c in "/\\\x00"):
            raise HttpError(400, "bad file name")
        if self.files_dir is None:
            raise HttpError(404, "no --files directory")
        full = os.path.join(self.files_dir, name)
        if os.path.dirname(os.path.realpath(full)) != self.files_dir:
            raise HttpError(400, "bad file name")  # e.g. a symlink out of the dir
        try:
            with open(full, "rb") as f:
                data = f.read(MAX_GEN + 1)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise HttpError(404, "not found") from None
        except (OSError, UnicodeEncodeError):
            raise HttpError(400, "bad file name") from None
        return Response(200, data)

    # -- redirects ----------------------------------------------------------------------

    def redirect(self, conn, req):
        n = qint(req.query, "n", 1, 0, 1_000_000)
        if n == 0:
            return self.json_doc(conn, req)
        loc = "/json" if n == 1 else "/redirect?n=%d" % (n - 1)
        return jresp({"redirect": loc}, 302, [("Location", loc)])

    def redirect_loop(self, conn, req):
        return jresp({"redirect": "/redirect-loop"}, 302, [("Location", "/redirect-loop")])

    def redirect_to(self, conn, req):
        url = req.query.get("url")
        if not url:
            raise HttpError(400, "url is required")
        if any(c in url for c in "\r\n"):
            raise HttpError(400, "bad url")
        status = qint(req.query, "status", 302, 300, 399)
        # pad=N: N more bytes in the redirect's own body (which a client
        # that follows it reads and drops).
        pad = qint(req.query, "pad", 0, 0, MAX_GEN)
        return jresp({"redirect": url, "pad": "x" * pad}, status, [("Location", url)])

    # -- retries and caching ---------------------------------------------------------

    def flaky(self, conn, req):
        key = req.query.get("key", "")
        fail = qint(req.query, "fail", 1, 0, 1_000_000)
        status = qint(req.query, "status", 503, 200, 599)
        ms = qint(req.query, "ms", 0, 0, MAX_DELAY_MS)
        i = STATS.bump("flaky", key)  # counted on arrival, before any delay
        if i <= fail:
            resp = jresp({"error": "flaky", "attempt": i}, status)
        elif req.query.get("empty") == "1":
            resp = Response(200, b"", JSON)  # success with an empty body
        else:
            resp = jresp({"attempt": i})
        return self.later(conn, ms, resp) if ms else resp

    @staticmethod
    async def later(conn, ms, resp):
        await conn.sleep_or_gone(ms / 1000.0)
        return resp

    def retry_after(self, conn, req):
        key = req.query.get("key", "")
        fail = qint(req.query, "fail", 1, 0, 1_000_000)
        after = qint(req.query, "after", 1, 0, 86400)
        as_date = qint(req.query, "date", 0, 0, 1)
        i = STATS.bump("retry-after", key)
        if i <= fail:
            if as_date:
                value = email.utils.formatdate(int(time.time()) + after + 1, usegmt=True)
            else:
                value = str(after)
            return jresp({"error": "rate limited", "attempt": i}, 429,
                         [("Retry-After", value)])
        return jresp({"attempt": i})

    def etag(self, conn, req):
        key = req.query.get("key", "")
        version = req.query.get("version", "v1")
        if not version.isalnum():
            raise HttpError(400, "version must be alphanumeric")
        tag = '"%s"' % version
        i = STATS.bump("etag", key)
        hdrs = [("ETag", tag), ("Cache-Control", "max-age=0")]
        inm = req.headers.get("if-none-match")
        if inm is not None:
            for cand in inm.split(","):
                cand = cand.strip()
                if cand.startswith("W/"):
                    cand = cand[2:]
                if cand == tag or cand == "*":
                    return Response(304, b"", None, hdrs)
        return jresp({"key": key, "version": version, "count": i}, 200, hdrs)

    def steps(self, conn, req):
        """A scripted answer per request: `s` lists steps separated by "|",
        the n-th request for `key` getting the n-th (the last one repeats).
        A step is "STATUS;Name=value;...;body=TEXT" (JSON Content-Type; a 304
        or 204 sends no body). "304if=TAG" answers 304 when If-None-Match
        names "TAG", and the rest of the step otherwise."""
        key = req.query.get("key", "")
        spec = req.query.get("s", "200").split("|")
        i = STATS.bump("steps", key)
        fields = spec[min(i, len(spec)) - 1].split(";")
        try:
            status = int(fields[0])
        except ValueError:
            raise HttpError(400, "a step starts with its status") from None
        hdrs, body, match = [], b"", None
        for field in fields[1:]:
            name, _, value = field.partition("=")
            if name == "body":
                body = value.encode()
            elif name == "304if":
                match = '"%s"' % value
            else:
                hdrs.append((name, value))
        if match is not None and req.headers.get("if-none-match") == match:
            return Response(304, b"", None, hdrs)
        if status in (204, 304):
            return Response(status, b"", None, hdrs)
        return Response(status, body, JSON, hdrs)

    def cache(self, conn, req):
        key = req.query.get("key", "")
        max_age = qint(req.query, "max_age", 60, 0, 10 ** 9)
        cc = "max-age=%d" % max_age
        if req.query.get("no_store") == "1":
            cc += ", no-store"
        if req.query.get("must_revalidate") == "1":
            cc += ", must-revalidate"
        i = STATS.bump("cache", key)
        hdrs = [("Cache-Control", cc), ("Last-Modified", LAST_MODIFIED)]
        ims = req.headers.get("if-modified-since")
        if ims:
            try:
                ts = email.utils.parsedate_to_datetime(ims).timestamp()
            except (TypeError, ValueError):
                ts = None
            if ts is not None and ts >= LAST_MODIFIED_TS:
                return Response(304, b"", None, hdrs)
        return jresp({"key": key, "max_age": max_age, "count": i}, 200, hdrs)

    # -- stats ----------------------------------------------------------------------------

    def stats(self, conn, req):
        return jresp(STATS.snapshot())

    def stats_reset(self, conn, req):
        STATS.reset()
        return jresp({"reset": True})

    # -- socket effects (async) ------------------------------------------------------

    async def delay(self, conn, req):
        ms = qint(req.query, "ms", 100, 0, MAX_DELAY_MS)
        await conn.sleep_or_gone(ms / 1000.0)
        return jresp({"delayed": ms})

    async def stall(self, conn, req):
        # Never answer. Discard whatever else arrives; return (and close) once
        # the client closes, or when the server's lifetime is over.
        for _ in range(int(self.lifetime) + 2):
            conn.buf.clear()
            try:
                await conn.sleep_or_gone(1.0)
            except ConnectionGone:
                break
        return None

    async def drip(self, conn, req):
        n = qint(req.query, "bytes", 1000, 0, MAX_GEN)
        chunk = qint(req.query, "chunk", 100, 1, MAX_GEN)
        interval = qint(req.query, "interval_ms", 100, 0, MAX_DELAY_MS) / 1000.0
        body = json_padded(n)
        conn.write(build_head(200, [("Content-Type", JSON), ("Content-Length", n)],
                              req.keep_alive))
        await conn.drain()
        if req.method == "HEAD":
            return SENT
        for off in range(0, n, chunk):
            await conn.sleep_or_gone(interval)
            conn.write(body[off:off + chunk])
            await conn.drain()
        return SENT

    async def close_mid_body(self, conn, req):
        n = qint(req.query, "bytes", 1000, 2, MAX_GEN)
        body = json_padded(n)
        conn.write(build_head(200, [("Content-Type", JSON), ("Content-Length", n)], True)
                   + body[:n // 2])
        await conn.drain()
        conn.close()
        return None

    async def reset(self, conn, req):
        conn.reset()
        return None

    async def reset_after_headers(self, conn, req):
        conn.write(build_head(200, [("Content-Type", JSON), ("Content-Length", 1000)], True))
        await conn.drain()
        # Give the client a moment to read the headers before the RST lands.
        await conn.sleep_or_gone(0.05)
        conn.reset()
        return None

    async def bad_trailer(self, conn, req):
        # A whole chunked JSON body, then a trailer line without a colon.
        body = jbytes({"trailer": "bad"})
        conn.write(build_head(200, [("Content-Type", JSON), ("Transfer-Encoding", "chunked")], False)
                   + b"%x\r\n" % len(body) + body + b"\r\n0\r\ngarbage\r\n\r\n")
        await conn.drain()
        conn.close()
        return None

    async def wrong_length(self, conn, req):
        declared = qint(req.query, "declared", 100, 0, 1 << 62)  # only sent, not made
        actual = qint(req.query, "actual", 50, 0, MAX_GEN)
        conn.write(build_head(200, [("Content-Type", JSON), ("Content-Length", declared)],
                              False))
        await conn.write_big(json_padded(actual))
        conn.close()
        return None

    async def bytes_route(self, conn, req):
        n = qint(req.query, "n", 1024, 0, MAX_GEN)
        chunked = req.query.get("chunked") == "1"
        hdrs = [("Content-Type", OCTET)]
        hdrs.append(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", n))
        conn.write(build_head(200, hdrs, req.keep_alive))
        if req.method == "HEAD":
            await conn.drain()
            return SENT
        full, rem = divmod(n, len(BLOCK))
        block = BLOCK
        if chunked:
            block = b"%x\r\n" % len(BLOCK) + BLOCK + b"\r\n"
        for _ in range(full):
            await conn.write_big(block)
        if rem:
            tail = BLOCK[:rem]
            await conn.write_big(b"%x\r\n" % rem + tail + b"\r\n" if chunked else tail)
        if chunked:
            conn.write(b"0\r\n\r\n")
        await conn.drain()
        return SENT


# ----------------------------------------------------------------------------
# server


class Server:
    def __init__(self, args, loop):
        self.args = args
        self.loop = loop
        self.tls = bool(args.tls_cert)
        self.conns: set[Conn] = set()
        self.routes, self.prefix_routes = Routes(
            args.corpus, args.files, float(args.max_seconds)).table()
        self.stop = asyncio.Event()


async def main_async(args) -> int:
    loop = asyncio.get_running_loop()
    server = Server(args, loop)

    ssl_ctx = None
    if args.tls_cert:
        ssl_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ssl_ctx.load_cert_chain(args.tls_cert, args.tls_key)

    srv = await loop.create_server(lambda: Conn(server), args.host, args.port,
                                   ssl=ssl_ctx, backlog=1024, reuse_address=True)
    port = srv.sockets[0].getsockname()[1]

    if args.port_file:
        tmp = "%s.tmp.%d" % (args.port_file, os.getpid())
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.replace(tmp, args.port_file)
    sys.stdout.write("PORT %d\n" % port)
    sys.stdout.flush()

    stop = server.stop
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def watch_parent():
        pid = args.parent_pid
        for _ in range(int(args.max_seconds * 2) + 10):
            await asyncio.sleep(0.5)
            if not _pid_alive(pid):
                stop.set()
                return

    watcher = loop.create_task(watch_parent()) if args.parent_pid else None
    try:
        await asyncio.wait_for(stop.wait(), args.max_seconds)
    except asyncio.TimeoutError:
        pass
    if watcher is not None:
        watcher.cancel()
    srv.close()
    for conn in list(server.conns):
        if conn.transport is not None:
            conn.transport.abort()
    await asyncio.sleep(0)
    return 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited already
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="fetchq fault-injecting HTTP test server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument("--corpus", choices=("test", "demo"), default="test")
    p.add_argument("--files", help="directory served by /file/NAME")
    p.add_argument("--max-seconds", type=float, default=900.0)
    p.add_argument("--parent-pid", type=int)
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    args = p.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key go together")
    if args.files and not os.path.isdir(args.files):
        p.error("--files: not a directory: %s" % args.files)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
