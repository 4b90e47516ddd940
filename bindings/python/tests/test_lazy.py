"""Lazy results: Response and Result keep the C result's data (body bytes, held
json_t references) and convert on first access.

The reference for every comparison is the eager conversion the binding used
to do in the completion callback (json_dumps of each json_t, then
json.loads): ``eager`` records it for every Response built, from the same
fq_result, right before the lazy object is made.
"""

from __future__ import annotations

import copy
import ctypes
import gc
import json
import os
import pickle
import random
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import fetchq
from fetchq import _engine, _ffi

from conftest import SUITE, TIMEOUT, Server, fetch_all, identical, needs_network, start_server, stop_server

pytestmark = needs_network

TRANSFORM = SUITE.parent / "test_transform"

Eager = Dict[int, Tuple[Any, Dict[str, Any], Dict[str, Any], bytes]]


@pytest.fixture
def eager(monkeypatch: pytest.MonkeyPatch) -> Eager:
    """op_id -> (value, headers, metrics, body) converted eagerly from the
    fq_result every lazy Response is built from."""
    seen: Eager = {}
    lazy = _engine.Response._from_result.__func__  # type: ignore[attr-defined]

    def spy(cls: Any, core: Any, result: int, op_id: int, value_is_body: bool) -> Any:
        L = core.lib
        seen[op_id] = (_ffi.from_json(L.fq_result_value(result)),
                       _ffi.from_json(L.fq_result_headers(result)) or {},
                       _ffi.from_json(L.fq_result_metrics(result)) or {},
                       _ffi.body_of(result))
        return lazy(cls, core, result, op_id, value_is_body)

    monkeypatch.setattr(_engine.Response, "_from_result", classmethod(spy))
    return seen


def check_against_eager(outcomes: Dict[str, Any], eager: Eager) -> int:
    """Every Response's json/headers/metrics/body against the eager
    conversion; returns how many parsed."""
    parsed = 0
    bad = []
    for name, r in outcomes.items():
        if not isinstance(r, fetchq.Response):
            assert isinstance(r, fetchq.ParseError), (name, r)
            continue
        value, headers, metrics, body = eager[r.op_id]
        assert r.parsed and r.status == 200
        parsed += 1
        if not identical(r.json(), value):
            bad.append((name, r.json(), value))
        assert r.json() is r.json()                 # converted once
        assert r.headers == headers and r.headers["content-type"] == "application/json"
        assert r.metrics == metrics and r.metrics["bytes"] == len(r.body)
        assert r.body == body
    assert bad == []
    return parsed


@pytest.fixture(scope="module")
def transform_server() -> Iterator[Server]:
    srv = start_server("--files", str(TRANSFORM))
    yield srv
    stop_server(srv.proc)


def test_jsontestsuite_parsing_values_equal_the_eager_conversion(server: Server,
                                                                  eager: Eager) -> None:
    names = sorted(n for n in os.listdir(SUITE) if not n.startswith("n_"))
    assert len(names) > 120, "JSONTestSuite not found at %s" % SUITE
    parsed = check_against_eager(fetch_all(server, names), eager)
    # every y_ file but y_object_escaped_null_in_key (jansson cannot hold it)
    assert parsed >= sum(n.startswith("y_") for n in names) - 1


def test_jsontestsuite_transform_values_equal_the_eager_conversion(transform_server: Server,
                                                                    eager: Eager) -> None:
    names = sorted(os.listdir(TRANSFORM))
    assert len(names) == 22, "JSONTestSuite test_transform not found at %s" % TRANSFORM
    parsed = check_against_eager(fetch_all(transform_server, names), eager)
    assert parsed >= 12


def _tricky_doc(rng: random.Random, depth: int = 0) -> Any:
    scalars = [0, -0, 1, -1, 2**63 - 1, -(2**63), 10**15, 0.0, -0.0, 0.1, 1e308, -1e-308,
               5e-324, 2.5e-320, 1.7976931348623157e308, 123456789.123456789, 1e22, 3.0,
               True, False, None, "", "\u0000", "a\"b\\c/", "\u00e9\u20ac\U0001d11e",
               "\ufeff\uffff\u2028\u2029", "\t\n\r\x01\x1f"]
    if depth > 4 or rng.random() < 0.3:
        return rng.choice(scalars)
    if rng.random() < 0.5:
        return [_tricky_doc(rng, depth + 1) for _ in range(rng.randrange(0, 6))]
    return {rng.choice(["k", "\u00e9", "", "a b", "\U0001f600"]) + str(i):
            _tricky_doc(rng, depth + 1) for i in range(rng.randrange(0, 6))}


