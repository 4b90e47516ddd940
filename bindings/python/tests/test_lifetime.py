"""Handles, callbacks and interpreter exit."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Dict, List


import pytest

import fetchq

from conftest import BINDING, HERE, TIMEOUT, needs_network


def run_script(code: str, *args: str) -> "subprocess.CompletedProcess[str]":
    env = dict(os.environ)
    env["PYTHONPATH"] = str(BINDING)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_forgotten_engine_is_freed_by_its_finalizer() -> None:
    e = fetchq.Engine(workers=2)
    core = e._core
    assert e.queue("q").submit(lambda: 3).result(timeout=TIMEOUT) == 3
    ref = weakref.ref(e)
    del e
    gc.collect()
    assert ref() is None
    assert core.handle is None          # fq_engine_free ran


def test_engine_with_pending_work_stays_alive_until_it_finishes() -> None:
    """Dropping the Engine object does not cancel submitted work."""
    gate = threading.Event()
    e = fetchq.Engine(workers=2)
    core = e._core
    fut = e.queue("q").submit(lambda: gate.wait(TIMEOUT))
    ref = weakref.ref(e)
    del e
    gc.collect()
    assert ref() is not None            # kept by the pending operation
    gate.set()
    assert fut.result(timeout=TIMEOUT) is True
    # The last reference goes with the operation's state, in its completion
    # on the delivery thread: the finalizer hands the free to another thread.
    deadline = time.monotonic() + TIMEOUT
    while (ref() is not None or core.handle is not None) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert ref() is None and core.handle is None


def test_dropping_the_last_reference_inside_a_callback() -> None:
    """The finalizer then runs on the delivery thread, inside a callback of
    the engine it frees: it must hand the close to another thread."""
    done = threading.Event()
    released = threading.Event()
    holder: List[object] = [fetchq.Engine(workers=1)]
    core = holder[0]._core  # type: ignore[attr-defined]

    def cb(_: object) -> None:
        assert released.wait(TIMEOUT)   # the test thread holds no reference now
        holder.clear()
        gc.collect()
        done.set()

    q = holder[0].queue("q")  # type: ignore[attr-defined]
    q.suspend()                         # so cb runs on the delivery thread
    q.submit(lambda: 1).add_done_callback(cb)
    q.resume()
    del q
    released.set()
    assert done.wait(TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while core.handle is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert core.handle is None


def test_interpreter_exit_with_block_work_pending() -> None:
    out = run_script("""
        import threading, time, fetchq
        engine = fetchq.Engine(workers=2)
        q = engine.queue("q", max_concurrent=2)
        started = threading.Barrier(3, timeout=20)
        def slow(op):
            started.wait()
            while not op.cancelled:
                time.sleep(0.001)
            return 1
        running = [q.submit(slow, pass_op=True) for _ in range(2)]
        queued = [q.submit(lambda i=i: i) for i in range(1000)]
        for f in queued:
            f.add_done_callback(lambda f: None)
        started.wait()
        print("exiting", len(engine._core.pending), flush=True)
        # no close(): the finalizer frees the engine at exit
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("exiting 1002")
    assert "Traceback" not in out.stderr and "Fatal" not in out.stderr, out.stderr


