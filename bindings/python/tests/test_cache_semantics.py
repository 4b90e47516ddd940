"""The HTTP cache against a raw server that sends exactly the validators and
directives each test needs (the fourth review, twenty-sixth session)."""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any, List

import pytest

import fetchq

from conftest import TIMEOUT
from test_responses import engine, serve  # noqa: F401 (engine: the shared fixture)


def response(status: str, headers: List[str], body: bytes = b"") -> bytes:
    head = "HTTP/1.1 %s\r\n%s\r\nContent-Length: %d\r\n\r\n" % (status, "\r\n".join(headers), len(body))
    return head.encode() + body


def test_a_304_that_no_entry_can_take_asks_again_without_validators(engine: fetchq.Engine) -> None:
    """A 304 whose entity tag is not the stored one's was handed to a plain
    GET as FQ_ERR_HTTP 304 with an empty body (RFC 9111 §4.3.4)."""
    def etag(conn: socket.socket, head: str) -> bool:
        # Recorded before answering: the client may have the answer, and ask
        # again, before this thread would get back from sendall.
        first = not served
        served.append(head)
        if "if-none-match" in head.lower():
            conn.sendall(response("304 Not Modified", ['ETag: "e2"', "Cache-Control: max-age=0"]))
        elif not first:                                       # the representation changed
            conn.sendall(response("200 OK", ['ETag: "e2"', "Cache-Control: max-age=0",
                                             "Content-Type: application/json"], b'{"v": 2}'))
        else:
            conn.sendall(response("200 OK", ['ETag: "e1"', "Cache-Control: max-age=0",
                                             "Content-Type: application/json"], b'{"v": 1}'))
        return True

    served: List[str] = []
    for s in serve({"/e": etag}):
        q = engine.queue("c")
        assert q.get(s.url("/e")).result(timeout=TIMEOUT).json() == {"v": 1}
        r = q.get(s.url("/e")).result(timeout=TIMEOUT)
        assert r.status == 200 and r.json() == {"v": 2} and r.metrics["from_cache"] is False
        assert len(served) == 3                               # plain, conditional, plain again
        assert 'if-none-match: "e1"' in served[1].lower() and "if-none-match" not in served[2].lower()
        # The answer asked again for was stored: the next GET revalidates it.
        q.get(s.url("/e")).result(timeout=TIMEOUT)
        assert 'if-none-match: "e2"' in served[3].lower()


def test_a_304_for_an_entry_evicted_meanwhile_answers_with_that_entry(engine: fetchq.Engine) -> None:
    def slow_304(conn: socket.socket, head: str) -> bool:
        if "if-none-match" in head.lower():
            time.sleep(0.4)                                   # the entry is evicted meanwhile
            conn.sendall(response("304 Not Modified", ['ETag: "a1"']))
        else:
            conn.sendall(response("200 OK", ['ETag: "a1"', "Cache-Control: max-age=0",
                                             "Content-Type: application/json"], b'{"a": "' + b"a" * 3000 + b'"}'))
        return True

    big = response("200 OK", ["Cache-Control: max-age=600", "Content-Type: application/json"],
                   b'{"b": "' + b"b" * 3000 + b'"}')
    with fetchq.Engine(cache={"max_bytes": 5000}) as e:
        for s in serve({"/a": slow_304, "/b": big}):
            q = e.queue("c", max_concurrent=4)
            assert len(q.get(s.url("/a")).result(timeout=TIMEOUT).json()["a"]) == 3000
            revalidating = q.get(s.url("/a"))
            time.sleep(0.1)
            q.get(s.url("/b")).result(timeout=TIMEOUT)            # evicts /a's entry
            r = revalidating.result(timeout=TIMEOUT)
            assert r.status == 200 and len(r.json()["a"]) == 3000 and r.metrics["from_cache"] is True
            assert e.stats()["cache"]["evictions"] >= 1


