"""Shared fixtures: the library, the fault-injecting test server, a watchdog.

Run:  cd bindings/python && FETCHQ_LIBRARY=../../build/lib/libfetchq.so.0 python3 -m pytest -q tests

Every wait in these tests is bounded. A per-test watchdog (faulthandler)
additionally kills the run with a traceback if a test hangs anyway.
"""

from __future__ import annotations

import faulthandler
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from urllib.parse import quote
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
BINDING = HERE.parent
REPO = BINDING.parent.parent
SERVER = REPO / "Tests" / "support" / "testserver.py"
SUITE = (REPO / ".." / "shared" / "data" / "JSONTestSuite" / "test_parsing").resolve()

sys.path.insert(0, str(BINDING))  # the package under test, not an installed copy

import fetchq  # noqa: E402
from fetchq import _ffi  # noqa: E402

TIMEOUT = 20.0          # generous: only to fail instead of hang
WATCHDOG = 240.0        # per test, kills the run with tracebacks


def has_function(name: str) -> bool:
    return _ffi.lib().has(name)


def require_function(name: str) -> None:
    """A library without a function the tests need fails them; never skips."""
    if not has_function(name):
        pytest.fail("the loaded libfetchq (%s) has no %s" % (_ffi.lib().path, name))


# Kept as a marker name for readability; the library must have network ops.
needs_network = pytest.mark.network


@pytest.fixture(autouse=True)
def _watchdog() -> Iterator[None]:
    faulthandler.dump_traceback_later(WATCHDOG, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


class Server:
    def __init__(self, proc: "subprocess.Popen[bytes]", port: int, scheme: str = "http") -> None:
        self.proc = proc
        self.port = port
        self.base = "%s://127.0.0.1:%d" % (scheme, port)

    def url(self, path: str) -> str:
        return self.base + path

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url(path), timeout=TIMEOUT) as r:
            return json.loads(r.read())

    def stats(self) -> Dict[str, Any]:
        return self.get_json("/stats")

    def reset(self) -> None:
        self.get_json("/stats/reset")


def start_server(*extra: str) -> Server:
    tmp = tempfile.mkdtemp(prefix="fetchq-py-")
    port_file = os.path.join(tmp, "port")
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", "0", "--port-file", port_file,
         "--parent-pid", str(os.getpid()), "--max-seconds", "1800", *extra],
        stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(port_file):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    with open(port_file) as f:
        port = int(f.read())
    shutil.rmtree(tmp, ignore_errors=True)
    scheme = "https" if "--tls-cert" in extra else "http"
    return Server(proc, port, scheme)


def stop_server(proc: "subprocess.Popen[bytes]") -> None:
    if proc.poll() is None:
        proc.terminate()            # by its own pid
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    files = [] if not SUITE.is_dir() else ["--files", str(SUITE)]
    srv = start_server(*files)
    yield srv
    stop_server(srv.proc)


@pytest.fixture(scope="session")
def demo_server() -> Iterator[Server]:
    srv = start_server("--corpus", "demo")
    yield srv
    stop_server(srv.proc)


def identical(a: Any, b: Any) -> bool:
    """Equal, with the same types (1 is not 1.0, True is not 1), the same
    sign of zero and the same key order (iterative: documents nest deep)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, float):
            if not (x == y and math.copysign(1.0, x) == math.copysign(1.0, y)):
                return False
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y))
        elif isinstance(x, dict):
            if list(x) != list(y):
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif x != y:
            return False
    return True


def fetch_all(srv: Server, names: List[str], **options: Any) -> Dict[str, Any]:
    """Every /file/NAME with parse="json": name -> Response or exception."""
    with fetchq.Engine(workers=4, max_json_depth=2048) as engine:
        q = engine.queue("files", max_concurrent=8)
        futs = {n: q.get(srv.url("/file/" + quote(n, safe="")), parse="json", **options)
                for n in names}
        out = {}
        for n, f in futs.items():
            exc = f.exception(timeout=TIMEOUT)
            out[n] = exc if exc is not None else f.result()
        assert engine._core.violations == []
    return out


def search_config(srv: Server, **extra: Any) -> Dict[str, Any]:
    cfg = {"url": srv.url("/search?q={query}&rpp=500"), "results": "/results",
           "id": "/id", "sort": "/created_at", "order": "desc"}
    cfg.update(extra)
    return cfg


@pytest.fixture
def engine() -> Iterator[fetchq.Engine]:
    e = fetchq.Engine(workers=4)
    yield e
    e.close()
    assert e._core.violations == []


@pytest.fixture
def net_engine(server: Server) -> Iterator[fetchq.Engine]:
    require_function("fq_submit_request")
    e = fetchq.Engine(workers=4, search=search_config(server), timeout_ms=20000)
    yield e
    e.close()
    assert e._core.violations == []


def expected_library() -> Optional[str]:
    env = os.environ.get("FETCHQ_LIBRARY")
    return os.path.realpath(env) if env else None
