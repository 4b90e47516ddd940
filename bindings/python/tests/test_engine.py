"""Engines and queues: config, close, stats, suspend/resume, wait, limits,
priorities, dependencies and the errors of synchronous calls."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

import fetchq

from conftest import TIMEOUT


def test_config_errors_are_invalid_argument_with_message() -> None:
    with pytest.raises(fetchq.InvalidArgument, match="bogus"):
        fetchq.Engine(bogus=1)
    with pytest.raises(fetchq.InvalidArgument, match="workers"):
        fetchq.Engine(workers="many")
    with pytest.raises(fetchq.InvalidArgument):
        fetchq.Engine(delivery="poll")          # thread engine only
    with pytest.raises(TypeError):
        fetchq.Engine(workers=object())         # not JSON at all


class _BytesPath:
    def __fspath__(self) -> bytes:
        return b"/tmp/cache.db"


@pytest.mark.parametrize("config,message", [
    ({"timeout_ms": float("nan")}, "^config.timeout_ms: expected a finite number, got nan$"),
    ({"rate_limits": {"*": {"per_second": float("inf"), "burst": 1}}},
     "^config.rate_limits.\\*.per_second: expected a finite number, got inf$"),
    ({"user_agent": b"x"}, "^config.user_agent: expected a JSON value .*, got bytes$"),
    ({"workers": object()}, "^config.workers: expected a JSON value .*, got object$"),
    ({"max_response_bytes": 2**64}, "^config.max_response_bytes: 18446744073709551616 is out of range"),
    ({"proxy": "http://\udc80"}, "^config.proxy: the string .* is not valid UTF-8"),
    ({"cache": {"max_bytes": 1 << 20, "path": _BytesPath()}}, "^config.cache.path: expected a str path, got a bytes"),
])
def test_config_values_json_cannot_hold_are_invalid_argument(config: Dict[str, Any], message: str) -> None:
    """docs/python.md: wrong types raise InvalidArgument. They raised a bare
    ValueError or TypeError when JSON could not hold them; one of a wrong
    type is still a TypeError too."""
    with pytest.raises(fetchq.InvalidArgument, match=message) as caught:
        fetchq.Engine(**config)
    assert isinstance(caught.value, ValueError) and caught.value.code == -1
    wrong_type = "JSON value" in message or "str path" in message
    assert isinstance(caught.value, TypeError) is wrong_type


def test_path_objects_are_sent_as_their_path(tmp_path: Path) -> None:
    cache = tmp_path / "cache.db"
    with fetchq.Engine(cache={"max_bytes": 1 << 20, "path": cache},
                       ca_file=Path("/nonexistent/ca.pem")) as e:
        assert cache.is_file()                  # the engine opened it
        assert e.queue("p").submit(lambda: 1).result(timeout=TIMEOUT) == 1


def test_an_engine_that_cannot_start_says_why(tmp_path: Path) -> None:
    # fq_engine_new returns NULL for every cause; the binding called them all
    # InvalidArgument (a ValueError), a missing directory and a refused thread too.
    with pytest.raises(fetchq.StoreError, match="No such file or directory") as caught:
        fetchq.Engine(cache={"path": str(tmp_path / "missing" / "cache.db")})
    assert not isinstance(caught.value, ValueError)
    # Each engine thread reserves an 8 MiB stack: with the address space a
    # little above what the process uses, the system refuses one.
    script = """
import resource, fetchq
def vm():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()
from fetchq import _ffi
_ffi.lib()  # loaded (an engine made and freed here would leave its threads' stacks cached for the next)
seen = []
for mib in range(0, 160, 4):
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm() + (mib << 20), hard))
    try:
        engine = fetchq.Engine()
    except Exception as error:
        seen.append(type(error).__name__)
        continue
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    engine.close()
    seen.append("ok")
    break
