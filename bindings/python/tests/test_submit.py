"""Python callables as block operations, the Op context, data passing,
and cancellation of thread-mode futures."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import random
import threading
import time
from typing import Any, Dict, List

import pytest

import fetchq

from conftest import TIMEOUT


def test_result_values_come_back_as_json(engine: fetchq.Engine) -> None:
    q = engine.queue("v")
    cases: List[Any] = [None, 0, -7, 2.5, "ü", [1, (2, 3)], {"a": {"b": [None, True]}}]
    futs = [q.submit(lambda v=v: v) for v in cases]
    got = [f.result(timeout=TIMEOUT) for f in futs]
    assert got == [None, 0, -7, 2.5, "ü", [1, [2, 3]], {"a": {"b": [None, True]}}]
    assert all(isinstance(f, fetchq.Future) and isinstance(f, cf.Future) for f in futs)
    assert len({f.op_id for f in futs}) == len(futs) and min(f.op_id for f in futs) > 0


def test_args_and_partial(engine: fetchq.Engine) -> None:
    q = engine.queue("args")
    assert q.submit(pow, 2, 10).result(timeout=TIMEOUT) == 1024
    f = q.submit(functools.partial(dict, a=1))       # keyword arguments via partial
    assert f.result(timeout=TIMEOUT) == {"a": 1}
    with pytest.raises(fetchq.InvalidArgument):        # keywords are options, not fn's
        q.submit(dict, a=1)
    with pytest.raises(TypeError):
        q.submit(42)  # type: ignore[arg-type]


def test_exception_becomes_operation_error(engine: fetchq.Engine) -> None:
    q = engine.queue("exc")

    class Boom(RuntimeError):
        pass

    def body() -> None:
        raise Boom("it broke: ü")

    f = q.submit(body)
    with pytest.raises(fetchq.OperationError) as info:
        f.result(timeout=TIMEOUT)
    assert info.value.message == "Boom: it broke: ü"
    assert isinstance(info.value.__cause__, Boom)
    assert info.value.code == -9 and info.value.op_id == f.op_id  # type: ignore[attr-defined]
    assert not f.cancelled()


class BrokenStr(Exception):
    """An exception whose str() raises (an attribute its __str__ reads was never set)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code

    def __str__(self) -> str:
        return "API error %d: %s" % (self.code, self.reason)  # type: ignore[attr-defined]


def test_an_exception_whose_str_raises_still_fails_the_operation(engine: fetchq.Engine) -> None:
    # Used to crash the interpreter (the block) or leave the future pending
    # with its slot held (the async start): the str() raised inside the
    # binding's own handler.
    q = engine.queue("broken-str", max_concurrent=1)

    def body() -> None:
        raise BrokenStr(503)

    def start(op: fetchq.AsyncOp) -> None:
        raise BrokenStr(504)

    for f, code in ((q.submit(body), 503), (q.submit_async(start), 504)):
        with pytest.raises(fetchq.OperationError) as info:
            f.result(timeout=TIMEOUT)
        assert info.value.message == "BrokenStr (str() of it raised AttributeError)"
        assert isinstance(info.value.__cause__, BrokenStr) and info.value.__cause__.code == code
    # The slot was given back: the queue (max 1) runs the next one.
    assert q.submit(lambda: 7).result(timeout=TIMEOUT) == 7
    assert engine._core.violations == []