def test_no_cache_entries_are_never_served_without_the_server(engine: fetchq.Engine) -> None:
    """RFC 9111 §4.2.4 and §5.2.2.4: only-if-cached answered them, and
    stale-while-revalidate delivered them first (must-revalidate was fixed)."""
    answers = [response("200 OK", ['ETag: "n1"', "Cache-Control: no-cache, max-age=600",
                                   "Content-Type: application/json"], b'{"n": 1}'),
               response("503 Service Unavailable", ["Content-Type: application/json"], b"{}")]
    for s in serve({"/n": lambda conn, head: conn.sendall(answers[min(len(s.requests) - 1, 1)]) or True}):
        q = engine.queue("c")
        assert q.get(s.url("/n")).result(timeout=TIMEOUT).json() == {"n": 1}
        with pytest.raises(fetchq.CacheMiss, match="said no-cache"):
            q.get(s.url("/n"), cache="only-if-cached").result(timeout=TIMEOUT)
        updates: List[Any] = []
        with pytest.raises(fetchq.HTTPError):
            q.get(s.url("/n"), cache="stale-while-revalidate", on_update=updates.append).result(timeout=TIMEOUT)
        assert updates == []


def test_a_pragma_no_cache_request_goes_to_the_server(engine: fetchq.Engine) -> None:
    fresh = response("200 OK", ["Cache-Control: max-age=600", "Content-Type: application/json"], b"{}")
    for s in serve({"/p": fresh}):
        q = engine.queue("c")
        q.get(s.url("/p")).result(timeout=TIMEOUT)
        assert q.get(s.url("/p")).result(timeout=TIMEOUT).metrics["from_cache"] is True
        r = q.get(s.url("/p"), headers={"Pragma": "no-cache"}).result(timeout=TIMEOUT)
        assert r.metrics["from_cache"] is False and s.count("/p") == 2


def test_the_cache_file_keeps_no_credentials_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    fresh = response("200 OK", ["Cache-Control: max-age=600", "Content-Type: application/json"], b"{}")
    for s in serve({"/me": fresh, "/pub": fresh}):
        s.answers[s.url("/me")] = fresh                       # the absolute-form target a proxy gets
        with fetchq.Engine(cache={"path": str(path)}) as e:
            q = e.queue("c")
            q.get(s.url("/me"), headers={"Authorization": "Bearer SECRET-1"}).result(timeout=TIMEOUT)
            q.get(s.url("/me"), headers={"Cookie": "session=SECRET-2"}).result(timeout=TIMEOUT)
            q.get(s.url("/me").replace("http://", "http://u:SECRET-3@")).result(timeout=TIMEOUT)
            # through a proxy whose URL holds a password (the server answers as the proxy)
            q.get(s.url("/me"), proxy=s.url("").replace("http://", "http://p:SECRET-4@")).result(timeout=TIMEOUT)
            q.get(s.url("/pub")).result(timeout=TIMEOUT)
            # still answered from memory
            r = q.get(s.url("/me"), headers={"Authorization": "Bearer SECRET-1"}).result(timeout=TIMEOUT)
            assert r.metrics["from_cache"] is True
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with sqlite3.connect(str(path)) as db:
        keys = [k for (k,) in db.execute("SELECT key FROM fetchq_http_cache")]
    assert len(keys) == 1 and keys[0].startswith("GET " + s.url("/pub"))
    assert not any("SECRET" in k for k in keys)


def test_a_cache_file_made_through_a_symbolic_link_is_private(tmp_path: Path) -> None:
    """A link to a file not made yet (two levels, one relative): the file is
    made readable by its owner only, as at a plain path (it was 0644)."""
    (tmp_path / "real").mkdir()
    os.symlink("real/cache.db", tmp_path / "hop")
    os.symlink(str(tmp_path / "hop"), tmp_path / "link.db")
    old = os.umask(0o022)
    try:
        with fetchq.Engine(cache={"path": str(tmp_path / "link.db")}):
            pass
    finally:
        os.umask(old)
    assert os.path.islink(tmp_path / "link.db") and os.path.islink(tmp_path / "hop")
    assert stat.S_IMODE(os.stat(tmp_path / "real" / "cache.db").st_mode) == 0o600