def test_interpreter_exit_with_an_unfinished_async_operation() -> None:
    out = run_script("""
        import threading, fetchq
        engine = fetchq.Engine(workers=2)
        started = threading.Event()
        fut = engine.queue("q").submit_async(lambda op: started.set())   # never finished
        started.wait(20)
        print("exiting", flush=True)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "exiting\n"
    assert "Traceback" not in out.stderr and "Fatal" not in out.stderr, out.stderr


def test_interpreter_exit_from_a_worker_exception_path() -> None:
    """sys.exit while a callback and bodies run: no crash, no hang."""
    out = run_script("""
        import sys, fetchq
        e = fetchq.Engine(workers=2)
        q = e.queue("q", max_concurrent=2)
        futs = [q.submit(lambda i=i: i) for i in range(20000)]
        futs[0].result(timeout=20)
        sys.exit(3)
    """)
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr and "Fatal" not in out.stderr, out.stderr


def test_interpreter_exit_with_async_engine_pending() -> None:
    out = run_script("""
        import asyncio, fetchq
        keep = []
        async def main():
            e = fetchq.AsyncEngine(workers=2)
            q = e.queue("q", max_concurrent=1)
            q.suspend()
            keep.append((e, [q.submit(lambda: 1) for _ in range(100)]))
            assert await q.asubmit(lambda: 2) if False else True
        asyncio.run(main())
        print("done", flush=True)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "done\n"
    assert "Traceback" not in out.stderr and "Fatal" not in out.stderr, out.stderr


@needs_network
def test_interpreter_exit_with_requests_in_flight(server) -> None:  # type: ignore[no-untyped-def]
    out = run_script("""
        import sys, time, fetchq
        base = sys.argv[1]
        e = fetchq.Engine(workers=2)
        q = e.queue("net", max_concurrent=8)
        futs = [q.get(base + "/stall?i=%d" % i) for i in range(8)]
        futs += [q.get(base + "/delay?ms=60000&i=%d" % i) for i in range(8)]
        time.sleep(0.3)
        print("exiting", flush=True)
    """, server.base)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "exiting\n"
    assert "Traceback" not in out.stderr and "Fatal" not in out.stderr, out.stderr


def test_callbacks_stay_alive_while_c_holds_them() -> None:
    """The per-engine CFUNCTYPE objects are owned by the core, not by
    temporaries: a GC storm while work is in flight does not break them."""
    with fetchq.Engine(workers=2) as e:
        q = e.queue("gc", max_concurrent=2)
        futs = [q.submit(lambda i=i: [i] * 3) for i in range(2000)]
        for _ in range(20):
            gc.collect()
        assert [f.result(timeout=TIMEOUT)[0] for f in futs] == list(range(2000))


# -- races with close, interrupts, fork, reference cycles (third review) -------


def test_closing_a_queue_while_other_threads_use_it() -> None:
    """Queue.close() freed the handle while other threads were still in a
    C call with it: SIGSEGV in 4 of 7 runs (run in a child to see a crash)."""
    r = run_script("""
        import threading, time, fetchq
        unexpected = []
        for round_ in range(12):
            with fetchq.Engine() as e:
                q = e.queue("r", max_concurrent=2)
                def user(i):
                    for n in range(2000):
                        try:
                            if i % 4 == 3:
                                q.set_max_concurrent(1 + n % 3)
                            else:
                                q.submit(int)
                        except fetchq.StateError:
                            return                      # "queue 'r' is closed"
                        except BaseException as ex:
                            unexpected.append(repr(ex))
                            return
                ths = [threading.Thread(target=user, args=(i,)) for i in range(8)]
                for t in ths: t.start()
                time.sleep(0.01)
                q.close()
                for t in ths: t.join(20)
                assert not any(t.is_alive() for t in ths)
        print("ok", unexpected)
    """)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "ok []", r.stdout


def test_ctrl_c_inside_submits_leaves_nothing_behind() -> None:
    """A KeyboardInterrupt inside submit() leaked the count of calls into C
    (close() and interpreter exit then waited for ever) and dropped the
    bookkeeping of operations the library had taken ("completion for
    unknown userdata")."""
    r = run_script("""
        import signal, threading, time, fetchq
        class CtrlC(KeyboardInterrupt): pass
        inside = False                      # raised only within submit()
        def handler(sig, frame):
            if inside: raise CtrlC()
        e = fetchq.Engine()
        q = e.queue("q", max_concurrent=8)
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)
        interrupts, end = 0, time.monotonic() + 1.0
        while time.monotonic() < end:
            try:
                inside = True
                q.submit(int)
                inside = False
            except CtrlC:
                inside = False
                interrupts += 1
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        e.wait_idle(timeout=10)
        closer = threading.Thread(target=e.close, daemon=True)
        closer.start()
        closer.join(10)
        print(interrupts > 20, e._core.inflight, e._core.violations[:3], closer.is_alive(), e.closed)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "True 0 [] False True", (r.stdout, r.stderr[-2000:])


def test_waits_can_be_interrupted() -> None:
    """Queue.wait() and Engine.wait_idle() waited in C, where no Python
    signal handler runs: Ctrl-C took effect only when the body ended."""
    r = run_script("""
        import os, signal, threading, time, fetchq
        with fetchq.Engine() as e:
            q = e.queue("q")
            gate = threading.Event()
            q.submit(gate.wait, 20)
            for wait in (q.wait, e.wait_idle):
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
                t0 = time.monotonic()
                try:
                    wait()
                    print("returned")
                except KeyboardInterrupt:
                    print("interrupted", time.monotonic() - t0 < 3)
            try:
                q.wait(timeout=0.25)
            except fetchq.Timeout:
                print("timeout")
            gate.set()
            q.wait(timeout=10)
            print("done")
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:4] == ["interrupted True", "interrupted True", "timeout", "done"], r.stdout


def test_a_forked_child_leaves_the_parents_engine_alone() -> None:
    """A child of os.fork() that exited normally crashed or hung in the
    finalizer freeing the parent's engine, whose threads it does not have."""
    r = run_script("""
        import os, fetchq
        e = fetchq.Engine()
        q = e.queue("q")
        assert q.submit(int, 7).result(timeout=10) == 7
        pid = os.fork()
        if pid == 0:
            try:
                q.submit(int)
                print("child: submitted", flush=True)
            except fetchq.ShutdownError as ex:
                print("child:", ex, flush=True)
            raise SystemExit(0)                 # runs the finalizers
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        print("parent", q.submit(int, 8).result(timeout=10))
        e.close()
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [
        "child: the engine belongs to the parent process (os.fork): make a new one here",
        "child exit 0", "parent 8"], r.stdout


def test_a_dropped_engine_is_freed_without_the_cyclic_collector() -> None:
    """Engine -> queue -> engine was a reference cycle: a dropped engine
    and its threads lived until gc ran (for ever with gc disabled)."""
    gc.disable()
    try:
        e = fetchq.Engine()
        core = e._core
        q = e.queue("q")
        assert q.submit(int, 1).result(timeout=TIMEOUT) == 1
        del e
        assert core.handle is None          # freed at once
        try:
            q.submit(int)
        except fetchq.ShutdownError:
            pass
        else:
            raise AssertionError("a queue of a freed engine took a submit")
        try:
            q.engine
        except fetchq.StateError:
            pass
        else:
            raise AssertionError("q.engine of a freed engine")
    finally:
        gc.enable()


def test_a_cancelled_aclose_still_frees_the_engine() -> None:
    import asyncio

    async def main() -> bool:
        engine = fetchq.AsyncEngine()
        gate = threading.Event()
        engine.queue("q").submit(gate.wait, 0.5)
        task = asyncio.ensure_future(engine.aclose())
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return engine.closed

    assert asyncio.run(asyncio.wait_for(main(), TIMEOUT)) is True


def test_futures_and_queues_have_types() -> None:
    import typing
    assert fetchq.Future[int] is not None and fetchq.AsyncFuture[str] is not None
    Any = typing.Any
    assert typing.get_type_hints(fetchq.Engine.queue)["return"] == fetchq.Queue[fetchq.Future[Any]]
    assert typing.get_type_hints(fetchq.AsyncEngine.queue)["return"] is fetchq.AsyncQueue
    # submits of Python bodies return the queue's future type; the others
    # say what the future gives (AsyncQueue's say AsyncFuture to checkers)
    for method in ("submit", "submit_async"):
        assert str(typing.get_type_hints(getattr(fetchq.Queue, method))["return"]) == "~_F", method
    hints = {m: typing.get_type_hints(getattr(fetchq.Queue, m))["return"]
             for m in ("search", "search_all", "request", "get", "request_many", "get_many")}
    assert hints == {"search": fetchq.Future[typing.Dict[str, Any]],
                     "search_all": fetchq.Future[typing.Dict[str, Any]],
                     "request": fetchq.Future[fetchq.Response], "get": fetchq.Future[fetchq.Response],
                     "request_many": typing.List[fetchq.Future[fetchq.Response]],
                     "get_many": typing.List[fetchq.Future[fetchq.Response]]}
    assert typing.get_type_hints(fetchq.Queue.engine.fget)["return"] is fetchq.Engine
    assert typing.get_type_hints(fetchq.AsyncQueue.arequest)["return"] is fetchq.Response
    assert typing.get_type_hints(fetchq.AsyncQueue.asearch)["return"] == typing.Dict[str, Any]
    # errors.py names Response for checkers only (an import cycle): it resolves at run time too
    for error in (fetchq.HTTPError, fetchq.ParseError):
        assert typing.get_type_hints(error.__init__)["response"] == typing.Optional[fetchq.Response], error
    # an operation reference: an id, or a future of any value
    op_ref = typing.Union[int, fetchq.Future[Any], fetchq.AsyncFuture[Any]]
    for method in ("cancel", "set_priority", "add_dependency", "remove_dependency"):
        assert typing.get_type_hints(getattr(fetchq.Engine, method))["op"] == op_ref, method


def test_the_documented_api_type_checks_with_mypy_strict(tmp_path: Path) -> None:
    """tests/typing_sample.py, user code asserting the types docs/python.md
    promises (Queue.engine an Engine, request futures of Response, search
    results dicts, AsyncQueue's AsyncFutures and coroutines,
    HTTPError.response), passes ``mypy --strict`` against this package.
    Without mypy it is skipped, unless FETCHQ_REQUIRE_MYPY=1 (CI)."""
    import importlib.util
    if importlib.util.find_spec("mypy") is None:
        if os.environ.get("FETCHQ_REQUIRE_MYPY") == "1":
            pytest.fail("FETCHQ_REQUIRE_MYPY=1 but mypy is not installed for %s: "
                        "install it (python3 -m pip install mypy)" % sys.executable)
        pytest.skip("mypy is not installed (set FETCHQ_REQUIRE_MYPY=1 to make that a failure)")
    # MYPYPATH: this tree's package, not an installed copy; its own errors
    # are not the sample's (followed silently, as for an installed package)
    env = dict(os.environ, MYPYPATH=str(BINDING))
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--cache-dir", str(tmp_path / "mypy-cache"), str(HERE / "typing_sample.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, "mypy --strict tests/typing_sample.py:\n" + proc.stdout + proc.stderr
    assert "Success: no issues found in 1 source file" in proc.stdout


def test_waits_during_close_and_negative_timeouts() -> None:
    """A wait running while another thread closes the engine returns (it
    raised ShutdownError once the waits were sliced); a negative timeout is
    still a ValueError."""
    e = fetchq.Engine()
    q = e.queue("q")
    with pytest.raises(ValueError):
        q.wait(-1)
    with pytest.raises(ValueError):
        e.wait_idle(-1)
    gate = threading.Event()
    q.submit(gate.wait, 0.5)
    outcome: List[str] = []

    def waiter() -> None:
        try:
            e.wait_idle()
            outcome.append("returned")
        except BaseException as ex:  # noqa: BLE001
            outcome.append(type(ex).__name__)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    e.close()
    t.join(TIMEOUT)
    assert outcome == ["returned"]


def test_a_done_callback_may_submit_after_the_engine_was_dropped() -> None:
    e = fetchq.Engine()
    q = e.queue("q")
    follow: List[object] = []
    done = threading.Event()

    def cont(_: object) -> None:
        try:
            follow.append(q.submit(int, 5))
        except BaseException as ex:  # noqa: BLE001
            follow.append(ex)
        done.set()

    q.submit(time.sleep, 0.2).add_done_callback(cont)
    del e
    assert done.wait(TIMEOUT)
    assert isinstance(follow[0], fetchq.Future), follow
    assert follow[0].result(timeout=TIMEOUT) == 5



# -- the eighth review (thirty-first session): model-based random testing ----

def _task_count() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("which", ["engine", "queue"])
def test_a_wait_ends_when_another_threads_close_has_ended(which: str) -> None:
    engine = fetchq.Engine(workers=2)
    q = engine.queue("q", 1)
    started = threading.Event()

    def body() -> int:
        started.set()
        time.sleep(0.5)                 # ignores op.cancelled
        return 1

    fut = q.submit(body)
    assert started.wait(TIMEOUT)
    seen: Dict[str, Any] = {}

    def waiter() -> None:
        (engine.wait_idle if which == "engine" else q.wait)(timeout=TIMEOUT)
        seen["done"], seen["pending"] = fut.done(), engine.pending_count

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    engine.close()
    t.join(TIMEOUT)
    assert seen == {"done": True, "pending": 0}   # it returned before close() had ended everything


def test_async_engine_close_in_a_body_leaves_the_engine_working() -> None:
    async def main() -> None:
        engine = fetchq.AsyncEngine(workers=2)
        q = engine.queue("q")
        refused: List[str] = []

        def body() -> int:
            try:
                engine.close()
            except fetchq.StateError:
                refused.append("StateError")
            return 1

        assert await asyncio.wait_for(q.submit(body), TIMEOUT) == 1
        assert refused == ["StateError"]
        assert await asyncio.wait_for(q.submit(lambda: 2), TIMEOUT) == 2  # the loop still serves it
        await engine.aclose()
        assert engine.closed

    asyncio.run(main())


def test_an_engine_dropped_while_a_start_runs_after_finish_is_freed() -> None:
    before = _task_count()
    engine = fetchq.Engine(workers=2)
    q = engine.queue("q")
    go_on = threading.Event()

    def start(op: fetchq.AsyncOp) -> None:
        op.finish("v")
        go_on.wait(TIMEOUT)             # the last reference goes on this worker

    fut = q.submit_async(start)
    assert fut.result(TIMEOUT) == "v"
    del engine, q, fut
    go_on.set()
    for _ in range(200):                # freed from another thread, at most 10 s
        gc.collect()
        if _task_count() <= before:
            break
        time.sleep(0.05)
    assert _task_count() <= before


def test_a_kept_exception_does_not_keep_its_engine() -> None:
    def boom() -> None:
        raise ValueError("boom")

    engine = fetchq.Engine(workers=2)
    fut = engine.queue("q").submit(boom)
    with pytest.raises(fetchq.OperationError) as info:
        fut.result(TIMEOUT)
    err = info.value
    alive = weakref.ref(engine)
    del engine, fut, info
    gc.collect()
    assert alive() is None and isinstance(err.__cause__, ValueError)


def test_a_queue_name_is_free_again_once_close_returns() -> None:
    with fetchq.Engine(workers=2) as engine:
        q = engine.queue("name", 1)
        waiting = threading.Event()

        def user() -> None:
            waiting.set()
            try:
                q.wait(timeout=TIMEOUT)
            except fetchq.FetchqError:
                pass

        t = threading.Thread(target=user)
        closed = threading.Event()

        def body() -> None:
            assert waiting.wait(TIMEOUT)
            time.sleep(0.05)            # the other thread is inside q.wait()
            q.close()                   # deferred: another thread frees it
            closed.set()

        blocker = engine.queue("other").submit(body)
        t.start()
        blocker.result(TIMEOUT)
        assert closed.is_set()
        again = engine.queue("name", 1)   # InvalidArgument "already exists" before
        assert again is not q and again.submit(lambda: 3).result(TIMEOUT) == 3
        t.join(TIMEOUT)


def test_asyncop_cancelled_stays_true_after_close_finished_it() -> None:
    engine = fetchq.Engine(workers=2)
    q = engine.queue("q")
    handed: List[fetchq.AsyncOp] = []
    errors: List[BaseException] = []
    fut = q.submit_async(handed.append)
    for _ in range(2000):
        if handed:
            break
        time.sleep(0.005)
    op = handed[0]
    engine.close()                      # cancels it, then finishes it
    try:
        assert op.cancelled and op.finished
        op.finish()                     # a no-op now
    except BaseException as e:          # noqa: BLE001
        errors.append(e)
    assert errors == [] and fut.cancelled()


# -- the tenth review ----------------------------------------------------------

def test_queue_wait_raises_state_error_when_another_thread_closes_the_queue() -> None:
    """Queue.wait() returned normally, with the queue's operation still
    running, when another thread closed the queue during the wait (its
    docstring: StateError "when the queue is closed meanwhile")."""
    with fetchq.Engine(workers=2) as engine:
        q = engine.queue("q", 1)
        gate = threading.Event()
        fut = q.submit(gate.wait, TIMEOUT)
        queued = q.submit(int, 2)               # behind it: the close cancels it
        closer = threading.Timer(0.5, q.close)  # after the wait's first slices
        closer.start()
        try:
            with pytest.raises(fetchq.StateError, match="^queue 'q' is closed$"):
                q.wait(timeout=TIMEOUT)
            assert not fut.done()               # its operation still runs
        finally:
            closer.join(TIMEOUT)
            gate.set()
        assert fut.result(timeout=TIMEOUT) is True
        done, _ = cf.wait([queued], timeout=TIMEOUT)
        assert done == {queued} and queued.cancelled()


def test_an_async_engine_whose_loop_refuses_the_reader_frees_its_engine() -> None:
    """AsyncEngine() made the engine, then loop.add_reader raised (a closed
    loop): nothing freed the engine, whose threads stayed for ever."""
    loop = asyncio.new_event_loop()
    loop.close()
    before = _task_count()
    for _ in range(3):
        with pytest.raises(RuntimeError, match="closed"):
            fetchq.AsyncEngine(loop=loop, workers=2)
    for _ in range(200):                        # at most 10 s
        gc.collect()
        if _task_count() <= before:
            break
        time.sleep(0.05)
    assert _task_count() <= before


def test_a_forked_child_gets_fresh_module_locks(server) -> None:  # type: ignore[no-untyped-def]
    """fork() while another thread held the binding's module-wide lock (it
    was converting a lazy Response): in the child the lock stayed held, so
    a new engine's r.json() there hung for ever."""
    r = run_script("""
        import os, signal, sys, threading, fetchq
        from fetchq import _engine, _ffi
        base = sys.argv[1]
        fetchq.version()                        # the library is loaded
        holding, release = threading.Event(), threading.Event()
        def holder():
            with _engine._LAZY_LOCK, _ffi._LIB_STATE.lock:
                holding.set()
                release.wait(30)
        t = threading.Thread(target=holder)
        t.start()
        assert holding.wait(10)
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)                    # a hang ends the child (SIGALRM)
            with fetchq.Engine(workers=1) as e:
                r = e.queue("c").get(base + "/json?size=500").result(timeout=10)
                print("child", r.status, r.headers["content-type"], r.json()["items"][0]["name"], flush=True)
            print("child library lock free:", _ffi._LIB_STATE.lock.acquire(timeout=2), flush=True)
            os._exit(0)
        release.set()
        t.join(10)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
    """, server.base)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [
        "child 200 application/json item-000000", "child library lock free: True", "child exit 0"], r.stdout


def test_futures_pending_at_a_fork_fail_with_shutdown_error_in_the_child() -> None:
    """In a fork child a future pending at the fork accepted cancel() (True)
    but never resolved: result() waited for ever."""
    r = run_script("""
        import os, threading, fetchq
        e = fetchq.Engine(workers=2)
        q = e.queue("q", 1)
        gate, started = threading.Event(), threading.Event()
        running = q.submit(lambda: started.set() or gate.wait(20))
        queued = q.submit(int, 5)
        assert started.wait(10)
        called = []
        running.add_done_callback(lambda f: called.append(os.getpid()))
        pid = os.fork()
        if pid == 0:
            for f in (running, queued):
                accepted = f.cancel()
                try:
                    exc = f.exception(timeout=5)
                    what = "%s: %s" % (type(exc).__name__, exc)
                except BaseException as ex:
                    what = "raised " + type(ex).__name__
                print("child", accepted, f.done(), f.cancelled(), what, flush=True)
            print("child callbacks", called, flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        gate.set()
        print("parent", running.result(timeout=10), queued.result(timeout=10))
        e.close()
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    shut = "ShutdownError: the engine belongs to the parent process (os.fork): make a new one here"
    assert r.stdout.splitlines() == [
        "child False True False " + shut, "child False True False " + shut,
        "child callbacks []", "child exit 0", "parent True 5"], r.stdout


# -- found by mutation testing (review 34) -------------------------------------

def test_an_async_start_that_begins_after_the_close_sweep_is_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    """close() finishes (cancelled) the async operations it finds; one whose
    start reaches Python only after that sweep is finished by the start's
    own callback: close() returns and its future is cancelled."""
    from fetchq import _engine
    engine = fetchq.Engine(workers=1)
    entered = threading.Event()
    real_init = _engine.AsyncOp.__init__

    def late_init(self: Any, core: Any, op: int) -> None:
        entered.set()
        deadline = time.monotonic() + TIMEOUT
        while not core.swept and time.monotonic() < deadline:
            time.sleep(0.01)
        real_init(self, core, op)

    monkeypatch.setattr(_engine.AsyncOp, "__init__", late_init)
    handed: List[fetchq.AsyncOp] = []
    fut = engine.queue("q").submit_async(handed.append)     # never finished by it
    assert entered.wait(TIMEOUT)
    closer = threading.Thread(target=engine.close)
    closer.start()
    closer.join(TIMEOUT)
    stuck = closer.is_alive()
    if stuck and handed:
        handed[0].finish()              # let the close end
        closer.join(TIMEOUT)
    assert not stuck
    assert fut.cancelled() and engine.closed
