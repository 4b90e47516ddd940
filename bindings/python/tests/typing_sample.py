"""User code of the documented API, for the type checkers: each
``assert_type`` says what docs/python.md promises. test_lifetime.py runs
``mypy --strict`` on this file against the package in this tree; it is never
run (its functions are not called)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import fetchq

if sys.version_info >= (3, 11):
    from typing import assert_type
else:
    from typing_extensions import assert_type


def with_threads(url: str) -> int:
    with fetchq.Engine(timeout_ms=10_000, ca_file=Path("/etc/ssl/certs/ca-certificates.crt")) as engine:
        q = engine.queue("q", max_concurrent=4)
        assert_type(q, "fetchq.Queue[fetchq.Future[Any]]")
        assert_type(q.engine, fetchq.Engine)          # its engine, with Engine's methods
        q.engine.wait_idle(timeout=1)
        with q.engine:
            pass

        fut = q.request("POST", url, json={"a": 1})
        assert_type(fut, "fetchq.Future[fetchq.Response]")
        r = fut.result(timeout=10)
        assert_type(r, fetchq.Response)
        assert_type(q.get(url).result(timeout=10), fetchq.Response)
        assert_type(q.get_many([url]), "List[fetchq.Future[fetchq.Response]]")
        assert_type(q.request_many("GET", [url]), "List[fetchq.Future[fetchq.Response]]")
        assert_type(q.search("swift").result(timeout=10), Dict[str, Any])
        assert_type(q.search_all(["swift", "go"]).result(timeout=10), Dict[str, Any])

        a = q.submit(lambda: 21)
        assert_type(a, "fetchq.Future[Any]")

        def double(op: fetchq.Op) -> int:
            return int(op.dependency_result(a)) * 2

        b = q.submit(double, pass_op=True, depends_on=[a])
        engine.set_priority(b, "high")
        engine.add_dependency(b, a)
        engine.cancel(b)
        engine.cancel(a.op_id)
        try:
            q.get(url).result(timeout=10)
        except fetchq.HTTPError as e:
            assert_type(e.response, Optional[fetchq.Response])
            if e.response is not None:
                return e.response.status + e.status
        return r.status


async def with_asyncio(url: str) -> int:
    async with fetchq.AsyncEngine() as engine:
        q = engine.queue("q")
        assert_type(q, fetchq.AsyncQueue)
        assert_type(q.engine, fetchq.AsyncEngine)
        await q.engine.queue("other").wait(1)        # a coroutine here
        await q.engine.wait_idle(timeout=1)

        assert_type(q.get(url), "fetchq.AsyncFuture[fetchq.Response]")
        assert_type(await q.request("GET", url), fetchq.Response)
        assert_type(await q.arequest("GET", url), fetchq.Response)
        assert_type(await q.search("swift"), Dict[str, Any])
        assert_type(await q.asearch("swift"), Dict[str, Any])
        assert_type(await q.asearch_all(["swift", "go"]), Dict[str, Any])
        assert_type(q.get_many([url]), "List[fetchq.AsyncFuture[fetchq.Response]]")
        responses = await asyncio.gather(*q.get_many([url, url]))
        assert_type(responses, List[fetchq.Response])

        fut = q.submit(lambda: 1)
        assert_type(fut, "fetchq.AsyncFuture[Any]")
        engine.cancel(fut)
        return sum(r.status for r in responses)
