"""fetchq — Python binding (pure ctypes) for libfetchq, an operation-queue
engine for network fetch/parse work.

Threads and futures::

    import fetchq

    with fetchq.Engine(search={"url": base + "/search?q={query}&rpp=50",
                               "results": "/results", "sort": "/created_at"}) as engine:
        q = engine.queue("search", max_concurrent=4)
        fut = q.search("swift")                      # a fetchq.Future
        print(fut.result(timeout=10)["items"])       # {"query", "items", "count"}

        r = q.request("POST", base + "/echo", json={"a": 1}).result(timeout=10)
        print(r.status, r.headers["content-type"], r.json())   # a fetchq.Response

        a = q.submit(lambda: 21)
        b = q.submit(lambda op: op.dependency_result(a) * 2, pass_op=True, depends_on=[a])
        assert b.result(timeout=10) == 42

asyncio (poll delivery; completions run on the loop's thread)::

    async with fetchq.AsyncEngine(search={...}) as engine:
        q = engine.queue("search")
        results = await asyncio.gather(*(q.asearch(t) for t in ("swift", "go")))

API
---
``Engine(**config)``
    Thread delivery (config keys of ``fq_engine_new``; ``delivery`` is chosen
    by the binding). Context manager; ``close()``, ``queue(name,
    max_concurrent=None)`` (default 4; the same name returns the same queue),
    ``cancel(fut_or_id)``, ``cancel_group(tag)``, ``cancel_all()``,
    ``set_priority(fut_or_id, p)``, ``add_dependency(op, dep)``, ``remove_dependency(op, dep)``, ``stats()``,
    ``wait_idle(timeout)``.
``AsyncEngine(**config)``
    Poll delivery driven by ``loop.add_reader(engine.event_fd, ...)``. Same
    methods; ``async with``/``await aclose()``; ``await wait_idle(timeout)``.
``Queue`` (from ``engine.queue``)
    ``search(query, progress=None, **options)``, ``search_all(queries,
    on_child=None, **options)``, ``request(method, url, *, headers, params,
    json, data, progress, **options)``, ``get(url, ...)``, ``submit(fn,
    *args, pass_op=False, **options)``, ``submit_async(start, *args,
    **options)`` (``start(op)`` returns at once; ``op.finish(value)`` later,
    from any thread) — each returns a future;
    ``suspend()``, ``resume()``, ``set_max_concurrent(n)``, ``cancel_all()``,
    ``wait(timeout)``, ``close()``. ``AsyncQueue`` adds ``asearch``,
    ``asearch_all``, ``arequest``, ``asubmit`` (coroutines); its ``wait`` is
    a coroutine and its submit methods return awaitable ``AsyncFuture``\\ s.
Python bodies
    ``submit(fn, *args)`` runs ``fn`` on a worker thread; ``fetchq.current_op()``
    (or ``pass_op=True``) gives its :class:`Op`: ``.id``, ``.cancelled``,
    ``.dependency_result(fut_or_id)`` (the value), ``.dependency(fut_or_id)``
    (a :class:`Result` with status, error, HTTP status, headers, body).
Options
    Keyword options are the C options: ``priority``, ``qos``, ``group``,
    ``depends_on`` (futures or ids), ``barrier``, ``max_wait_ms``, network
    limits (``timeout_ms``, ...), ``retry``, ``coalesce``, ``cache``,
    ``parse``, ``accept_status``, ``store``; ``progress=fn`` calls
    ``fn(received, expected_or_None)`` on the delivery thread (loop thread for
    AsyncEngine), always before the future resolves; with
    ``cache="stale-while-revalidate"``, ``on_update=fn`` gets the cached
    answer first. The library's log lines go to the ``logging`` logger
    "fetchq.engine" (``Engine(use_logging=False)``: standard error).
Futures
    ``fetchq.Future`` (a ``concurrent.futures.Future``) / ``fetchq.AsyncFuture``
    (an ``asyncio.Future``), with ``.op_id``. Results: search → dict
    ``{"query", "items", "count"}``, search_all → dict ``{"items", "count",
    "queries"}``, request → :class:`Response`, submit → the body's return
    value read back from JSON.
    Failures raise the exception for the status (:class:`HTTPError` has
    ``.status``, ``.body``, ``.response``); a dependency that failed or was
    cancelled raises :class:`DependencyError`; ``cancel()`` cancels the
    operation even while it runs and the future becomes cancelled when the
    engine confirms it (see :class:`Future`).
Errors
    :class:`FetchqError` and one subclass per ``fq_status`` (``.code``):
    InvalidArgument, NotFound, StateError, CycleError, ShutdownError, Timeout,
    Cancelled, DependencyError, OperationError, QueueTimeout (a Timeout),
    HTTPError, NetworkError, TooLarge, ParseError, TLSError, RedirectError,
    OutOfMemory, StoreError, CacheMiss; plus LibraryNotFound and
    UnsupportedError (the loaded library lacks a function).

``Store(path)``
    The item store (SQLite) that the search option ``store={"path",
    "collection", "merge"}`` writes: ``items(collection, sort=None,
    descending=False)``, ``get(collection, id)``, ``count(collection)``,
    ``upsert(collection, items, id_pointer="/id", merge=None)``, ``close()``.

The library is found through ``$FETCHQ_LIBRARY``, a copy inside this package,
then the system loader (see ``fetchq._ffi``).
"""

from ._engine import (
    AsyncEngine, AsyncFuture, AsyncOp, AsyncQueue, Engine, Future, Op, Queue,
    Response, Result, current_op, library_path, version,
)
from ._store import Store
from .errors import (
    CacheMiss, Cancelled, CycleError, DependencyError, FetchqError, HTTPError, InvalidArgument,
    LibraryNotFound, NetworkError, NotFound, OperationError, OutOfMemory, ParseError,
    QueueTimeout, RedirectError, ShutdownError, StateError, StoreError, Timeout,
    TLSError, TooLarge, UnsupportedError,
)

__version__ = "0.1.0"

__all__ = [
    "Engine", "AsyncEngine", "Queue", "AsyncQueue", "Future", "AsyncFuture",
    "Response", "Result", "Op", "AsyncOp", "current_op", "version", "library_path",
    "FetchqError", "InvalidArgument", "NotFound", "StateError", "CycleError",
    "ShutdownError", "Timeout", "Cancelled", "DependencyError", "OperationError",
    "QueueTimeout", "HTTPError", "NetworkError", "TooLarge", "ParseError",
    "TLSError", "RedirectError", "OutOfMemory", "StoreError", "CacheMiss", "LibraryNotFound",
    "UnsupportedError", "Store",
]
