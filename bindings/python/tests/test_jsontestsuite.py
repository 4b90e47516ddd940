"""JSONTestSuite (shared/data/JSONTestSuite/test_parsing) through the binding:
every file fetched from the test server's /file/NAME with parse="json".

y_  must parse, to the same value Python's json module reads (except
    y_object_escaped_null_in_key.json, which jansson cannot represent:
    ParseError);
n_  must fail with ParseError;
i_  may go either way, but only those two ways.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List
from urllib.parse import quote

import pytest

import fetchq

from conftest import SUITE, TIMEOUT, Server, identical

FILES: List[str] = sorted(os.listdir(SUITE)) if SUITE.is_dir() else []
JANSSON_CANNOT = {"y_object_escaped_null_in_key.json"}



def test_the_suite_is_there() -> None:
    # A missing suite must fail, not skip.
    assert len(FILES) == 318, "JSONTestSuite not found (or incomplete) at %s" % SUITE


@pytest.fixture(scope="module")
def outcomes(server: Server) -> Iterator[Dict[str, Any]]:
    """Submits every file at once and collects each future's outcome."""
    with fetchq.Engine(workers=4, max_json_depth=2048) as engine:
        q = engine.queue("suite", max_concurrent=8)
        futs = {name: q.get(server.url("/file/" + quote(name, safe="")), parse="json")
                for name in FILES}
        out: Dict[str, Any] = {}
        for name, f in futs.items():
            exc = f.exception(timeout=TIMEOUT)
            out[name] = exc if exc is not None else f.result()
        assert engine._core.violations == []
        yield out


@pytest.mark.parametrize("name", [n for n in FILES if n.startswith("y_")])
def test_y(outcomes: Dict[str, Any], name: str) -> None:
    got = outcomes[name]
    if name in JANSSON_CANNOT:
        assert isinstance(got, fetchq.ParseError), got
        return
    assert isinstance(got, fetchq.Response), "%s: %r" % (name, got)
    assert got.status == 200 and got.parsed
    want = json.loads((SUITE / name).read_bytes())
    # Same types too: 1 is not 1.0 nor True, -0.0 is not 0.0, keys in order.
    assert identical(got.json(), want), (got.json(), want)


@pytest.mark.parametrize("name", [n for n in FILES if n.startswith("n_")])
def test_n(outcomes: Dict[str, Any], name: str) -> None:
    got = outcomes[name]
    assert isinstance(got, fetchq.ParseError), "%s: %r" % (name, got)
    assert got.message


@pytest.mark.parametrize("name", [n for n in FILES if n.startswith("i_")])
def test_i(outcomes: Dict[str, Any], name: str) -> None:
    got = outcomes[name]
    assert isinstance(got, (fetchq.Response, fetchq.ParseError)), "%s: %r" % (name, got)
    if isinstance(got, fetchq.Response):
        assert got.parsed and got.status == 200
