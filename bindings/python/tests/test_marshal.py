"""Option "marshal": the engine writes each parsed body in CPython's marshal
format, and Response.json() makes its objects from that (fetchq.h,
fq_result_marshal). What json() returns must be exactly what json.loads
returns for the same body: the same types (int stays int, -0.0 keeps its
sign), the same float bits, the same key order, a repeated key once.

Documents: every JSONTestSuite file the engine accepts (test_jsontestsuite.py
fetches them; checked again here, exactly), and 400 generated ones (seeded)
aimed at the encoder's cases: integers around 2^31 and 2^63, reals from
denormals to DBL_MAX, escapes and surrogate pairs, raw UTF-8, strings of
255/256 bytes (1- and 4-byte lengths), more distinct keys than the encoder
remembers, repeated and duplicate keys, nesting at and past its limit.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import fetchq
from fetchq import _ffi

from conftest import SUITE, Server, fetch_all, identical, require_function, start_server, stop_server

SEED = 20261123
N_GENERATED = 400
MAX_DEPTH = 500  # fetchq.h: deeper values are not written in marshal's format


def test_identical_tells_types_signs_and_order_apart() -> None:
    assert identical({"a": [1, -0.0, "x"]}, {"a": [1, -0.0, "x"]})
    assert not identical(1, 1.0)
    assert not identical(0.0, -0.0)
    assert not identical(True, 1)
    assert not identical({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert not identical([1, [2]], [1, [2, 3]])


# ---- generated documents ----------------------------------------------------

def _string(r: random.Random) -> str:
    k = r.random()
    if k < 0.3:
        return "".join(r.choice("abcxyz_") for _ in range(r.randint(0, 8)))
    if k < 0.5:
        return "".join(chr(r.choice([r.randint(0x20, 0x7E), r.randint(0x80, 0x7FF),
                                     r.randint(0x800, 0xD7FF), r.randint(0xE000, 0xFFFF),
                                     r.randint(0x10000, 0x10FFFF)]))
                       for _ in range(r.randint(0, 20)))
    if k < 0.6:
        return r.choice("xé") * r.choice([254, 255, 256, 300])
    return "".join(r.choice(["a", "\n", '"', "\\", "/", "\x00", "\x1f", "é", "\U0001F600"])
                   for _ in range(r.randint(0, 10)))


def _number(r: random.Random) -> Any:
    k = r.random()
    if k < 0.3:
        return r.choice([0, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**63 - 1, -2**63,
                         2**32, 2**45, -2**60, 2**30, 2**15, 32767])
    if k < 0.5:
        return r.randint(-2**63, 2**63 - 1)
    if k < 0.8:
        return r.uniform(-1e10, 1e10) * 10.0 ** r.randint(-300, 290)
    return r.choice([0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
                     0.1, 1e22, 1e23, -1.5])


def _value(r: random.Random, depth: int, keys: List[str]) -> Any:
    k = r.random()
    if depth > 5 or k < 0.5:
        return r.choice([lambda: _string(r), lambda: _number(r),
                         lambda: r.choice([True, False, None])])()
    if k < 0.75:
        return [_value(r, depth + 1, keys) for _ in range(r.randint(0, 6))]
    # keys: from a shared pool (repeated across objects) or new; never a NUL
    # (jansson cannot hold one in a key: such documents fail to parse)
    names = [r.choice(keys) if r.random() < 0.5 else _string(r).replace("\x00", "")
             for _ in range(r.randint(0, 8))]
    return {name: _value(r, depth + 1, keys) for name in names}


def _text(r: random.Random, v: Any) -> str:
    text = json.dumps(v, ensure_ascii=r.random() < 0.5)
    if r.random() < 0.3:
        # reals written another way json.loads reads to the same float
        text = text.replace("e+", "E+").replace("0.1", "1e-1")
    if r.random() < 0.2 and text.startswith("{"):
        text = '{"dup": 1, "dup": [2], ' + text[1:] if text != "{}" else '{"dup": 1, "dup": [2]}'
    if r.random() < 0.1:
        text = " \n" + text + "\t "
    return text


def _documents() -> Dict[str, bytes]:
    r = random.Random(SEED)
    keys = ["id", "name", "k%d" % 7, "é", "\U0001F600", "a\\b", "x" * 300]
    docs = {"gen%03d.json" % i: _text(r, _value(r, 0, keys)).encode("utf-8")
            for i in range(N_GENERATED)}
    # more distinct keys than the encoder remembers (96), in repeated objects
    docs["many_keys.json"] = json.dumps([{"key%d" % j: j for j in range(200)}] * 3).encode()
    # keys the encoder's table finds by length and first 8 bytes, and past 8
    # bytes by the rest too: same length, head and last 8 bytes but another
    # middle byte; 8 against 9 bytes with the same head; prefixes of each
    # other; the empty key; a last key within 8 bytes of the text's end
    # (read byte by byte). Each object repeats them, so they are references.
    mid = ["abcdefgh%sijklmnop" % c for c in "XYZ"]
    near = ["abcdefgh", "abcdefghi", "abcdefgh\u00e9", "a", "ab", "", "\u00e9"]
    keys = mid + near
    obj = {k: i for i, k in enumerate(keys)}
    other = {k: 100 + i for i, k in reversed(list(enumerate(keys)))}  # other bytes after each key
    docs["key_collisions.json"] = (json.dumps([obj, other, obj], ensure_ascii=False)[:-1]
                                   + ', {"z": 1, "a": 2}]').encode()
    docs["top_int.json"] = b"-9223372036854775808"
    docs["top_string.json"] = b'"\\ud83d\\ude00"'
    docs["depth_500.json"] = b'{"a":' * (MAX_DEPTH - 1) + b"[1]" + b"}" * (MAX_DEPTH - 1)
    docs["depth_501.json"] = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    return docs


DOCS = _documents()


@pytest.fixture(scope="module")
def doc_server() -> Iterator[Tuple[Server, str]]:
    tmp = tempfile.mkdtemp(prefix="fetchq-marshal-")
    for name, data in DOCS.items():
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(data)
    srv = start_server("--files", tmp)
    yield srv, tmp
    stop_server(srv.proc)
    shutil.rmtree(tmp, ignore_errors=True)


def _responses(srv: Server, names: List[str], **options: Any) -> Dict[str, Any]:
    """fetch_all, each of which must have succeeded."""
    require_function("fq_result_marshal")
    out = fetch_all(srv, names, **options)
    failed = {n: r for n, r in out.items() if not isinstance(r, fetchq.Response)}
    assert not failed, failed
    return out


def _marshalled(r: fetchq.Response) -> Any:
    """The value the held result carries in marshal's format (NO_MARSHAL if
    none), read directly: json() would fall back to parsing the body."""
    assert r._hold, "the response does not hold its result"
    return _ffi.marshal_value(r._hold.address)


def test_the_binding_asks_for_it_on_cpython() -> None:
    require_function("fq_result_marshal")
    with fetchq.Engine() as engine:
        assert engine._core.has_marshal is (sys.implementation.name == "cpython")


def test_generated_documents_read_exactly_as_json_loads(doc_server: Tuple[Server, str]) -> None:
    srv, _ = doc_server
    results = _responses(srv, sorted(DOCS))
    written = 0
    for name, r in results.items():
        want = json.loads(DOCS[name])
        assert r.status == 200 and r.parsed, name
        carried = _marshalled(r)
        if name == "depth_501.json":
            assert carried is _ffi.NO_MARSHAL, "nested past the limit, yet written"
        else:
            assert carried is not _ffi.NO_MARSHAL, "%s: no marshal data" % name
            assert identical(carried, want), "%s: %r != %r" % (name, carried, want)
            written += 1
        got = r.json()    # through the marshal data, or the body past the limit
        assert identical(got, want), name
        assert r.json() is got   # converted once
    assert written == len(DOCS) - 1


def test_a_repeated_key_is_one_object_as_with_json_loads(doc_server: Tuple[Server, str]) -> None:
    srv, _ = doc_server
    r = _responses(srv, ["many_keys.json"])["many_keys.json"]
    v = r.json()
    want = json.loads(DOCS["many_keys.json"])
    first, second = (list(obj) for obj in v[:2])
    wfirst, wsecond = (list(obj) for obj in want[:2])
    # json.loads shares every repeated key; the encoder the first 96 it met
    assert all(a is b for a, b in zip(wfirst, wsecond))
    assert all(a is b for a, b in zip(first[:96], second[:96]))
    assert all(a == b for a, b in zip(first, second))


def test_keys_alike_in_the_encoders_table_stay_apart(doc_server: Tuple[Server, str]) -> None:
    srv, _ = doc_server
    r = _responses(srv, ["key_collisions.json"])["key_collisions.json"]
    v = _marshalled(r)
    want = json.loads(DOCS["key_collisions.json"])
    assert identical(v, want)
    first, second, third = (list(obj) for obj in v[:3])
    assert len(set(first)) == 10 and first == list(want[0])
    # each key met again is the first one's object (a reference), as with json.loads
    assert all(a is b for a, b in zip(first, third))
    assert all(a is b for a, b in zip(first, reversed(second)))
    assert list(v[3]) == ["z", "a"] and v[3]["a"] == 2
    # "a" within 8 bytes of the end: its head read byte by byte, still found
    assert list(v[3])[1] is first[first.index("a")]


def test_without_the_option_json_parses_the_body(doc_server: Tuple[Server, str]) -> None:
    srv, _ = doc_server
    names = ["gen000.json", "gen001.json", "many_keys.json"]
    results = _responses(srv, names, marshal=False)
    for name, r in results.items():
        assert _marshalled(r) is _ffi.NO_MARSHAL
        assert identical(r.json(), json.loads(DOCS[name]))


def test_body_read_first_then_json(doc_server: Tuple[Server, str]) -> None:
    srv, _ = doc_server
    r = _responses(srv, ["gen002.json"])["gen002.json"]
    assert r.body == DOCS["gen002.json"]
    assert identical(r.json(), json.loads(DOCS["gen002.json"]))


def test_marshal_option_must_be_a_boolean(doc_server: Tuple[Server, str]) -> None:
    srv, _ = doc_server
    require_function("fq_result_marshal")
    with fetchq.Engine() as engine:
        q = engine.queue("bad")
        with pytest.raises(fetchq.InvalidArgument, match="marshal"):
            q.get(srv.url("/file/gen000.json"), marshal="yes")


SUITE_FILES = sorted(n for n in os.listdir(SUITE) if n.startswith(("y_", "i_"))) if SUITE.is_dir() else []


def test_jsontestsuite_files_read_exactly_as_json_loads(server: Server) -> None:
    assert len(SUITE_FILES) == 95 + 35, "JSONTestSuite not found (or incomplete) at %s" % SUITE
    require_function("fq_result_marshal")
    results = fetch_all(server, SUITE_FILES)
    accepted = 0
    for name, r in results.items():
        if isinstance(r, fetchq.ParseError):
            continue
        assert isinstance(r, fetchq.Response), (name, r)
        want = json.loads((SUITE / name).read_bytes())
        carried = _marshalled(r)
        assert carried is not _ffi.NO_MARSHAL, name
        assert identical(carried, want), name
        assert identical(r.json(), want), name
        accepted += 1
    # every y_ file but the one jansson cannot hold, and the i_ files it takes
    assert accepted == 94 + 3


def test_without_pythonapi_the_bytes_are_read_with_marshal_loads(
        doc_server: Tuple[Server, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # where ctypes cannot reach PyMarshal_ReadObjectFromString: a bytes copy
    monkeypatch.setattr(_ffi, "_READ_MARSHAL", None)
    srv, _ = doc_server
    names = ["gen003.json", "many_keys.json", "top_string.json"]
    for name, r in _responses(srv, names).items():
        carried = _marshalled(r)
        assert carried is not _ffi.NO_MARSHAL
        assert identical(carried, json.loads(DOCS[name])), name
