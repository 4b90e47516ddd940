"""AsyncEngine: poll delivery through loop.add_reader; completions, progress
and child events on the loop's thread; task cancellation cancels operations."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from typing import Any, Awaitable, Callable, Dict, List, Tuple, TypeVar

import pytest

import fetchq

from conftest import TIMEOUT, Server, has_function, search_config

T = TypeVar("T")


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro_fn(), timeout=60)
    return asyncio.run(bounded())


needs_network = pytest.mark.network  # the library must have network ops


def test_needs_a_running_loop() -> None:
    with pytest.raises(fetchq.StateError, match="running event loop"):
        fetchq.AsyncEngine()
    with pytest.raises(fetchq.InvalidArgument):
        run(lambda: _make(delivery="thread"))


async def _make(**cfg: Any) -> None:
    fetchq.AsyncEngine(**cfg)


def test_asubmit_and_futures_on_the_loop_thread() -> None:
    async def main() -> None:
        loop_thread = threading.get_ident()
        async with fetchq.AsyncEngine(workers=2) as engine:
            assert engine.event_fd >= 0
            q = engine.queue("a", max_concurrent=2)
            assert isinstance(q, fetchq.AsyncQueue)
            assert await q.asubmit(lambda x: x * 2, 21) == 42
            fut = q.submit(lambda: {"k": [1]})
            assert isinstance(fut, fetchq.AsyncFuture) and isinstance(fut, asyncio.Future)
            threads: List[int] = []
            fut.add_done_callback(lambda f: threads.append(threading.get_ident()))
            assert await fut == {"k": [1]}
            await asyncio.sleep(0)
            assert threads == [loop_thread]
            dep = q.submit(lambda op: op.dependency_result(fut)["k"] + [2], pass_op=True, depends_on=fut)
            assert await dep == [1, 2]
            with pytest.raises(fetchq.OperationError, match="ZeroDivisionError"):
                await q.asubmit(lambda: 1 / 0)
            results = await asyncio.gather(*(q.asubmit(lambda i=i: i) for i in range(200)))
            assert results == list(range(200))
            later = q.submit_async(lambda op: threading.Timer(0.02, op.finish, args=("done",)).start())
            assert await later == "done"
        assert engine.closed
    run(main)


def test_task_cancel_cancels_the_operation() -> None:
    async def main() -> None:
        async with fetchq.AsyncEngine(workers=2) as engine:
            q = engine.queue("c", max_concurrent=1)
            started = threading.Event()
            saw: List[bool] = []

            def body(op: fetchq.Op) -> int:
                started.set()
                deadline = time.monotonic() + TIMEOUT
                while not op.cancelled and time.monotonic() < deadline:
                    time.sleep(0.002)
                saw.append(op.cancelled)
                return 1

            task = asyncio.ensure_future(q.asubmit(body, pass_op=True))
            while not started.is_set():
                await asyncio.sleep(0.005)
            queued = q.submit(lambda: 2)         # waits for the slot
            q.suspend()                          # and stays queued
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert saw == [True]                 # the running body saw the cancel
            assert queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            assert queued.cancelled()
            s = engine.stats()
            assert s["cancelled"] == 2 and s["succeeded"] == 0
            # wait_for cancels the operation on timeout
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(q.asubmit(lambda: 3), timeout=0.05)
            await q.wait(timeout=TIMEOUT)
            assert engine.stats()["cancelled"] == 3
    run(main)


def test_async_wait_and_timeout() -> None:
    async def main() -> None:
        async with fetchq.AsyncEngine(workers=2) as engine:
            q = engine.queue("w")
            q.suspend()
            futs = [q.submit(lambda i=i: i) for i in range(5)]
            # a negative timeout is a ValueError, as for Queue.wait and Engine.wait_idle
            with pytest.raises(ValueError, match="timeout must be >= 0 or None"):
                await q.wait(timeout=-1)
            with pytest.raises(ValueError, match="timeout must be >= 0 or None"):
                await engine.wait_idle(timeout=-1)
            with pytest.raises(fetchq.Timeout):
                await q.wait(timeout=0.05)
            with pytest.raises(fetchq.Timeout):
                await engine.wait_idle(timeout=0.05)
            q.resume()
            await q.wait(timeout=TIMEOUT)
            await engine.wait_idle(timeout=TIMEOUT)
            assert [f.result() for f in futs] == list(range(5))
    run(main)


def test_aclose_with_pending_work_resolves_everything() -> None:
    async def main() -> None:
        engine = fetchq.AsyncEngine(workers=2)
        q = engine.queue("p", max_concurrent=1)
        q.suspend()
        futs = [q.submit(lambda: 1) for _ in range(100)]
        await engine.aclose()
        assert engine.closed and all(f.cancelled() for f in futs)
        with pytest.raises(fetchq.ShutdownError):
            q.submit(lambda: 1)
        # sync close resolves too (callbacks delivered on this thread by fq_engine_free)
        engine2 = fetchq.AsyncEngine(workers=2)
        q2 = engine2.queue("p", max_concurrent=1)
        q2.suspend()
        futs2 = [q2.submit(lambda: 1) for _ in range(10)]
        engine2.close()
        assert all(f.cancelled() for f in futs2)
        assert engine._core.violations == [] and engine2._core.violations == []
        # closing twice never touches a reader another engine registered since
        engine3 = fetchq.AsyncEngine(workers=1)
        await engine.aclose()
        engine2.close()
        assert await engine3.queue("q").asubmit(lambda: 3) == 3
        await engine3.aclose()
    run(main)


def test_aclose_does_not_wait_for_async_operations_nobody_finishes() -> None:
    # Engine.close() finishes them (cancelled) at once; aclose() used to
    # wait its whole timeout for them first. One that its code does finish
    # on cancellation still ends cancelled, and a running block is waited for.
    async def main() -> None:
        engine = fetchq.AsyncEngine(workers=2)
        q = engine.queue("a", max_concurrent=3)
        kept: List[fetchq.AsyncOp] = []
        forgotten = q.submit_async(kept.append)              # never finished
        loop = asyncio.get_running_loop()

        def finish_when_cancelled(op: fetchq.AsyncOp) -> None:
            def poll() -> None:
                if op.cancelled:
                    op.finish("late")
                else:
                    loop.call_later(0.01, poll)
            loop.call_soon_threadsafe(poll)

        minding = q.submit_async(finish_when_cancelled)
        block_started, block_ran = threading.Event(), threading.Event()

        def slow_block() -> int:
            block_started.set()
            time.sleep(0.2)
            block_ran.set()
            return 1

        block = q.submit(slow_block)
        # Until the block runs too: closed before a worker took it up, it
        # ends cancelled without running (the test failed so in 2 runs of 40).
        for _ in range(2000):
            if len(kept) >= 1 and block_started.is_set():
                break
            await asyncio.sleep(0.005)
        assert len(kept) == 1 and block_started.is_set()
        started = time.monotonic()
        await engine.aclose(timeout=20)
        took = time.monotonic() - started
        assert engine.closed
        assert forgotten.cancelled() and minding.cancelled()
        assert block_ran.is_set() and block.cancelled()      # cancelled while running
        assert took < 10, "aclose waited %.1f s" % took
        assert engine._core.violations == []
    run(main)


def test_random_cancels_asyncio_exactly_once() -> None:
    async def main() -> None:
        rng = random.Random(99)
        async with fetchq.AsyncEngine(workers=4, history=20000) as engine:
            qs = [engine.queue("r%d" % i, max_concurrent=rng.choice([1, 4])) for i in range(3)]
            counts: Dict[int, int] = {}
            futs = []
            for i in range(5000):
                f = qs[i % 3].submit(lambda i=i: i)
                f.add_done_callback(lambda f: counts.__setitem__(id(f), counts.get(id(f), 0) + 1))
                futs.append(f)
                if rng.random() < 0.3:
                    futs[rng.randrange(len(futs))].cancel()
                if i % 500 == 0:
                    await asyncio.sleep(0)
            await asyncio.wait(futs, timeout=60)
            await asyncio.sleep(0)   # done callbacks are scheduled with call_soon
            assert all(f.done() for f in futs)
            assert len(counts) == 5000 and set(counts.values()) == {1}
            for i, f in enumerate(futs):
                if not f.cancelled():
                    assert f.result() == i
            s = engine.stats()
            assert s["succeeded"] + s["cancelled"] == 5000 and s["undelivered"] == 0
            assert engine.pending_count == 0
    run(main)


@needs_network
def test_arequest_asearch_and_progress_on_the_loop(server: Server) -> None:
    async def main() -> None:
        loop_thread = threading.get_ident()
        async with fetchq.AsyncEngine(workers=2, search=search_config(server)) as engine:
            q = engine.queue("net", max_concurrent=4)
            r = await q.arequest("POST", server.url("/echo"), json={"a": 1})
            assert r.status == 200 and r.json()["body"] == '{"a":1}'
            events: List[int] = []
            r = await q.arequest("GET", server.url("/drip?bytes=3000&chunk=1000&interval_ms=20"),
                                 progress=lambda a, b: events.append(threading.get_ident()),
                                 progress_interval_ms=1)
            assert len(r.body) == 3000 and events and set(events) == {loop_thread}
            tags = ["swift", "go", "rust"]
            results = await asyncio.gather(*(q.asearch(t) for t in tags))
            for tag, res in zip(tags, results):
                assert res["query"] == tag
                assert res["count"] == len(server.get_json("/corpus?tag=" + tag)["results"])
            kids: List[int] = []
            merged = await q.asearch_all(tags, on_child=lambda c: kids.append(threading.get_ident()))
            assert merged["count"] <= sum(r["count"] for r in results)
            assert kids == [loop_thread] * 3
            with pytest.raises(fetchq.HTTPError) as info:
                await q.arequest("GET", server.url("/status/404"))
            assert info.value.status == 404
    run(main)


@needs_network
def test_cancelling_a_task_aborts_the_request(server: Server) -> None:
    async def main() -> None:
        server.reset()
        async with fetchq.AsyncEngine(workers=2) as engine:
            q = engine.queue("stall")
            tasks = [asyncio.ensure_future(q.arequest("GET", server.url("/stall?i=%d" % i)))
                     for i in range(3)]
            deadline = time.monotonic() + TIMEOUT
            while server.stats()["in_flight"] < 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            for t in tasks:
                t.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(d, asyncio.CancelledError) for d in done)
            while server.stats()["in_flight"] != 0:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            # gather() cancelled as a whole cancels its children
            group = asyncio.gather(*(q.arequest("GET", server.url("/stall?g=%d" % i)) for i in range(2)))
            await asyncio.sleep(0.1)
            group.cancel()
            with pytest.raises(asyncio.CancelledError):
                await group
            await q.wait(timeout=TIMEOUT)
            assert engine.stats()["cancelled"] == 5
    run(main)


def _transfer_threads() -> int:
    """How many of this process's threads are transfer threads now."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % tid) as f:
                count += f.read().strip() == "fetchq-curl"
        except OSError:
            continue  # the thread ended meanwhile
    return count