def _spell_numbers(rng: random.Random) -> List[bytes]:
    """Number spellings json.dumps never writes."""
    return [b"1E2", b"1e-2", b"-0", b"-0.0", b"0e0", b"1.5E+3", b"100000000000000000000e-20",
            b"0.30000000000000004", b"4.9406564584124654e-324", b"9007199254740993",
            b"-9223372036854775808", b"9223372036854775807", b"1e-400", b"[1.0,2.50,3e0]",
            b'{"a":1,"b":2,"a":3}', b'{"a":{"x":1},"a":[2]}', b' \t\r\n{ "w" : [ ] } \n',
            b'"\\ud834\\udd1e\\u00e9\\/\\b\\f"', b'"\\u0000"', b"[" * 500 + b"]" * 500,
            b"%d" % rng.randrange(-2**63, 2**63)]


@pytest.fixture(scope="module")
def generated_server() -> Iterator[Tuple[Server, List[str]]]:
    rng = random.Random(1234)
    tmp = tempfile.mkdtemp(prefix="fetchq-lazy-")
    names = []
    for i, text in enumerate(_spell_numbers(rng)):
        names.append("spelled-%02d.json" % i)
        Path(tmp, names[-1]).write_bytes(text)
    for i in range(60):
        doc = _tricky_doc(rng)
        names.append("doc-%02d.json" % i)
        Path(tmp, names[-1]).write_bytes(json.dumps(doc, ensure_ascii=bool(i % 2)).encode())
    srv = start_server("--files", tmp)
    yield srv, names
    stop_server(srv.proc)
    for n in names:
        os.unlink(os.path.join(tmp, n))
    os.rmdir(tmp)


def test_generated_documents_equal_the_eager_conversion(generated_server: Tuple[Server, List[str]],
                                                        eager: Eager) -> None:
    srv, names = generated_server
    assert check_against_eager(fetch_all(srv, names), eager) == len(names)


def test_parse_auto_and_none(net_engine: fetchq.Engine, server: Server, eager: Eager) -> None:
    q = net_engine.queue("lazy")
    auto = q.get(server.url("/json?size=2000")).result(timeout=TIMEOUT)
    none = q.get(server.url("/json?size=2000"), parse="none", coalesce=False).result(timeout=TIMEOUT)
    assert auto.parsed and identical(auto.json(), eager[auto.op_id][0])
    assert not none.parsed and eager[none.op_id][0] is None
    assert none.json() == auto.json() and none.json() is not none.json()  # parsed each call


def test_http_error_response_keeps_the_engine_value(net_engine: fetchq.Engine, server: Server,
                                                    eager: Eager) -> None:
    with pytest.raises(fetchq.HTTPError) as info:
        net_engine.queue("lazy").get(server.url("/status/503")).result(timeout=TIMEOUT)
    resp = info.value.response
    assert resp.status == 503 and resp.parsed
    value, headers, metrics, body = eager[resp.op_id]
    assert resp._vptr                                  # held as a json_t, not re-parsed
    assert identical(resp.json(), value) and value == {"status": 503}
    assert info.value.headers == headers == resp.headers and resp.metrics == metrics
    assert resp._hold == 0                             # everything converted: released


def test_too_deep_for_python_resolves_and_json_raises(server: Server) -> None:
    """A document the engine parses (max_json_depth) but Python cannot
    (recursion limit): the future resolves; json() raises RecursionError.
    (Converted in the callback, the error used to be logged there and the
    future never resolved.)"""
    with fetchq.Engine(workers=2, max_json_depth=2000) as engine:
        r = engine.queue("lazy").get(server.url("/deep?n=1500")).result(timeout=TIMEOUT)
        assert r.parsed and r.status == 200 and len(r.body) == 3000
        with pytest.raises(RecursionError):
            r.json()
        assert r.headers["content-type"] == "application/json"


