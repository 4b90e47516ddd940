"""The engine's HTTP cache (config/option "cache") and its log lines routed
to Python logging (fq_engine_set_log_fn)."""

from __future__ import annotations

import copy
import logging
import pickle
import threading
from typing import Any, List

import pytest

import fetchq

from conftest import TIMEOUT, Server, has_function

needs_cache = pytest.mark.cache  # the library must have the HTTP cache
needs_log = pytest.mark.log


@pytest.fixture
def cache_engine(server: Server) -> Any:
    e = fetchq.Engine(workers=2, cache={"max_bytes": 1 << 20})
    yield e
    e.close()
    assert e._core.violations == []


@needs_cache
def test_fresh_entry_is_served_from_cache(cache_engine: fetchq.Engine, server: Server) -> None:
    q = cache_engine.queue("c")
    url = server.url("/cache?max_age=60&key=py-fresh")
    first = q.get(url).result(timeout=TIMEOUT)
    second = q.get(url).result(timeout=TIMEOUT)
    assert not first.from_cache and second.from_cache
    assert second.json() == first.json() == {"key": "py-fresh", "max_age": 60, "count": 1}
    assert second.metrics["from_cache"] is True
    st = cache_engine.stats()["cache"]
    assert st["hits"] >= 1 and st["entries"] >= 1
    reload = q.get(url, cache="reload").result(timeout=TIMEOUT)
    assert not reload.from_cache and reload.json()["count"] == 2


@needs_cache
def test_only_if_cached_miss(cache_engine: fetchq.Engine, server: Server) -> None:
    with pytest.raises(fetchq.CacheMiss):
        cache_engine.queue("c").get(server.url("/cache?key=py-miss"),
                                    cache="only-if-cached").result(timeout=TIMEOUT)


@needs_cache
def test_stale_while_revalidate_updates_first(cache_engine: fetchq.Engine, server: Server) -> None:
    q = cache_engine.queue("c")
    url = server.url("/etag?key=py-swr")                 # max-age=0: always stale
    assert q.get(url).result(timeout=TIMEOUT).json()["count"] == 1
    updates: List[Any] = []
    box: List[Any] = []
    f = q.get(url, cache="stale-while-revalidate",
              on_update=lambda r: updates.append((r.from_cache, r.json(), bool(box) and box[0].done())))
    box.append(f)
    fresh = f.result(timeout=TIMEOUT)
    assert updates == [(True, {"key": "py-swr", "version": "v1", "count": 1}, False)]
    assert fresh.status == 200 and fresh.json()["version"] == "v1"
    with pytest.raises(TypeError):
        q.get(url, on_update=5)  # type: ignore[arg-type]


@needs_log
def test_log_lines_go_to_python_logging(server: Server, caplog: Any) -> None:
    caplog.set_level(1, logger="fetchq.engine")
    threads: List[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: threads.append(threading.current_thread().name)  # type: ignore[method-assign]
    logging.getLogger("fetchq.engine").addHandler(handler)
    try:
        with fetchq.Engine(workers=1, log="trace") as e:
            e.queue("l").get(server.url("/json?size=10")).result(timeout=TIMEOUT)
    finally:
        logging.getLogger("fetchq.engine").removeHandler(handler)
    records = [r for r in caplog.records if r.name == "fetchq.engine"]
    assert records and all(r.getMessage() for r in records)
    assert {r.levelno for r in records} <= {5, 10, 20, 25, 30, 40, 50}


@needs_log
def test_log_can_stay_on_stderr(server: Server, caplog: Any) -> None:
    caplog.set_level(1, logger="fetchq.engine")
    with fetchq.Engine(workers=1, log="off", use_logging=False) as e:
        e.queue("l").get(server.url("/json?size=10")).result(timeout=TIMEOUT)
    assert not [r for r in caplog.records if r.name == "fetchq.engine"]



@needs_cache
def test_a_copy_of_a_cached_response_is_still_from_cache(cache_engine: fetchq.Engine, server: Server) -> None:
    """copy, deepcopy and pickle give a plain Response with every field,
    from_cache too (found by mutation testing, review 34)."""
    q = cache_engine.queue("c")
    url = server.url("/cache?max_age=60&key=py-copy")
    assert not q.get(url).result(timeout=TIMEOUT).from_cache
    cached = q.get(url).result(timeout=TIMEOUT)
    assert cached.from_cache
    for other in (copy.copy(cached), copy.deepcopy(cached), pickle.loads(pickle.dumps(cached))):
        assert other is not cached and other.from_cache is True
        assert other.json() == cached.json()