print(" ".join(seen))
"""
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen = run.stdout.split()
    assert seen[-1] == "ok" and "OutOfMemory" in seen, seen
    assert set(seen) <= {"OutOfMemory", "MemoryError", "ok"}, seen


def test_context_manager_closes_and_use_after_close_raises() -> None:
    with fetchq.Engine(workers=2) as e:
        q = e.queue("q")
        assert q.submit(lambda: 1).result(timeout=TIMEOUT) == 1
        assert not e.closed
    assert e.closed
    with pytest.raises(fetchq.ShutdownError):
        q.submit(lambda: 1)
    with pytest.raises(fetchq.ShutdownError):
        e.stats()
    # a queue by name, the one it had as much as a new one (the first was
    # given back closed)
    with pytest.raises(fetchq.ShutdownError, match="the engine is closed"):
        e.queue("q")
    with pytest.raises(fetchq.ShutdownError, match="the engine is closed"):
        e.queue("new")
    e.close()  # idempotent


def test_queue_by_name_is_the_same_object_and_names_are_unique(engine: fetchq.Engine) -> None:
    a = engine.queue("same", max_concurrent=2)
    assert engine.queue("same") is a
    assert engine.queue("same", max_concurrent=5) is a and a.max_concurrent == 5
    assert engine.stats()["queues"]["same"]["max_concurrent"] == 5
    with pytest.raises(fetchq.InvalidArgument):
        engine.queue("bad", max_concurrent=0)


def test_two_threads_asking_for_a_new_queue_get_the_same_one(engine: fetchq.Engine) -> None:
    for i in range(500):
        gate = threading.Barrier(2, timeout=TIMEOUT)
        got: List[Any] = []

        def ask(name: str = "race-%d" % i) -> None:
            gate.wait()
            try:
                got.append(engine.queue(name))
            except BaseException as e:  # noqa: BLE001 - the assertion below shows it
                got.append(e)

        threads = [threading.Thread(target=ask) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert len(got) == 2 and isinstance(got[0], fetchq.Queue) and got[0] is got[1], got


def test_integer_arguments_out_of_range_or_of_another_type_are_refused(engine: fetchq.Engine) -> None:
    # ctypes would wrap 2**32 + 1 to 1 and 2**64 + id to id.
    with pytest.raises(fetchq.InvalidArgument, match="max_concurrent 4294967297 is out of range"):
        engine.queue("big", 2**32 + 1)
    assert "big" not in engine.stats()["queues"]
    with pytest.raises(TypeError, match="max_concurrent must be an int, not str"):
        engine.queue("str", "2")  # type: ignore[arg-type]
    q = engine.queue("ints", max_concurrent=1)
    with pytest.raises(fetchq.InvalidArgument, match="out of range"):
        q.set_max_concurrent(2**31)
    with pytest.raises(TypeError):
        q.set_max_concurrent(None)  # type: ignore[arg-type]
    assert q.max_concurrent == 1
    q.suspend()
    f = q.submit(lambda: 1)
    with pytest.raises(fetchq.InvalidArgument, match="priority 4294967304 is out of range"):
        engine.set_priority(f, 2**32 + 8)
    with pytest.raises(TypeError, match="priority must be an int, not float"):
        engine.set_priority(f, 4.0)  # type: ignore[arg-type]
    with pytest.raises(fetchq.InvalidArgument, match="operation id .* is out of range"):
        engine.cancel(2**64 + f.op_id)
    assert not f.cancelled()
    q.resume()
    assert f.result(timeout=TIMEOUT) == 1


def test_stats_counts(engine: fetchq.Engine) -> None:
    q = engine.queue("s", max_concurrent=2)
    futs = [q.submit(lambda i=i: i) for i in range(10)]
    bad = q.submit(lambda: 1 / 0)
    assert [f.result(timeout=TIMEOUT) for f in futs] == list(range(10))
    with pytest.raises(fetchq.OperationError):
        bad.result(timeout=TIMEOUT)
    engine.wait_idle(timeout=TIMEOUT)
    s = engine.stats()
    assert (s["submitted"], s["succeeded"], s["failed"], s["cancelled"]) == (11, 10, 1, 0)
    assert (s["queued"], s["running"], s["undelivered"]) == (0, 0, 0)
    assert s["queues"]["s"]["submitted"] == 11
    assert engine.pending_count == 0


def test_suspend_resume(engine: fetchq.Engine) -> None:
    q = engine.queue("sr", max_concurrent=2)
    q.suspend()
    assert q.suspended
    futs = [q.submit(lambda i=i: i * 2) for i in range(5)]
    s = engine.stats()["queues"]["sr"]
    assert s["suspended"] is True and s["queued"] == 5 and s["running"] == 0
    assert not any(f.done() for f in futs)
    with pytest.raises(fetchq.Timeout):
        q.wait(timeout=0.05)
    q.resume()
    assert not q.suspended
    q.wait(timeout=TIMEOUT)
    assert [f.result(timeout=0) for f in futs] == [0, 2, 4, 6, 8]


def test_wait_times_out_while_a_body_runs_then_returns(engine: fetchq.Engine) -> None:
    q = engine.queue("w")
    gate = threading.Event()
    f = q.submit(lambda: gate.wait(TIMEOUT))
    with pytest.raises(fetchq.Timeout):
        q.wait(timeout=0.05)
    with pytest.raises(fetchq.Timeout):
        engine.wait_idle(timeout=0.05)
    gate.set()
    q.wait(timeout=TIMEOUT)
    assert f.result(timeout=0) is True


def test_max_concurrent_is_enforced_and_can_grow() -> None:
    with fetchq.Engine(workers=4) as e:
        q = e.queue("mc", max_concurrent=1)
        lock = threading.Lock()
        running: List[int] = [0, 0]   # now, max

        def body() -> None:
            with lock:
                running[0] += 1
                running[1] = max(running[1], running[0])
            time.sleep(0.01)
            with lock:
                running[0] -= 1

        futs = [q.submit(body) for _ in range(8)]
        cf.wait(futs, timeout=TIMEOUT)
        assert running[1] == 1
        # Three bodies that each wait for the other two: only possible with 3 slots.
        q.set_max_concurrent(3)
        barrier = threading.Barrier(3, timeout=TIMEOUT)
        futs = [q.submit(lambda: barrier.wait() >= 0) for _ in range(3)]
        assert [f.result(timeout=TIMEOUT) for f in futs] == [True] * 3


def test_priorities_order_a_suspended_queue(engine: fetchq.Engine) -> None:
    q = engine.queue("prio", max_concurrent=1)
    order: List[str] = []
    q.suspend()
    futs = [q.submit(order.append, "low", priority="low"),
            q.submit(order.append, "normal"),
            q.submit(order.append, "very-high", priority=8)]
    later = q.submit(order.append, "raised")
    engine.set_priority(later, "high")
    q.resume()
    cf.wait(futs + [later], timeout=TIMEOUT)
    assert order == ["very-high", "raised", "normal", "low"]
    with pytest.raises(fetchq.InvalidArgument):
        engine.set_priority(later, "urgent")


def test_set_priority_after_start_is_state_error_or_not_found(engine: fetchq.Engine) -> None:
    q = engine.queue("p2")
    gate = threading.Event()
    started = threading.Event()
    f = q.submit(lambda: (started.set(), gate.wait(TIMEOUT))[1])
    assert started.wait(TIMEOUT)
    with pytest.raises(fetchq.StateError):
        engine.set_priority(f, 4)
    gate.set()
    f.result(timeout=TIMEOUT)
    with pytest.raises((fetchq.NotFound, fetchq.StateError)):
        engine.set_priority(f, 4)


def test_add_dependency_and_cycles(engine: fetchq.Engine) -> None:
    q = engine.queue("dep", max_concurrent=4)
    q.suspend()
    order: List[str] = []
    a = q.submit(order.append, "a")
    b = q.submit(order.append, "b")
    engine.add_dependency(a, b)        # a waits for b
    with pytest.raises(fetchq.CycleError):
        engine.add_dependency(b, a)
    with pytest.raises(fetchq.CycleError):
        engine.add_dependency(a, a)
    with pytest.raises(fetchq.NotFound):
        engine.add_dependency(a, 10**12)
    q.resume()
    cf.wait([a, b], timeout=TIMEOUT)
    assert order == ["b", "a"]


def test_remove_dependency(engine: fetchq.Engine) -> None:
    held = engine.queue("held", max_concurrent=1)
    held.suspend()
    a = held.submit(lambda: "a")
    q = engine.queue("free", max_concurrent=1)
    b = q.submit(lambda: "b", depends_on=[a])
    with pytest.raises(cf.TimeoutError):
        b.result(timeout=0.1)
    assert engine.state(b) == "waiting"
    engine.remove_dependency(b, a)
    assert b.result(timeout=TIMEOUT) == "b"
    assert engine.state(a) == "ready"
    with pytest.raises(fetchq.StateError, match="finished"):
        engine.remove_dependency(b, a)
    c = q.submit(lambda op: op.dependency_result(b), pass_op=True, depends_on=[b, a])
    engine.remove_dependency(c, b)       # finished: its value is no longer passed
    with pytest.raises(fetchq.NotFound, match="does not depend on"):
        engine.remove_dependency(c, b)
    held.resume()
    assert c.result(timeout=TIMEOUT) is None
    assert a.result(timeout=TIMEOUT) == "a"


def test_state_follows_an_operation(engine: fetchq.Engine) -> None:
    q = engine.queue("states", max_concurrent=1)
    started, release = threading.Event(), threading.Event()
    seen: List[str] = []

    def hold() -> int:
        started.set()
        release.wait(TIMEOUT)
        return 1

    a = q.submit(hold)
    assert started.wait(TIMEOUT)
    b = q.submit(lambda: 2)
    c = q.submit(lambda: seen.append(engine.state(c)), depends_on=[a])
    assert (engine.state(a), engine.state(b), engine.state(c)) == ("running", "ready", "waiting")
    assert engine.state(c.op_id) == "waiting"           # an id works as well
    held = engine.queue("states-held")
    held.suspend()
    d = held.submit(lambda: 3)
    assert engine.state(d) == "ready"
    assert engine.cancel(d)
    assert engine.state(d) == "cancelled"
    release.set()
    q.wait(TIMEOUT)
    assert seen == ["running"]                          # read inside its own body
    assert [engine.state(f) for f in (a, b, c)] == ["succeeded"] * 3
    e = q.submit(lambda: 1 / 0)
    with pytest.raises(fetchq.OperationError):
        e.result(TIMEOUT)
    assert engine.state(e) == "failed"
    with pytest.raises(fetchq.NotFound, match="history"):
        engine.state(10**12)


def test_state_of_a_forgotten_operation() -> None:
    with fetchq.Engine(workers=1, history=1) as engine:
        q = engine.queue("q")
        first = q.submit(lambda: 1)
        first.result(TIMEOUT)
        assert engine.state(first) == "succeeded"
        q.submit(lambda: 2).result(TIMEOUT)
        with pytest.raises(fetchq.NotFound):
            engine.state(first)
    with pytest.raises(fetchq.ShutdownError):
        engine.state(first)


def test_unknown_ids(engine: fetchq.Engine) -> None:
    q = engine.queue("ids")
    with pytest.raises(fetchq.NotFound):
        q.submit(lambda: 1, depends_on=[10**12])
    assert engine.cancel(10**12) is False
    assert engine.pending_count == 0   # the failed submit left nothing behind
    with pytest.raises(TypeError):
        q.submit(lambda: 1, depends_on=["x"])


def test_futures_of_another_engine_are_rejected(engine: fetchq.Engine) -> None:
    with fetchq.Engine(workers=1) as other:
        f = other.queue("o").submit(lambda: 1)
        f.result(timeout=TIMEOUT)
        with pytest.raises(fetchq.InvalidArgument, match="another engine"):
            engine.queue("x").submit(lambda: 2, depends_on=f)


def test_every_method_taking_a_future_refuses_one_of_another_engine(engine: fetchq.Engine) -> None:
    """The tenth review: engine.cancel(fut) cancelled another engine's
    operation, where state, set_priority and the dependency methods refuse
    its future."""
    mine = engine.queue("mine").submit(lambda: 0)
    with fetchq.Engine(workers=1) as other:
        q = other.queue("o", 1)
        q.suspend()
        f = q.submit(lambda: 1)                 # queued: a cancel would take it
        for call in (lambda: engine.cancel(f), lambda: engine.state(f),
                     lambda: engine.set_priority(f, "high"),
                     lambda: engine.add_dependency(mine, f), lambda: engine.remove_dependency(mine, f),
                     lambda: engine.add_dependency(f, mine), lambda: engine.remove_dependency(f, mine)):
            with pytest.raises(fetchq.InvalidArgument, match="^that future belongs to another engine$"):
                call()
        q.resume()
        assert f.result(timeout=TIMEOUT) == 1 and not f.cancelled()
    assert mine.result(timeout=TIMEOUT) == 0


def test_bad_options_are_invalid_argument(engine: fetchq.Engine) -> None:
    q = engine.queue("opts")
    with pytest.raises(fetchq.InvalidArgument, match="nonsense"):
        q.submit(lambda: 1, nonsense=True)
    with pytest.raises(fetchq.InvalidArgument):
        q.submit(lambda: 1, priority=3)
    with pytest.raises(TypeError):
        q.submit(lambda: 1, group=object())
    # values JSON cannot hold: InvalidArgument naming the option, as the library does
    with pytest.raises(fetchq.InvalidArgument, match="^options.timeout_ms: expected a finite number, got inf$"):
        q.submit(lambda: 1, timeout_ms=float("inf"))
    with pytest.raises(fetchq.InvalidArgument, match="^options.group: expected a JSON value .*, got bytes$"):
        q.submit(lambda: 1, group=b"g")
    with pytest.raises(fetchq.InvalidArgument, match="^options.retry.base: expected a finite number, got nan$"):
        q.submit(lambda: 1, retry={"max": 1, "base": float("nan")})
    assert engine.pending_count == 0 and engine.stats()["submitted"] == 0


def test_queue_close_cancels_its_queued_operations(engine: fetchq.Engine) -> None:
    q = engine.queue("closing", max_concurrent=1)
    q.suspend()
    futs = [q.submit(lambda: 1) for _ in range(5)]
    q.close()
    done, not_done = cf.wait(futs, timeout=TIMEOUT)
    assert not not_done and all(f.cancelled() for f in futs)
    with pytest.raises(fetchq.StateError):
        q.submit(lambda: 1)
    # the name is free again
    assert engine.queue("closing").submit(lambda: 7).result(timeout=TIMEOUT) == 7


def test_wait_from_a_callback_is_state_error(engine: fetchq.Engine) -> None:
    q = engine.queue("cbwait")
    seen: List[Any] = []
    done = threading.Event()

    def cb(_: Any) -> None:
        for call in (lambda: q.wait(timeout=1), lambda: engine.wait_idle(timeout=1), engine.close):
            try:
                call()
                seen.append(None)
            except Exception as exc:  # noqa: BLE001
                seen.append(type(exc))
        done.set()

    q.suspend()                        # so cb runs on the delivery thread
    q.submit(lambda: 1).add_done_callback(cb)
    q.resume()
    assert done.wait(TIMEOUT)
    assert seen == [fetchq.StateError, fetchq.StateError, fetchq.StateError]
    assert not engine.closed


def test_callbacks_may_submit_more_work(engine: fetchq.Engine) -> None:
    q = engine.queue("chain", max_concurrent=2)
    out: "cf.Future[int]" = cf.Future()

    def step(n: int) -> None:
        def on_done(f: Any) -> None:
            if n == 0:
                out.set_result(f.result())
            else:
                step(n - 1)
        q.submit(lambda: n).add_done_callback(on_done)

    step(50)
    assert out.result(timeout=TIMEOUT) == 0


def test_cancel_group_and_cancel_all(engine: fetchq.Engine) -> None:
    q = engine.queue("groups", max_concurrent=1)
    q.suspend()
    red = [q.submit(lambda: "r", group="red") for _ in range(3)]
    blue = [q.submit(lambda: "b", group="blue") for _ in range(2)]
    plain = [q.submit(lambda: "p") for _ in range(2)]
    assert engine.cancel_group("red") == 3
    assert engine.cancel_group("nobody") == 0
    cf.wait(red, timeout=TIMEOUT)
    assert all(f.cancelled() for f in red)
    assert not any(f.done() for f in blue + plain)
    assert q.cancel_all() == 4
    cf.wait(blue + plain, timeout=TIMEOUT)
    assert all(f.cancelled() for f in blue + plain)
    q.resume()
    more = [q.submit(lambda: 1) for _ in range(2)]
    cf.wait(more, timeout=TIMEOUT)
    q.suspend()
    late = [q.submit(lambda: 2) for _ in range(3)]
    assert engine.cancel_all() == 3
    cf.wait(late, timeout=TIMEOUT)
    assert [f.result() for f in more] == [1, 1] and all(f.cancelled() for f in late)


def test_queue_timeout(engine: fetchq.Engine) -> None:
    q = engine.queue("qt", max_concurrent=1)
    q.suspend()
    f = q.submit(lambda: 1, max_wait_ms=20)
    with pytest.raises(fetchq.QueueTimeout):
        f.result(timeout=TIMEOUT)
    assert isinstance(f.exception(), fetchq.Timeout)


def test_nul_in_a_string_is_invalid_argument(engine: fetchq.Engine) -> None:
    # (Also a ValueError, as it was before it was an InvalidArgument.)
    q = engine.queue("nul")
    for call in (lambda: q.search("a\0b"), lambda: q.search_all(["ok", "a\0b"]),
                 lambda: engine.cancel_group("g\0")):
        with pytest.raises(fetchq.InvalidArgument, match="must not contain NUL characters"):
            call()
    # In a JSON key (a header's name, a query parameter's) jansson cannot hold it.
    for kw in ({"headers": {"X-\0A": "v"}}, {"params": {"k\0": "v"}}):
        with pytest.raises(fetchq.InvalidArgument, match="cannot be represented in jansson"):
            q.get("http://127.0.0.1:1/", **kw)
    assert engine.pending_count == 0