def test_the_file_stays_within_max_bytes_with_entries_it_may_not_hold(tmp_path: Path) -> None:
    """Entries kept in memory only (credentials) evicted others without
    deleting their rows: the file outgrew max_bytes and served evicted rows."""
    path = tmp_path / "cache.db"
    body = b'{"x": "' + b"x" * 900 + b'"}'
    fresh = response("200 OK", ["Cache-Control: max-age=600", "Content-Type: application/json"], body)
    for s in serve({"/p%d" % i: fresh for i in range(12)}):
        with fetchq.Engine(cache={"path": str(path), "max_bytes": 3000}) as e:
            q = e.queue("c")
            for i in range(12):
                headers = {"Authorization": "Bearer t"} if i % 2 else {}
                q.get(s.url("/p%d" % i), headers=headers).result(timeout=TIMEOUT)
        with sqlite3.connect(str(path)) as db:
            (total,), = db.execute("SELECT coalesce(sum(size), 0) FROM fetchq_http_cache")
            keys = [k for (k,) in db.execute("SELECT key FROM fetchq_http_cache")]
        assert total <= 3000, (total, keys)
        assert not any("authorization" in k for k in keys)
        with fetchq.Engine(cache={"path": str(path), "max_bytes": 3000}) as e:   # an evicted row is not served
            r = e.queue("c").get(s.url("/p0")).result(timeout=TIMEOUT)
            assert r.metrics["from_cache"] is False


def test_a_locked_cache_file_stalls_nothing_and_is_reported(tmp_path: Path, caplog: Any) -> None:
    """Another writer holding the file's lock made each cacheable response,
    and unrelated submits, wait 2 s; the lost writes were not reported."""
    path = tmp_path / "cache.db"
    fresh = response("200 OK", ["Cache-Control: max-age=600", "Content-Type: application/json"], b"{}")
    with fetchq.Engine(cache={"path": str(path)}, log="warning") as e:
        locker = sqlite3.connect(str(path), timeout=0, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        try:
            for s in serve({"/l%d" % i: fresh for i in range(5)}):
                q = e.queue("c")
                t0 = time.monotonic()
                with caplog.at_level(logging.WARNING, logger="fetchq.engine"):
                    for i in range(5):
                        q.get(s.url("/l%d" % i)).result(timeout=TIMEOUT)
                    elapsed = time.monotonic() - t0
                assert elapsed < 2.0, elapsed                     # 5 x 100 ms at most, not 5 x 2 s
                warnings = [r.getMessage() for r in caplog.records if "http cache" in r.getMessage()]
                assert len(warnings) == 1, warnings             # once, not per response
                assert q.get(s.url("/l0")).result(timeout=TIMEOUT).metrics["from_cache"] is True
        finally:
            locker.execute("ROLLBACK")
            locker.close()


@pytest.mark.parametrize("how", ["POST", "reload"])
def test_an_entry_removed_while_the_file_is_locked_does_not_come_back(tmp_path: Path, how: str) -> None:
    """An entry removed (a POST to its URL, a newer answer without caching
    headers) while another writer held the cache file: the row's delete was
    skipped, and the next GET loaded the old row back from the file and
    answered with it (the tenth review's check of its changes)."""
    path = tmp_path / "cache.db"
    answers: List[str] = []

    def x(conn: socket.socket, head: str) -> bool:
        answers.append(head.split(" ", 1)[0])
        if head.startswith("POST"):
            conn.sendall(response("200 OK", ["Content-Type: application/json"], b"{}"))
        elif len(answers) == 1:
            conn.sendall(response("200 OK", ["Cache-Control: max-age=600", "Content-Type: application/json"],
                                  b'{"v": 1}'))
        else:
            conn.sendall(response("200 OK", ["Content-Type: application/json"], b'{"v": 2}'))
        return True

    for s in serve({"/x": x}):
        with fetchq.Engine(cache={"path": str(path)}, log="off") as e:
            q = e.queue("c")
            assert q.get(s.url("/x")).result(timeout=TIMEOUT).json() == {"v": 1}
            locker = sqlite3.connect(str(path), timeout=0, isolation_level=None)
            locker.execute("BEGIN IMMEDIATE")
            try:
                if how == "POST":
                    assert q.request("POST", s.url("/x"), data=b"1").result(timeout=TIMEOUT).status == 200
                else:
                    assert q.get(s.url("/x"), cache="reload").result(timeout=TIMEOUT).json() == {"v": 2}
            finally:
                locker.execute("ROLLBACK")
                locker.close()
            r = q.get(s.url("/x")).result(timeout=TIMEOUT)
            assert r.metrics["from_cache"] is False and r.json() == {"v": 2}
        with sqlite3.connect(str(path)) as db:                    # and the row went at the next write
            assert db.execute("SELECT count(*) FROM fetchq_http_cache").fetchone() == (0,)