@pytest.mark.parametrize("config, expected", [({}, 1), ({"transfer_threads": 2}, 2)])
def test_an_async_engine_runs_one_transfer_thread_unless_told(server: Server, config: Dict[str, Any],
                                                             expected: int) -> None:
    before = _transfer_threads()

    async def main() -> int:
        async with fetchq.AsyncEngine(**config) as engine:
            q = engine.queue("tt", max_concurrent=8)
            rs = await asyncio.gather(*(q.arequest("GET", server.url("/json?size=100&i=%d" % i),
                                                   coalesce=False) for i in range(16)))
            assert all(r.status == 200 for r in rs)
            return _transfer_threads() - before

    assert run(main) == expected


@needs_network
def test_get_many_on_the_loop(server: Server) -> None:
    async def main() -> None:
        async with fetchq.AsyncEngine(workers=2) as engine:
            q = engine.queue("many", max_concurrent=8)
            futs = q.get_many([server.url("/echo?i=%d" % i) for i in range(100)], coalesce=False)
            responses = await asyncio.gather(*futs)
            assert [r.json()["query"]["i"] for r in responses] == [str(i) for i in range(100)]
            assert engine.pending_count == 0
    run(main)


@needs_network
def test_submits_from_another_running_loop_are_refused_before_anything_is_submitted(server: Server) -> None:
    """A thread running another event loop got an AsyncFuture of the
    engine's loop: the body ran (a request was sent), then the awaiting task
    failed with asyncio's "attached to a different loop". Now every submit
    raises StateError naming both loops and submits nothing. A thread that
    runs no loop still submits, its future resolving on the engine's loop."""
    ran: List[int] = []

    def other_loop_thread(q: fetchq.AsyncQueue) -> Tuple[List[str], int]:
        async def use() -> Tuple[List[str], int]:
            attempts: List[Callable[[], Any]] = [
                lambda: q.submit(ran.append, 1),
                lambda: q.submit_async(lambda op: ran.append(2)),
                lambda: q.get(server.url("/json?from=other-loop")),
                lambda: q.get_many([server.url("/json?from=other-loop")]),
                lambda: q.asubmit(ran.append, 3),           # a coroutine: awaited below
                # waits and aclose too: asyncio.wait on the engine's futures
                # from this loop never returned (the review of the session's
                # own changes)
                lambda: q.engine.wait_idle(),
                lambda: q.wait(),
                lambda: q.engine.aclose(),
            ]
            messages = []
            for attempt in attempts:
                with pytest.raises(fetchq.StateError) as caught:
                    result = attempt()
                    if asyncio.iscoroutine(result):
                        await result
                messages.append(str(caught.value))
            return messages, id(asyncio.get_running_loop())
        return asyncio.run(use())

    async def main() -> None:
        async with fetchq.AsyncEngine(workers=2) as engine:
            q = engine.queue("loops")
            mine = asyncio.get_running_loop()
            messages, theirs = await asyncio.to_thread(other_loop_thread, q)   # bounded by run()
            assert len(messages) == 8
            for message in messages:
                assert "%#x" % id(mine) in message and "%#x" % theirs in message, message
            assert ran == [] and engine.pending_count == 0 and engine.stats()["submitted"] == 0
            assert not engine.closed                    # aclose from the other loop refused
            # no loop running in the submitting thread: as before
            fut = await asyncio.to_thread(q.submit, lambda: 7)
            assert isinstance(fut, fetchq.AsyncFuture) and fut.get_loop() is mine
            assert await fut == 7
    run(main)