def test_data_survives_the_engine(server: Server, eager: Eager) -> None:
    children: List[fetchq.Result] = []
    deps: List[fetchq.Result] = []
    cfg = {"url": server.url("/search?q={query}&rpp=500"), "results": "/results", "id": "/id"}
    with fetchq.Engine(workers=2, search=cfg) as engine:
        q = engine.queue("lazy")
        resps = [q.get(server.url("/json?size=%d" % (100 * i)), coalesce=False) for i in range(1, 20)]
        merged = q.search_all(["swift", "c"], on_child=children.append)

        def keep(op: fetchq.Op) -> int:
            r = op.dependency(resps[0])
            assert r is not None
            deps.append(r)
            return 1

        assert q.submit(keep, pass_op=True, depends_on=resps[0]).result(timeout=TIMEOUT) == 1
        results = [f.result(timeout=TIMEOUT) for f in resps]
        merged_value = merged.result(timeout=TIMEOUT)
    gc.collect()
    for r in results:                       # engine freed; nothing converted yet
        value, headers, metrics, body = eager[r.op_id]
        assert identical(r.json(), value) and r.headers == headers and r.metrics == metrics
    assert sorted(c.query for c in children) == ["c", "swift"]
    for c in children:
        assert c.ok and c.value["query"] == c.query and c.value["count"] == len(c.value["items"])
        assert c.headers["content-type"] == "application/json" and c.metrics["bytes"] == len(c.body)
        assert c.value["count"] == merged_value["queries"][c.query]["count"]
    (d,) = deps
    assert d.value == results[0].json() and d.headers == results[0].headers
    assert d.http_status == 200 and d.body == results[0].body


def test_concurrent_first_access_gives_one_object(server: Server) -> None:
    with fetchq.Engine(workers=2) as engine:
        q = engine.queue("lazy")
        for _ in range(5):
            r = q.get(server.url("/json?size=20000"), coalesce=False).result(timeout=TIMEOUT)
            seen: List[Tuple[int, int, int, int]] = []
            go = threading.Barrier(8)

            def read() -> None:
                go.wait(TIMEOUT)
                seen.append((id(r.json()), id(r.headers), id(r.metrics), id(r.body)))

            threads = [threading.Thread(target=read) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT)
            assert len(seen) == 8 and len(set(seen)) == 1
            assert r._hold == 0