def test_a_value_python_cannot_hold_fails_the_future() -> None:
    # The body's value is made into Python objects when its completion is
    # dispatched; with less room for recursion there than the document
    # needs, that raises. The future must raise it rather than never resolve
    # (the binding used to log it and drop the future).
    import asyncio
    import select
    import sys

    depth = 400

    def nested() -> Any:
        v: Any = []
        for _ in range(depth):
            v = [v]
        return v

    loop = asyncio.new_event_loop()
    try:
        e = fetchq.AsyncEngine(loop=loop)           # the loop never runs: dispatch() by hand
        f = e.queue("deep").submit(nested)
        readable, _, _ = select.select([e.event_fd], [], [], TIMEOUT)
        assert readable, "the completion never arrived"
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(depth // 2)
        try:
            assert e.dispatch() == 1
        finally:
            sys.setrecursionlimit(limit)
        assert f.done() and e.pending_count == 0
        with pytest.raises(RecursionError):
            f.result()
        assert e._core.violations == []
        e.close()
    finally:
        loop.close()


def test_unserializable_return_value_is_operation_error(engine: fetchq.Engine) -> None:
    q = engine.queue("ser")
    with pytest.raises(fetchq.OperationError, match="not JSON-serializable"):
        q.submit(lambda: {1, 2}).result(timeout=TIMEOUT)
    with pytest.raises(fetchq.OperationError, match="not valid JSON"):
        q.submit(lambda: float("nan")).result(timeout=TIMEOUT)


def test_op_context(engine: fetchq.Engine) -> None:
    q = engine.queue("ctx")
    seen: Dict[str, Any] = {}

    def body(op: fetchq.Op, x: int) -> int:
        seen["id"] = op.id
        seen["cancelled"] = op.cancelled
        seen["current"] = fetchq.current_op() is op
        seen["op"] = op
        return x + 1

    f = q.submit(body, 41, pass_op=True)
    assert f.result(timeout=TIMEOUT) == 42
    assert seen["id"] == f.op_id and seen["cancelled"] is False and seen["current"] is True
    with pytest.raises(fetchq.StateError):   # the Op is only valid during the body
        _ = seen["op"].cancelled
    with pytest.raises(fetchq.StateError):
        fetchq.current_op()
    # without pass_op, current_op() still works
    assert q.submit(lambda: fetchq.current_op().id).result(timeout=TIMEOUT) > 0


def test_dependencies_pass_data(engine: fetchq.Engine) -> None:
    q1 = engine.queue("producer")
    q2 = engine.queue("consumer")            # dependencies cross queues
    a = q1.submit(lambda: {"n": 20})
    b = q1.submit(lambda: 22)

    def combine(op: fetchq.Op) -> Any:
        return [op.dependency_result(a)["n"] + op.dependency_result(b.op_id),
                op.dependency_result(12345678)]

    c = q2.submit(combine, pass_op=True, depends_on=[a, b.op_id])
    assert c.result(timeout=TIMEOUT) == [42, None]
    d = q2.submit(lambda op: op.dependency_result(c), pass_op=True, depends_on=c)
    assert d.result(timeout=TIMEOUT) == [42, None]


def test_op_dependency_full_result(engine: fetchq.Engine) -> None:
    from conftest import has_function
    if not has_function("fq_op_dependency"):
        pytest.fail("libfetchq lacks fq_op_dependency")
    q = engine.queue("deps-full")
    a = q.submit(lambda: {"x": 1})

    def body(op: fetchq.Op) -> Any:
        r = op.dependency(a)
        assert r is not None
        return [r.op_id, r.outcome, r.status, r.error, r.value, r.ok, op.dependency(999999) is None]

    got = q.submit(body, pass_op=True, depends_on=a).result(timeout=TIMEOUT)
    assert got == [a.op_id, "succeeded", 0, None, {"x": 1}, True, True]


def test_failed_dependency_raises_dependency_error(engine: fetchq.Engine) -> None:
    q = engine.queue("depfail")
    bad = q.submit(lambda: 1 / 0)
    child = q.submit(lambda: "never", depends_on=bad)
    grandchild = q.submit(lambda: "never", depends_on=child)
    with pytest.raises(fetchq.DependencyError, match=str(bad.op_id)):
        child.result(timeout=TIMEOUT)
    with pytest.raises(fetchq.DependencyError):
        grandchild.result(timeout=TIMEOUT)
    assert not child.cancelled()


def test_cancelled_dependency_raises_dependency_error(engine: fetchq.Engine) -> None:
    q = engine.queue("depcancel")
    q.suspend()
    a = q.submit(lambda: 1)
    b = q.submit(lambda: 2, depends_on=a)
    assert a.cancel()
    q.resume()
    with pytest.raises(fetchq.DependencyError):
        b.result(timeout=TIMEOUT)
    assert a.cancelled()


def test_a_dependency_id_a_failed_submit_used_up_raises_not_found(engine: fetchq.Engine) -> None:
    """The tenth review: the engine ends an operation depending on an id it
    cannot find (one a failed submit used up) CANCELLED with FQ_ERR_NOT_FOUND
    (fetchq.h); the future was cancelled(), with an empty CancelledError,
    although nobody cancelled it."""
    q = engine.queue("usedup")
    first = q.submit(lambda: 1)
    assert first.result(timeout=TIMEOUT) == 1
    with pytest.raises(fetchq.NotFound):
        q.submit(lambda: 2, depends_on=[10**12])    # refused, after taking the next id
    used_up = first.op_id + 1
    child = q.submit(lambda: 3, depends_on=[used_up])
    assert child.op_id == used_up + 1               # (nothing else submits to this engine)
    with pytest.raises(fetchq.NotFound) as info:
        child.result(timeout=TIMEOUT)
    assert info.value.message == "no operation %d" % used_up
    assert info.value.code == fetchq.NotFound.code and info.value.op_id == child.op_id  # type: ignore[attr-defined]
    assert not child.cancelled() and engine.state(child) == "cancelled"


def test_cancel_queued(engine: fetchq.Engine) -> None:
    q = engine.queue("cq")
    q.suspend()
    f = q.submit(lambda: 1)
    calls: List[bool] = []
    f.add_done_callback(lambda fut: calls.append(fut.cancelled()))
    assert f.cancel() is True
    assert f.cancel() is True          # twice is harmless
    cf.wait([f], timeout=TIMEOUT)      # wait() sees cancelled futures
    assert f.cancelled() and f.done()
    with pytest.raises(cf.CancelledError):
        f.result(timeout=0)
    assert calls == [True]
    assert engine.stats()["cancelled"] == 1


def test_cancel_running_body(engine: fetchq.Engine) -> None:
    q = engine.queue("cr")
    started = threading.Event()

    def body(op: fetchq.Op) -> str:
        started.set()
        deadline = time.monotonic() + TIMEOUT
        while not op.cancelled and time.monotonic() < deadline:
            time.sleep(0.002)
        return "saw cancel" if op.cancelled else "timeout"

    f = q.submit(body, pass_op=True)
    assert started.wait(TIMEOUT)
    assert f.cancel() is True          # a running op can be cancelled (unlike cf.Future)
    with pytest.raises(cf.CancelledError):
        f.result(timeout=TIMEOUT)
    assert f.cancelled()


def test_cancel_finished_returns_false(engine: fetchq.Engine) -> None:
    q = engine.queue("cf")
    f = q.submit(lambda: 5)
    assert f.result(timeout=TIMEOUT) == 5
    assert f.cancel() is False and not f.cancelled()
    assert engine.cancel(f.op_id) is False


def test_engine_cancel_by_id(engine: fetchq.Engine) -> None:
    q = engine.queue("cid")
    q.suspend()
    f = q.submit(lambda: 1)
    assert engine.cancel(f.op_id) is True
    cf.wait([f], timeout=TIMEOUT)
    assert f.cancelled()


def test_as_completed_sees_every_outcome(engine: fetchq.Engine) -> None:
    q = engine.queue("ac", max_concurrent=3)
    q.suspend()
    futs = [q.submit(lambda i=i: i if i % 3 else 1 / 0) for i in range(30)]
    for f in futs[::4]:
        f.cancel()
    q.resume()
    seen = list(cf.as_completed(futs, timeout=TIMEOUT))
    assert sorted(id(f) for f in seen) == sorted(id(f) for f in futs)


def test_close_with_pending_work_resolves_every_future() -> None:
    e = fetchq.Engine(workers=2)
    q = e.queue("pending", max_concurrent=1)
    started = threading.Event()

    def slow(op: fetchq.Op) -> int:
        started.set()
        deadline = time.monotonic() + TIMEOUT
        while not op.cancelled and time.monotonic() < deadline:
            time.sleep(0.002)
        return 1

    running = q.submit(slow, pass_op=True)
    waiting = [q.submit(lambda: 2) for _ in range(100)]
    assert started.wait(TIMEOUT)
    t = threading.Thread(target=e.close)
    t.start()
    t.join(TIMEOUT)
    assert not t.is_alive(), "close() hung"
    assert running.cancelled()
    assert all(f.cancelled() for f in waiting)
    assert e._core.pending == {} and e._core.violations == []


def test_close_while_another_thread_waits() -> None:
    e = fetchq.Engine(workers=2)
    q = e.queue("w", max_concurrent=1)
    q.suspend()
    futs = [q.submit(lambda: 1) for _ in range(5)]
    errors: List[Any] = []

    def waiter() -> None:
        try:
            q.wait(timeout=TIMEOUT)
            errors.append(None)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    e.close()
    t.join(TIMEOUT)
    assert not t.is_alive() and errors == [None]
    assert all(f.cancelled() for f in futs)


def test_cancel_from_another_thread_races_submit() -> None:
    with fetchq.Engine(workers=2) as e:
        q = e.queue("race", max_concurrent=1)
        q.suspend()
        futs: List[fetchq.Future] = []
        for _ in range(200):
            futs.append(q.submit(lambda: 1))
        threads = [threading.Thread(target=lambda f=f: f.cancel()) for f in futs[::2]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        q.resume()
        done, not_done = cf.wait(futs, timeout=TIMEOUT)
        assert not not_done
        assert all(f.cancelled() for f in futs[::2])
        assert all(f.result() == 1 for f in futs[1::2])


def test_random_cancels_10000_resolved_exactly_once() -> None:
    rng = random.Random(1234)
    with fetchq.Engine(workers=4, history=20_000) as e:
        queues = [e.queue("stress-%d" % i, max_concurrent=rng.choice([1, 2, 8])) for i in range(4)]
        lock = threading.Lock()
        resolutions: Dict[int, int] = {}
        futs: List[fetchq.Future] = []
        cancel_true: List[fetchq.Future] = []

        def count(f: Any) -> None:
            with lock:
                resolutions[id(f)] = resolutions.get(id(f), 0) + 1

        for i in range(10_000):
            q = queues[i % 4]
            deps = [futs[rng.randrange(len(futs))]] if futs and rng.random() < 0.1 else None
            f = q.submit(lambda i=i: i, depends_on=deps, group="g%d" % (i % 7))
            f.add_done_callback(count)
            futs.append(f)
            if rng.random() < 0.3:
                target = futs[rng.randrange(len(futs))]
                if target.cancel():
                    cancel_true.append(target)
            if i == 5000:
                e.cancel_group("g3")
        done, not_done = cf.wait(futs, timeout=120)
        assert not not_done
        e.wait_idle(timeout=TIMEOUT)
        with lock:
            assert len(resolutions) == len(futs)
            assert set(resolutions.values()) == {1}
        # cancel() == True means it ends cancelled
        assert all(f.cancelled() for f in cancel_true)
        for i, f in enumerate(futs):
            if f.cancelled():
                continue
            exc = f.exception()
            if exc is None:
                assert f.result() == i
            else:
                assert isinstance(exc, fetchq.DependencyError)
        s = e.stats()
        assert s["submitted"] == 10_000
        assert s["succeeded"] + s["failed"] + s["cancelled"] == 10_000
        assert s["succeeded"] == sum(1 for f in futs if not f.cancelled() and f.exception() is None)
        assert (s["queued"], s["running"], s["undelivered"]) == (0, 0, 0)
        assert e.pending_count == 0 and e._core.violations == []


# -- asynchronous operations (fq_submit_async) ---------------------------------

def test_submit_async_finishes_later_from_another_thread(engine: fetchq.Engine) -> None:
    q = engine.queue("async", max_concurrent=1)
    ops: List[fetchq.AsyncOp] = []

    def start(op: fetchq.AsyncOp, x: int) -> None:
        assert fetchq.current_op() is op and not op.finished
        ops.append(op)
        threading.Timer(0.05, op.finish, args=({"x": x},)).start()

    f = q.submit_async(start, 5)
    second = q.submit(lambda: "after")          # waits: the async op holds the slot
    assert f.result(timeout=TIMEOUT) == {"x": 5}
    assert second.result(timeout=TIMEOUT) == "after"
    assert ops[0].finished and ops[0].id == f.op_id
    with pytest.raises(fetchq.StateError):
        ops[0].finish(1)
    with pytest.raises(fetchq.StateError):
        _ = ops[0].cancelled


def test_submit_async_slot_is_held_until_finish(engine: fetchq.Engine) -> None:
    q = engine.queue("async-slot", max_concurrent=1)
    box: List[fetchq.AsyncOp] = []
    started = threading.Event()

    def start(op: fetchq.AsyncOp) -> None:
        box.append(op)
        started.set()

    f = q.submit_async(start)
    after = q.submit(lambda: 2)
    assert started.wait(TIMEOUT)
    time.sleep(0.05)
    assert not after.done() and engine.stats()["queues"]["async-slot"]["running"] == 1
    box[0].finish()                              # no value
    assert f.result(timeout=TIMEOUT) is None and after.result(timeout=TIMEOUT) == 2


def test_submit_async_errors(engine: fetchq.Engine) -> None:
    q = engine.queue("async-err")
    f = q.submit_async(lambda op: op.finish(error="it failed"))
    with pytest.raises(fetchq.OperationError, match="it failed"):
        f.result(timeout=TIMEOUT)

    def raises(op: fetchq.AsyncOp) -> None:
        raise KeyError("k")

    f = q.submit_async(raises)
    with pytest.raises(fetchq.OperationError, match="KeyError") as info:
        f.result(timeout=TIMEOUT)
    assert isinstance(info.value.__cause__, KeyError)

    def bad_value(op: fetchq.AsyncOp) -> None:
        with pytest.raises(TypeError):
            op.finish(object())
        assert not op.finished                   # still finishable
        op.finish([1])

    assert q.submit_async(bad_value).result(timeout=TIMEOUT) == [1]


def test_submit_async_cancelled_while_pending(engine: fetchq.Engine) -> None:
    q = engine.queue("async-cancel")
    box: List[fetchq.AsyncOp] = []
    started = threading.Event()
    f = q.submit_async(lambda op: (box.append(op), started.set()) and None)
    assert started.wait(TIMEOUT)
    assert f.cancel()
    assert box[0].cancelled
    box[0].finish("ignored")
    with pytest.raises(cf.CancelledError):
        f.result(timeout=TIMEOUT)


def test_close_finishes_forgotten_async_ops() -> None:
    e = fetchq.Engine(workers=2)
    q = e.queue("forgot", max_concurrent=2)
    box: List[fetchq.AsyncOp] = []
    started = threading.Barrier(3, timeout=TIMEOUT)

    def start(op: fetchq.AsyncOp) -> None:
        box.append(op)
        if len(box) <= 2:
            started.wait()

    futs = [q.submit_async(start) for _ in range(3)]    # the third waits for a slot
    started.wait()
    t = threading.Thread(target=e.close)
    t.start()
    t.join(TIMEOUT)
    assert not t.is_alive(), "close() waited for async operations nobody finishes"
    assert all(f.cancelled() for f in futs)
    box[0].finish(1)                             # late finish: harmless no-op
    assert e._core.violations == []


# -- found by mutation testing (review 34) -------------------------------------

def test_cancel_of_a_cancelled_future_is_true(engine: fetchq.Engine) -> None:
    """As concurrent.futures.Future.cancel(): True again once it is cancelled."""
    q = engine.queue("cc")
    q.suspend()
    f = q.submit(lambda: 1)
    assert f.cancel() is True
    cf.wait([f], timeout=TIMEOUT)
    assert f.cancelled()
    assert f.cancel() is True and f.cancelled()


def test_a_cancel_while_the_submit_is_in_the_library_cancels_the_operation(
        engine: fetchq.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """cancel() from another thread before the submit returned (no op id
    yet) said True: the operation must end cancelled once the submit has
    its id, not run."""
    q = engine.queue("mid-submit")
    q.suspend()
    lib = engine._core.lib
    real = lib.fq_submit_block
    accepted: List[bool] = []

    def submit_then_cancel(*args: Any) -> int:
        (state,) = [s for s in engine._core.pending.values() if s.future._op_id is None]
        accepted.append(state.future.cancel())     # the future has no id yet
        return int(real(*args))

    monkeypatch.setattr(lib, "fq_submit_block", submit_then_cancel)
    f = q.submit(lambda: 1)
    monkeypatch.undo()
    assert accepted == [True]
    q.resume()
    cf.wait([f], timeout=TIMEOUT)
    assert f.cancelled()
    assert engine.state(f) == "cancelled"