def test_a_closed_async_engine_raises_shutdown_error_as_engine_does() -> None:
    """await wait_idle() returned after close (Engine.wait_idle() raises
    ShutdownError), event_fd gave the freed descriptor's number, and an
    AsyncQueue called itself fetchq.Queue."""
    with fetchq.Engine() as sync:
        assert repr(sync.queue("s")) == "<fetchq.Queue 's' max_concurrent=4>"
    with pytest.raises(fetchq.ShutdownError):
        sync.wait_idle()

    async def main() -> None:
        engine = fetchq.AsyncEngine(workers=1)
        q = engine.queue("a")
        assert repr(q) == "<fetchq.AsyncQueue 'a' max_concurrent=4>"
        assert engine.event_fd >= 0
        await engine.wait_idle(timeout=TIMEOUT)
        closed = engine.queue("closed")
        closed.close()
        with pytest.raises(fetchq.StateError, match="queue 'closed' is closed"):
            await closed.wait()              # as Queue.wait() raises
        await engine.aclose()
        with pytest.raises(fetchq.ShutdownError, match="^the engine is closed$"):
            await q.wait()
        with pytest.raises(fetchq.ShutdownError, match="^the engine is closed$"):
            await engine.wait_idle()
        with pytest.raises(fetchq.ShutdownError, match="^the engine is closed$"):
            engine.event_fd
        assert repr(q) == "<fetchq.AsyncQueue 'a' max_concurrent=4 closed>"
    run(main)