def test_copy_and_pickle_are_plain_converted_objects(net_engine: fetchq.Engine, server: Server) -> None:
    r = net_engine.queue("lazy").get(server.url("/json?size=300")).result(timeout=TIMEOUT)
    for other in (copy.copy(r), copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
        assert other is not r and other._hold == 0
        assert (other.status, other.body, other.op_id, other.parsed, other.from_cache) == \
            (r.status, r.body, r.op_id, r.parsed, r.from_cache)
        assert other.json() == r.json() and other.headers == r.headers and other.metrics == r.metrics
    del other
    gc.collect()
    assert r.headers["content-type"] == "application/json"     # the original still works


def test_assigning_replaces_the_held_value(net_engine: fetchq.Engine, server: Server) -> None:
    r = net_engine.queue("lazy").get(server.url("/json?size=300")).result(timeout=TIMEOUT)
    before = _ffi.held_count()
    r.headers = {"x": "1"}
    r.metrics = {}
    assert r.headers == {"x": "1"} and r.metrics == {}
    assert r._hold != 0                 # the body is still only in the held result
    r.body = b"[2]"
    assert r.body == b"[2]" and r._hold == 0
    assert _ffi.held_count() == before - 1
    made = fetchq.Response(200, {"a": "b"}, b"[1]", {"m": 1}, 7, [1], True)
    assert made.json() == [1] and made.headers == {"a": "b"} and made.metrics == {"m": 1}


# -- references: every hold is released exactly once -------------------------

def test_held_references_are_released(server: Server) -> None:
    gc.collect()
    base = _ffi.held_count()
    cfg = {"url": server.url("/search?q={query}&rpp=500"), "results": "/results", "id": "/id"}
    kids: List[fetchq.Result] = []
    with fetchq.Engine(workers=2, search=cfg) as engine:
        q = engine.queue("lazy", max_concurrent=8)
        futs = [q.get(server.url("/json?size=500&i=%d" % i)) for i in range(300)]
        errs = [q.get(server.url("/status/404")) for _ in range(20)]
        sa = q.search_all(["swift", "python", "go"], on_child=kids.append)
        rs = [f.result(timeout=TIMEOUT) for f in futs]
        for f in errs:
            assert isinstance(f.exception(timeout=TIMEOUT), fetchq.HTTPError)
        sa.result(timeout=TIMEOUT)
        assert _ffi.held_count() >= base + 300 + 3
        for r in rs[::3]:
            r.headers, r.metrics, r.body   # converted and copied: released at once
        for r in rs[1::3]:
            r.json()                       # the value is the body: the rest still held
    held = _ffi.held_count()
    assert held <= base + 300 - 100 + 20 + 3
    del rs, futs, errs, sa, kids, r, f
    gc.collect()
    assert _ffi.held_count() == base


def test_dependency_result_refcount_goes_back(engine: fetchq.Engine) -> None:
    """A Result takes exactly one reference to the dependency's value and
    drops it once converted or collected (read with the value still owned by
    the engine, inside the dependent's body)."""
    q = engine.queue("lazy")
    a = q.submit(lambda: {"payload": list(range(50))})

    def body(op: fetchq.Op) -> List[int]:
        ptr = engine._core.lib.fq_op_dependency_result(op._handle(), a.op_id)
        counts = [_ffi.refcount(ptr)]
        r = op.dependency(a)
        assert r is not None
        counts.append(_ffi.refcount(ptr))
        assert r.value == {"payload": list(range(50))}
        counts.append(_ffi.refcount(ptr))      # converted: released
        unread = [op.dependency(a) for _ in range(10)]
        counts.append(_ffi.refcount(ptr))
        del unread
        gc.collect()
        counts.append(_ffi.refcount(ptr))
        return counts

    base, held, converted, ten, dropped = q.submit(body, pass_op=True, depends_on=a).result(timeout=TIMEOUT)
    assert (held, converted, ten, dropped) == (base + 1, base, base + 10, base)


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_many_responses_do_not_grow_memory(server: Server) -> None:
    """20 000 responses created and dropped, read in every way or not at
    all: the process's RSS stays bounded (a held header/metrics pair that
    leaked would be ~2 KB each: ~30 MB over the 16 000 measured)."""
    with fetchq.Engine(workers=2) as engine:
        q = engine.queue("lazy", max_concurrent=16)

        def round_(i: int) -> None:
            futs = [q.get(server.url("/json?size=200&k=%d" % k), coalesce=False)
                    for k in range(2000)]
            for k, f in enumerate(futs):
                r = f.result(timeout=TIMEOUT)
                if k % 4 == 1:
                    r.json()
                elif k % 4 == 2:
                    r.headers, r.metrics
                elif k % 4 == 3:
                    r.json(), r.headers, r.metrics, r.text

        round_(0)
        round_(1)
        gc.collect()
        start = _rss_kb()
        held = _ffi.held_count()
        for i in range(2, 10):
            round_(i)
        gc.collect()
        grown = _rss_kb() - start
        assert _ffi.held_count() == held
        assert grown < 10_000, "RSS grew by %d KB over 16 000 responses" % grown


# -- the submit side -----------------------------------------------------------

def test_options_objects_are_cached_per_engine(server: Server) -> None:
    with fetchq.Engine(workers=2) as engine:
        core = engine._core
        q = engine.queue("lazy")
        url = server.url("/json?size=100")
        for i in range(6):
            mode = ("json", "none")[i % 2]
            r = q.get(url, parse=mode, coalesce=False).result(timeout=TIMEOUT)
            assert r.parsed is (mode == "json")
        assert len(core.json_cache.entries) == 2
        first = q.get(url, coalesce=False)
        dep = q.get(url, coalesce=False, depends_on=first)       # per operation: not cached
        assert dep.result(timeout=TIMEOUT).status == 200 and len(core.json_cache.entries) == 3
        with pytest.raises(ValueError):
            q.get(url, timeout_ms=float("nan"))
        with pytest.raises(fetchq.InvalidArgument):
            q.get(url, parse="yaml")                                 # the library checks it
        with pytest.raises(fetchq.InvalidArgument):
            q.get(url, parse="yaml")                                 # also when cached
        # Flat options are keyed without serializing them, by value and exact
        # type: True is cached, and 1 (not a JSON boolean) is still refused.
        assert q.get(url, coalesce=True, parse="none").result(timeout=TIMEOUT).status == 200
        with pytest.raises(fetchq.InvalidArgument, match="coalesce"):
            q.get(url, coalesce=1, parse="none")
        # Nested options are keyed by their JSON text.
        for _ in range(2):
            assert q.get(url, coalesce=False, retry={"max": 1}).result(timeout=TIMEOUT).status == 200
        keys = list(core.json_cache.entries)
        # json, none, coalesce=False, yaml, coalesce=True, coalesce=1 and retry
        assert sum(isinstance(k, bytes) for k in keys) == 1 and len(keys) == 7
        entries = list(core.json_cache.entries.values())
        assert all(_ffi.refcount(p) == 1 for p in entries)
    assert core.json_cache.entries == {} and core.json_cache.closed


def test_plain_get_request_object_is_equivalent(net_engine: fetchq.Engine, server: Server) -> None:
    q = net_engine.queue("lazy")
    r = q.request("PURGE", server.url("/echo?x=%C3%A9")).result(timeout=TIMEOUT)
    assert r.json()["method"] == "PURGE" and r.json()["query"] == {"x": "\u00e9"}
    with pytest.raises(fetchq.InvalidArgument):
        q.get(server.url("/echo\u0000x"))
    with pytest.raises(ValueError):
        q.get(server.url("/echo\ud800"))
    with pytest.raises(fetchq.InvalidArgument):
        q.request("GE T", server.url("/echo"))
    ptr = _ffi.request_json("GET", "http://h/\u00e9\u0000")
    assert _ffi.from_json(ptr) == {"method": "GET", "url": "http://h/\u00e9\u0000"}
    assert _ffi.refcount(ptr) == 1
    _ffi.decref(ptr)


def test_checked_loads_equals_json_loads() -> None:
    """json() of a checked body scans it without json.loads' whitespace
    matches; for any text it must give json.loads' value or its error."""
    texts = ["[1]", " [1]", "[1] ", "[1]\n\t\r ", '"x"', "1", "-0", "1e400", "NaN", "[1] x", "",
             "  ", '{"a":1}{}', '{"a":1,"a":2}', "\ufeff[1]", "[1]\u00a0"]
    for name in sorted(os.listdir(SUITE)):
        try:
            texts.append((SUITE / name).read_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            continue
    assert len(texts) > 250

    def outcome(fn: Any, text: str) -> Any:
        try:
            return ("value", fn(text))
        except RecursionError:
            return ("error", "RecursionError")
        except ValueError as e:
            return ("error", type(e).__name__, str(e))

    for text in texts:
        a, b = outcome(_engine._loads_checked, text), outcome(json.loads, text)
        # repr tells 1 from 1.0 and True, -0.0 from 0.0, and NaN equals NaN
        assert a[0] == b[0] and (repr(a[1]) == repr(b[1]) if a[0] == "value" else a == b), text[:60]


def test_plain_request_objects_are_reused_and_never_shared(server: Server) -> None:
    """Plain requests reuse a few {"method", "url"} objects (a new URL set
    into one for each submit): from 8 threads at once every request still
    goes to its own URL, the library keeps no reference to them, and at most
    _PLAIN_KEEP wait per method."""
    errors: List[BaseException] = []
    with fetchq.Engine(workers=2) as engine:
        q = engine.queue("plain", max_concurrent=16)

        def run(t: int) -> None:
            try:
                futs = [(i, q.request("DELETE" if i % 5 == 0 else "GET",
                                      server.url("/echo?t=%d&i=%d" % (t, i)), coalesce=False))
                        for i in range(40)]
                for i, f in futs:
                    echo = f.result(timeout=TIMEOUT).json()
                    assert echo["query"] == {"t": str(t), "i": str(i)}
                    assert echo["method"] == ("DELETE" if i % 5 == 0 else "GET")
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
    assert errors == []
    for method in ("GET", "DELETE"):
        pool = _ffi._PLAIN_FREE[method]
        assert 1 <= len(pool) <= _ffi._PLAIN_KEEP
        assert all(_ffi.refcount(item.ptr) == 1 for item in pool)
        assert len({ctypes.cast(item.ptr, ctypes.c_void_p).value for item in pool}) == len(pool)


def test_hold_and_release_count_references() -> None:
    a = _ffi.to_json({"k": [1, 2]})
    b = _ffi.to_json("s")
    base = _ffi.held_count()
    h = _ffi.hold(a, None, b, 0)
    assert _ffi.refcount(a) == 2 and _ffi.refcount(b) == 2 and _ffi.held_count() == base + 1
    assert _ffi.from_json(h) == [{"k": [1, 2]}, None, "s", None]
    _ffi.release(h)
    _ffi.release(h)                 # a second release is a no-op
    assert _ffi.refcount(a) == 1 and _ffi.refcount(b) == 1 and _ffi.held_count() == base
    assert _ffi.hold(None, 0) == 0
    _ffi.decref(a)
    _ffi.decref(b)


def test_a_response_keeps_its_result_and_builds_headers_and_metrics_only_when_read(server: Server) -> None:
    with fetchq.Engine() as engine:
        r = engine.queue("held").get(server.url("/json?size=100")).result(timeout=TIMEOUT)
        assert isinstance(r._hold, _ffi.ResultHold) and callable(r._hptr) and callable(r._mptr)
    held = _ffi.held_count()
    # read after the engine is closed: the retained fq_result is still valid
    assert r.headers["content-type"] == "application/json"
    assert r._hold != 0                                   # metrics not read yet
    assert r.metrics["attempts"] == 1
    assert r._hold != 0                                   # the body not read yet
    assert r.metrics["bytes"] == len(r.body)
    assert r._hold == 0 and _ffi.held_count() == held - 1  # released once all were read
    assert r.parsed and r.json()["items"] is not None


def test_a_held_body_is_copied_only_when_read(server: Server) -> None:
    """json() decodes the body straight from the held fq_result; .body is
    copied on first read, once, and equals the bytes the server sent."""
    with fetchq.Engine() as engine:
        q = engine.queue("held")
        a = q.get(server.url("/json?size=3000")).result(timeout=TIMEOUT)
        b = q.get(server.url("/json?size=3000"), coalesce=False).result(timeout=TIMEOUT)
        empty = q.get(server.url("/status/204")).result(timeout=TIMEOUT)
    assert a._body is _engine._PENDING and b._body is _engine._PENDING
    value = a.json()                                      # the value first, then the body
    assert a._body is _engine._PENDING                    # json() did not copy it
    assert a.body is a.body and a._body is not _engine._PENDING
    assert json.loads(a.body) == value and len(a.body) >= 3000
    assert b.body == a.body and b.json() == value         # the body first, then the value
    assert empty.status == 204 and empty.body == b"" and empty._body == b""
    assert repr(a).endswith("%d bytes>" % len(a.body))
    assert pickle.loads(pickle.dumps(b)).body == a.body


def test_a_large_response_does_not_keep_its_result(net_engine: fetchq.Engine, server: Server) -> None:
    """Keeping the fq_result keeps the library's copy of the body as well:
    above 64 KiB the response holds its headers and metrics objects instead."""
    q = net_engine.queue("held")
    small = q.get(server.url("/bytes?n=%d" % (64 * 1024))).result(timeout=TIMEOUT)
    large = q.get(server.url("/bytes?n=%d" % (64 * 1024 + 1))).result(timeout=TIMEOUT)
    assert isinstance(small._hold, _ffi.ResultHold)
    assert large._hold and not isinstance(large._hold, _ffi.ResultHold)
    assert len(large.body) == 64 * 1024 + 1 and large.headers["content-length"] == str(64 * 1024 + 1)
    assert large.metrics["bytes"] == len(large.body) and large._hold == 0
