"""Handles, callbacks and interpreter exit."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from typing import List


import fetchq

from conftest import BINDING, TIMEOUT, needs_network


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
    deadline = time.monotonic() + TIMEOUT
    while ref() is not None and time.monotonic() < deadline:
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