# -- the tenth review ----------------------------------------------------------

def test_an_engine_made_off_its_loops_thread_resolves_futures_on_that_loop() -> None:
    """AsyncEngine(loop=L) made on a thread that does not run L took the
    creating thread for L's: close() there set L's futures from that thread,
    without waking L up, and a coroutine awaiting one stayed pending."""
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    engine = None
    try:
        engine = fetchq.AsyncEngine(loop=loop, workers=2)    # this thread runs no loop: allowed
        started = threading.Event()
        fut = engine.queue("q").submit_async(lambda op: started.set())   # never finished
        assert started.wait(TIMEOUT)
        awaiting = threading.Event()

        async def waiter() -> Tuple[str, int]:
            awaiting.set()
            try:
                await fut
                return "result", threading.get_ident()
            except asyncio.CancelledError:
                return "cancelled", threading.get_ident()

        outcome = asyncio.run_coroutine_threadsafe(waiter(), loop)
        assert awaiting.wait(TIMEOUT)
        time.sleep(0.2)                             # it is inside the await
        engine.close()                              # ends it cancelled
        assert outcome.result(timeout=TIMEOUT) == ("cancelled", runner.ident)
        assert fut.cancelled()
    finally:
        if engine is not None:
            engine.close()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(TIMEOUT)
        loop.close()


def test_a_used_up_dependency_id_raises_not_found_on_the_loop() -> None:
    """As for Engine (test_submit.py): NotFound with the engine's message,
    not a cancelled future."""
    async def main() -> None:
        async with fetchq.AsyncEngine(workers=2) as engine:
            q = engine.queue("usedup")
            first = q.submit(lambda: 1)
            assert await first == 1
            with pytest.raises(fetchq.NotFound):
                q.submit(lambda: 2, depends_on=[10**12])    # takes the next id
            child = q.submit(lambda: 3, depends_on=[first.op_id + 1])
            with pytest.raises(fetchq.NotFound, match="^no operation %d$" % (first.op_id + 1)):
                await child
            assert not child.cancelled()
    run(main)


# -- found by mutation testing (review 34) -------------------------------------

def test_cancel_message_reaches_the_cancelled_error() -> None:
    """AsyncFuture.cancel(msg), as asyncio.Future.cancel(msg): the
    CancelledError raised once the engine confirmed carries ``msg``."""
    async def main() -> None:
        async with fetchq.AsyncEngine(workers=1) as engine:
            q = engine.queue("msg")
            q.suspend()
            fut = q.submit(lambda: 1)
            assert fut.cancel("stop now")
            with pytest.raises(asyncio.CancelledError) as caught:
                await fut
            assert caught.value.args == ("stop now",)
            assert fut.cancelled()
    run(main)


def test_close_before_the_loop_runs_resolves_the_futures_at_once() -> None:
    """AsyncEngine(loop=L) with L not running (yet): close() resolves the
    pending futures before it returns (nothing would run a callback handed
    to L)."""
    loop = asyncio.new_event_loop()
    try:
        engine = fetchq.AsyncEngine(loop=loop, workers=1)
        q = engine.queue("q")
        q.suspend()
        futs = [q.submit(lambda: 1) for _ in range(3)]
        engine.close()
        assert all(f.done() and f.cancelled() for f in futs)
    finally:
        loop.close()



def test_closing_an_engine_whose_loop_closed_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """An AsyncEngine freed after its loop closed (as its finalizer does at
    exit): the completions that close() delivers cannot be handed to that
    loop; nothing tries (a future with a done-callback made the closed loop
    raise in the completion callback, logged as an error)."""
    loop = asyncio.new_event_loop()
    engine = fetchq.AsyncEngine(loop=loop, workers=1)
    q = engine.queue("q")
    q.suspend()
    fut = q.submit(lambda: 1)
    fut.add_done_callback(lambda f: None)
    loop.close()
    with caplog.at_level(logging.ERROR, logger="fetchq"):
        engine.close()
    assert engine.closed
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
