"""Engines, queues, futures and operation contexts on top of ``_ffi``.

Lifetime rules (what keeps what alive):

* ``_Core`` owns the ``fq_engine *`` and the three ctypes callbacks of the
  engine (completion, block body, progress event). They are created once per
  engine and referenced by the core until ``fq_engine_free`` has returned, so
  C never calls a torn-down callback.
* Each submitted operation gets an ``_OpState`` in ``core.pending``, keyed by
  a token passed to C as ``userdata``. It is registered before the submit
  (the completion may arrive on the delivery thread before the submit call
  returns) and removed by the completion callback, exactly once.
* ``weakref.finalize(engine, _finalize, core)`` frees a forgotten engine; it
  also runs at interpreter exit (``atexit``), before modules are torn down, so
  ``fq_engine_free`` cancels and delivers pending work while the callbacks are
  still alive. A pending operation's state references its engine, so an
  engine dropped with work pending is freed once that work finishes; a queue
  references its engine weakly (no reference cycle: an engine dropped with
  no work pending is freed at once, even with the cyclic collector off).
* Counters of calls into C (``core.inflight``, ``Queue._users``) are changed
  only inline inside ``with core.lock:`` blocks, in statements that call
  nothing: CPython raises a KeyboardInterrupt only at calls and jumps, so an
  interrupt almost never leaves a count that does not return to zero (which
  made ``close()`` wait for ever). One case remains: an interrupt that lands
  while the decrement waits for the lock another thread holds (a blocked
  ``Lock.acquire`` raises it) — pure Python cannot defer it.
* After ``os.fork()`` the child forgets every engine it inherited (their
  threads do not exist there): using one raises ShutdownError, its futures
  still pending fail with that ShutdownError (without the parent's
  done-callbacks), and its finalizer frees nothing. The module's locks are
  new ones there (a parent thread may have held one at the fork).
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import ctypes
import itertools
import json as _json
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Iterable as _AnyIterable, Mapping, Sequence as _AnySequence
from typing import (
    TYPE_CHECKING, Any, Callable, Dict, Generic, Iterable, List, Optional, Tuple, TypeVar, Union, cast,
)

from . import _ffi
from . import errors as _errors_module
from ._ffi import (
    FQ_CANCELLED, FQ_ERR_DEPENDENCY, FQ_ERR_HTTP, FQ_ERR_NOT_FOUND, FQ_ERR_PARSE,
    FQ_ERR_OPERATION, FQ_EVENT_CHILD, FQ_EVENT_PROGRESS, FQ_EVENT_UPDATE, FQ_FAILED,
    FQ_OK, FQ_SUCCEEDED,
)
from .errors import (
    DependencyError, FetchqError, HTTPError, InvalidArgument, OperationError, ParseError,
    ShutdownError, StateError, Timeout, error_for_status,
)

log = logging.getLogger("fetchq")
engine_log = logging.getLogger("fetchq.engine")   # the library's own log lines

# fq_log_level -> logging level (TRACE and NOTICE have no stdlib name)
_LOG_LEVELS = {0: 5, 1: logging.DEBUG, 2: logging.INFO, 3: 25, 4: logging.WARNING,
               5: logging.ERROR, 6: logging.CRITICAL}

ProgressFn = Callable[[int, Optional[int]], Any]
OpRef = Union[int, "Future[Any]", "AsyncFuture[Any]"]

_STATES = {1: "waiting", 2: "ready", 3: "running", 4: "succeeded", 5: "failed", 6: "cancelled"}
_PRIORITIES = {"very-low": -8, "low": -4, "normal": 0, "high": 4, "very-high": 8}
_UNSET: Any = object()
_INT32_MAX = 2**31 - 1


def _timeout_ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("timeout must be >= 0 or None")
    return min(_INT32_MAX, int(math.ceil(timeout * 1000)))


class _Local(threading.local):
    def __init__(self) -> None:
        self.cores: List["_Core"] = []   # engines whose callback/body runs here
        self.ops: List["Op"] = []        # Python bodies running on this thread


_tls = _Local()


# --------------------------------------------------------------------------
# Results
#
# Responses and Results are lazy. In the completion callback they copy only
# what cannot wait — status, error, body bytes — and keep the rest as C
# values: _ffi.hold() takes one reference to the headers, metrics and (when
# needed) value json_t in a private array, so they outlive the callback,
# the operation and the engine. Each is converted (json_dumps + json.loads)
# the first time it is read; the array is released once nothing is left to
# convert, or when the object is garbage collected — exactly once either
# way (``_hold`` is swapped to 0 before the release).
#
# The value of a request that SUCCEEDED is never kept as a json_t: the
# library documents it as "a parsed response", and libfetchq parses the body
# it hands out to exactly the value jansson's json_loadb(JSON_DECODE_ANY |
# JSON_ALLOW_NUL) gives after rejecting raw NUL bytes (it builds valid input
# itself, tested against jansson). Everything jansson accepts that way, Python's
# json.loads reads to the same value from the same bytes (integers are within
# int64, reals finite doubles, strings valid UTF-8 without lone surrogates,
# duplicate keys: the last wins in both, in the first key's place), so
# ``json()`` parses ``body`` once instead of the json_dumps/json.loads round
# trip. Failed requests (an HTTP status not accepted: the value may be a
# stale cached one), searches and block results keep the json_t.

_PENDING: Any = object()          # a lazy field not converted yet
_RETAIN_BODY_LIMIT = 64 * 1024    # Response keeps its fq_result up to this body size
_LAZY_LOCK = threading.RLock()    # converting/releasing held json_t (reentrant:
                                  # a finalizer may read another lazy field)


# json.loads' own C scanner, with json.loads' default settings.
_SCAN_ONCE = _json.JSONDecoder().scan_once


def _loads_checked(text: str) -> Any:
    """``json.loads(text)`` for a body the engine checked as one JSON value,
    without json.loads' two whitespace regex matches around the scan (about
    0.8 µs of a 3 KB response's 20). Leading whitespace, trailing bytes that
    are not whitespace or anything unexpected take json.loads itself, which
    gives its own value or error."""
    try:
        value, end = _SCAN_ONCE(text, 0)
    except (StopIteration, ValueError):
        return _json.loads(text)
    if end != len(text) and text[end:].strip(" \t\n\r"):
        return _json.loads(text)
    return value


def _drop_held(obj: Any) -> None:
    """Releases obj's held array once no pointer is left to convert and no
    body left to copy (caller holds _LAZY_LOCK)."""
    holder = obj._hold
    if holder and not (obj._vptr or obj._hptr or obj._mptr
                       or getattr(obj, "_body", None) is _PENDING):
        obj._hold = 0
        _ffi.release(holder)


def _convert_held(obj: Any, slot: str, ptr_slot: str, empty: Any) -> Any:
    """The Python value of a held json_t field, converted once."""
    with _LAZY_LOCK:
        value = getattr(obj, slot)
        if value is _PENDING:
            ptr = getattr(obj, ptr_slot)
            if callable(ptr):   # an accessor of the held fq_result (see _from_result)
                ptr = ptr(obj._hold.address)
            value = _ffi.from_json(ptr)
            if value is None:
                value = empty
            setattr(obj, slot, value)
            setattr(obj, ptr_slot, 0)
            _drop_held(obj)
        return value


def _assign_held(obj: Any, slot: str, ptr_slot: str, value: Any) -> None:
    """An assignment replaces the held json_t: it is no longer needed."""
    with _LAZY_LOCK:
        setattr(obj, slot, value)
        setattr(obj, ptr_slot, 0)
        _drop_held(obj)


def _release_held(obj: Any) -> None:
    """__del__: the object is unreachable, so nobody converts concurrently."""
    holder = getattr(obj, "_hold", 0)
    if holder:
        obj._hold = 0
        try:
            _ffi.release(holder)
        except Exception:  # interpreter shutdown: nothing left to do
            pass


class _HeldHTTPParts:
    """`headers` and `metrics` of a result or response: converted from the
    held C JSON on first read (the subclass has the slots)."""

    __slots__ = ()
    _headers: Any
    _metrics: Any

    @property
    def headers(self) -> Dict[str, str]:
        value = self._headers
        if value is _PENDING:
            value = _convert_held(self, "_headers", "_hptr", {})
        return value  # type: ignore[no-any-return]

    @headers.setter
    def headers(self, value: Dict[str, str]) -> None:
        _assign_held(self, "_headers", "_hptr", value)

    @property
    def metrics(self) -> Dict[str, Any]:
        value = self._metrics
        if value is _PENDING:
            value = _convert_held(self, "_metrics", "_mptr", {})
        return value  # type: ignore[no-any-return]

    @metrics.setter
    def metrics(self, value: Dict[str, Any]) -> None:
        _assign_held(self, "_metrics", "_mptr", value)


# Python codecs that decode bytes to text but are no charsets a server means
# (Response.text decodes with UTF-8 instead), by codecs.lookup(...).name.
_NOT_CHARSETS = frozenset({"punycode", "idna", "undefined", "unicode-escape", "raw-unicode-escape", "charmap"})


class Response(_HeldHTTPParts):
    """The outcome of a request.

    ``status`` (int), ``headers`` (dict, lower-cased names, repeated headers
    joined with ", "), ``body`` (bytes, gzip already decoded), ``metrics``
    (dict: queue_wait_ms, connect_ms, first_byte_ms, total_ms, bytes,
    redirects, attempts, http_version, reused_connection, from_cache),
    ``op_id``, ``from_cache`` (answered by the engine's HTTP cache).
    ``json()`` returns the value the engine parsed (option parse="auto"/"json")
    or parses ``body`` itself.

    ``headers``, ``metrics`` and the parsed value are converted to Python
    objects when first read (then the same objects are returned each time).
    """

    __slots__ = ("status", "_body", "op_id", "from_cache", "_headers", "_metrics",
                 "_value", "_has_value", "_hold", "_vptr", "_hptr", "_mptr")

    def __init__(self, status: int, headers: Dict[str, str], body: bytes,
                 metrics: Dict[str, Any], op_id: int, value: Any, has_value: bool,
                 from_cache: bool = False) -> None:
        self.from_cache = from_cache    # answered by the engine's HTTP cache
        self.status = status
        self._headers = headers
        self._body = body
        self._metrics = metrics
        self.op_id = op_id
        self._value = value
        self._has_value = has_value
        self._hold = self._vptr = self._hptr = self._mptr = 0

    @classmethod
    def _from_result(cls, core: "_Core", result: int, op_id: int,
                     value_is_body: bool) -> "Response":
        """A lazy Response from a BORROWED fq_result (inside its callback).
        ``value_is_body``: the value, if any, is the parse of the body (a
        request that succeeded), so it is not kept as a json_t."""
        L = core.lib
        self = cls.__new__(cls)
        self.status = int(L.fq_result_http_status(result))
        self.op_id = op_id
        self.from_cache = bool(L.fq_result_from_cache(result)) if core.has_from_cache else False
        address, size = _ffi.body_at(result)
        if value_is_body and core.has_result_retain and size <= _RETAIN_BODY_LIMIT:
            # Keep the fq_result itself: its headers and metrics are built
            # (in C too) only if read, and its value is the body's parse.
            # The body is copied only if read (json() decodes it straight
            # from the library's copy). Not for large bodies, which would be
            # held twice once read.
            self._body = _PENDING if size else b""
            self._has_value = bool(L.fq_result_has_value(result))
            self._value = _PENDING if self._has_value else None
            self._headers = self._metrics = _PENDING
            self._vptr = 0
            self._hptr = L.fq_result_headers
            self._mptr = L.fq_result_metrics
            self._hold = _ffi.hold_result(result)
            return self
        self._body = _ffi.string_at(address, size) if address and size else b""
        if value_is_body and core.has_lazy_parse:
            # not fq_result_value: that would build a "lazy_parse" value
            vptr = None
            self._has_value = bool(L.fq_result_has_value(result))
        else:
            vptr = L.fq_result_value(result)
            self._has_value = bool(vptr)
        hptr = L.fq_result_headers(result)
        mptr = L.fq_result_metrics(result)
        self._value = _PENDING if self._has_value else None
        self._headers = _PENDING if hptr else {}
        self._metrics = _PENDING if mptr else {}
        if value_is_body:
            vptr = None
        self._vptr = vptr or 0
        self._hptr = hptr or 0
        self._mptr = mptr or 0
        self._hold = _ffi.hold(vptr, hptr, mptr)
        return self

    def __del__(self) -> None:
        _release_held(self)

    def __reduce__(self) -> Any:
        # copy, deepcopy and pickle get a plain (converted) Response: the held
        # json_t belongs to this object alone.
        return (Response, (self.status, self.headers, self.body, self.metrics, self.op_id,
                           self.json() if self._has_value else None, self._has_value,
                           self.from_cache))

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def body(self) -> bytes:
        body = self._body
        if body is _PENDING:
            with _LAZY_LOCK:
                body = self._body
                if body is _PENDING:    # the hold is alive while the body is pending
                    body = self._body = _ffi.body_of(self._hold.address)
                    _drop_held(self)
        return body  # type: ignore[no-any-return]

    @body.setter
    def body(self, value: bytes) -> None:
        with _LAZY_LOCK:
            self._body = value
            _drop_held(self)

    def _parse_body(self) -> Any:
        """json.loads of the body. While the result is held (the body not
        copied yet): its value in marshal's format if the engine wrote one
        (option "marshal": the same value, fetchq.h), else the body decoded
        straight from the held result (one copy instead of two). Only for a
        body the engine checked as JSON: it is UTF-8 without a BOM then, so
        this is exactly what json.loads(self.body) gives."""
        if self._body is _PENDING:
            with _LAZY_LOCK:
                if self._body is not _PENDING:
                    text = None
                else:
                    value = _ffi.marshal_value(self._hold.address)
                    if value is not _ffi.NO_MARSHAL:
                        return value
                    text = _ffi.body_text(self._hold.address)
            if text is not None:
                return _loads_checked(text)
        return _json.loads(self.body)

    @property
    def parsed(self) -> bool:
        """True when the engine parsed the body as JSON."""
        return self._has_value

    @property
    def text(self) -> str:
        """The body decoded with the Content-Type's charset (default
        UTF-8), undecodable bytes replaced; UTF-8 when Python has no text
        codec of that name, or one that is no charset ("idna", "punycode",
        "undefined", "unicode_escape", "raw_unicode_escape", "charmap")."""
        charset = "utf-8"
        ctype = self.headers.get("content-type", "")
        for part in ctype.split(";")[1:]:
            key, _, val = part.strip().partition("=")
            if key.lower() == "charset" and val:
                charset = val.strip('"')
        try:
            if codecs.lookup(charset).name in _NOT_CHARSETS:
                # A codec of Python's, no charset: punycode "decodes" ASCII
                # into other letters without an error (the tenth review's
                # check of its changes: "Hello World" came back '㗁㖼㖶').
                charset = "utf-8"
            return self.body.decode(charset, "replace")
        except (LookupError, ValueError):
            # LookupError: unknown, or not a text codec (base64). ValueError:
            # UnicodeError from a codec that takes no "replace" or fails
            # anyway (the tenth review: text raised for such a charset), or
            # a NUL in the name.
            return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        if not self._has_value:
            return _json.loads(self.body)
        value = self._value
        if value is _PENDING:
            if self._vptr:
                return _convert_held(self, "_value", "_vptr", None)
            value = self._parse_body()     # outside the lock (but for reading the C body)
            with _LAZY_LOCK:                # the first conversion wins
                if self._value is _PENDING:
                    self._value = value
                else:
                    value = self._value
        return value

    def __repr__(self) -> str:
        return "<fetchq.Response op=%d status=%d %d bytes>" % (
            self.op_id, self.status, len(self.body))


# errors.py names Response in annotations but cannot import it (this module
# imports errors): bound there now, so typing.get_type_hints resolves them.
setattr(_errors_module, "Response", Response)


_OUTCOMES = {FQ_SUCCEEDED: "succeeded", FQ_FAILED: "failed", FQ_CANCELLED: "cancelled"}


class Result(_HeldHTTPParts):
    """A snapshot of an operation's result as the C API reports it: used for
    search-all children (``on_child``) and :meth:`Op.dependency`.

    ``op_id``, ``outcome`` ("succeeded" | "failed" | "cancelled"), ``status``
    (fq_status, 0 on success), ``error`` (message or None), ``value``, and for
    network operations ``http_status``, ``headers``, ``body``, ``metrics``;
    ``query`` for a search-all child. ``value``, ``headers`` and ``metrics``
    are converted to Python objects when first read.
    """

    __slots__ = ("op_id", "outcome", "status", "error", "http_status", "body", "query",
                 "from_cache", "_value", "_headers", "_metrics", "_hold", "_vptr",
                 "_hptr", "_mptr")

    def __init__(self, op_id: int, outcome: str, status: int, error: Optional[str],
                 value: Any, http_status: int = 0, headers: Optional[Dict[str, str]] = None,
                 body: bytes = b"", metrics: Optional[Dict[str, Any]] = None,
                 query: Optional[str] = None, from_cache: bool = False) -> None:
        self.from_cache = from_cache
        self.op_id = op_id
        self.outcome = outcome
        self.status = status
        self.error = error
        self._value = value
        self.http_status = http_status
        self._headers = headers or {}
        self.body = body
        self._metrics = metrics or {}
        self.query = query
        self._hold = self._vptr = self._hptr = self._mptr = 0

    def __del__(self) -> None:
        _release_held(self)

    def __reduce__(self) -> Any:
        return (Result, (self.op_id, self.outcome, self.status, self.error, self.value,
                         self.http_status, self.headers, self.body, self.metrics, self.query,
                         self.from_cache))

    @property
    def value(self) -> Any:
        value = self._value
        if value is _PENDING:
            value = _convert_held(self, "_value", "_vptr", None)
        return value

    @value.setter
    def value(self, value: Any) -> None:
        _assign_held(self, "_value", "_vptr", value)

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"

    def exception(self) -> Optional[FetchqError]:
        """The exception a future would raise for this result (None on
        success; :class:`fetchq.Cancelled` for a cancelled one)."""
        if self.ok:
            return None
        if self.status == FQ_ERR_HTTP:
            return HTTPError(self.error or "", self.status, status=self.http_status,
                             body=self.body, headers=self.headers)
        return error_for_status(self.status, self.error or "")

    def __repr__(self) -> str:
        return "<fetchq.Result op=%d %s%s>" % (
            self.op_id, self.outcome, "" if self.ok else " %r" % self.error)


def _read_result(core: "_Core", result: int, query: Optional[str] = None) -> Result:
    """A lazy Result from a BORROWED fq_result (valid only during the call):
    copies the scalars and the body, holds the value, headers and metrics."""
    L = core.lib
    self = Result.__new__(Result)
    self.op_id = int(L.fq_result_op_id(result))
    self.outcome = _OUTCOMES.get(L.fq_result_outcome(result), "unknown")
    self.status = int(L.fq_result_status(result))
    self.error = _ffi.cstr(L.fq_result_error(result))
    self.query = query
    self.from_cache = bool(L.fq_result_from_cache(result)) if core.has_from_cache else False
    vptr = L.fq_result_value(result)
    if core.has_http:
        self.http_status = int(L.fq_result_http_status(result))
        self.body = _ffi.body_of(result)
        hptr = L.fq_result_headers(result)
        mptr = L.fq_result_metrics(result)
    else:
        self.http_status, self.body, hptr, mptr = 0, b"", None, None
    self._value = _PENDING if vptr else None
    self._headers = _PENDING if hptr else {}
    self._metrics = _PENDING if mptr else {}
    self._vptr = vptr or 0
    self._hptr = hptr or 0
    self._mptr = mptr or 0
    self._hold = _ffi.hold(vptr, hptr, mptr)
    return self


class Op:
    """An operation seen from inside its own Python body (valid only while
    the body runs; see :func:`current_op`)."""

    __slots__ = ("_core", "_op", "_id", "__weakref__")

    def __init__(self, core: "_Core", op: int) -> None:
        self._core = core
        self._op: Optional[int] = op
        self._id = int(core.lib.fq_op_get_id(op))

    @property
    def id(self) -> int:
        return self._id

    def _handle(self) -> int:
        if self._op is None:
            raise StateError("the Op of operation %d is only valid while its body runs" % self._id)
        return self._op

    @property
    def cancelled(self) -> bool:
        """True once the operation was cancelled; a long body should return."""
        return bool(self._core.lib.fq_op_is_cancelled(self._handle()))

    def dependency_result(self, dep: OpRef) -> Any:
        """The value of a dependency named in ``depends_on`` (or added with
        ``add_dependency``): a block's return value, a search's dict, a
        request's parsed body. None when ``dep`` is not a dependency or
        produced no value."""
        op_id = self._core.op_id_of(dep)
        return _ffi.from_json(self._core.lib.fq_op_dependency_result(self._handle(), op_id))

    def dependency(self, dep: OpRef) -> Optional[Result]:
        """The whole result of a dependency (status, error, value and, for a
        request, HTTP status, headers, body); None if ``dep`` is not one."""
        op_id = self._core.op_id_of(dep)
        ptr = self._core.lib.fq_op_dependency(self._handle(), op_id)
        return _read_result(self._core, ptr) if ptr else None

    def __repr__(self) -> str:
        return "<fetchq.Op %d>" % self._id


class AsyncOp(Op):
    """The operation of :meth:`Queue.submit_async`: like :class:`Op`, plus
    :meth:`finish`, which must be called exactly once, from any thread. The
    operation keeps its queue slot until then. Closing the engine finishes
    (cancelled) an operation still unfinished; a later ``finish`` is then a
    no-op."""

    __slots__ = ("_lock", "_by_close")

    def __init__(self, core: "_Core", op: int) -> None:
        super().__init__(core, op)
        self._lock = threading.Lock()
        self._by_close = False

    @property
    def finished(self) -> bool:
        return self._op is None

    @property
    def cancelled(self) -> bool:
        """True once the operation was cancelled; also after the engine's
        ``close()`` finished it (cancelled), when the handle is gone."""
        with self._lock:                # close() must not finish it meanwhile
            if self._op is None and self._by_close:
                return True
            return bool(self._core.lib.fq_op_is_cancelled(self._handle()))

    def finish(self, value: Any = None, error: Optional[str] = None) -> None:
        """Ends the operation: with ``value`` (converted to JSON), or failed
        with ``error`` (the future raises :class:`OperationError`). If it was
        cancelled meanwhile it ends cancelled. A value JSON cannot hold raises
        TypeError/ValueError and leaves the operation unfinished."""
        ptr = None
        if error is None and value is not None:
            ptr = _ffi.to_json(value, "the value")
        msg = None if error is None else str(error).replace("\0", "\\0").encode("utf-8", "replace")
        with self._lock:
            op = self._op
            if op is None:
                _ffi.decref(ptr)
                if self._by_close:
                    return              # the engine closed and finished it (cancelled)
                raise StateError("operation %d is already finished" % self._id)
            self._op = None
        self._core.async_ops.discard(self)
        self._core.lib.fq_op_finish(op, ptr, msg)  # ptr is STOLEN

    def _finish_for_close(self) -> None:
        """Engine close: an unfinished async op would make fq_engine_free
        wait forever. It is already cancelled, so this ends it CANCELLED."""
        with self._lock:
            op, self._op = self._op, None
            self._by_close = True
        if op is not None:
            self._core.lib.fq_op_finish(op, None, None)

    def __repr__(self) -> str:
        return "<fetchq.AsyncOp %d%s>" % (self._id, " finished" if self.finished else "")


def current_op() -> Op:
    """The :class:`Op` of the Python body running on this thread."""
    if not _tls.ops:
        raise StateError("current_op() is only available inside an operation body")
    return _tls.ops[-1]


# --------------------------------------------------------------------------
# Futures

_T = TypeVar("_T")


class Future(concurrent.futures.Future[_T]):
    """A ``concurrent.futures.Future`` bound to one operation.

    ``cancel()`` cancels the operation, also while it runs: it returns True
    when the engine accepted the cancellation (the operation had not finished)
    and the future then becomes ``cancelled()`` when the engine's completion
    arrives — at once for queued and network operations, when the body
    returns for a running Python body. It returns False when the operation
    already finished (its result is on the way). An operation ended by the
    engine, not cancelled itself, raises instead: DependencyError (a
    dependency failed or was cancelled), NotFound (a ``depends_on`` id the
    engine could not find, such as one a failed submit used up).
    """

    def __init__(self, core: "_Core") -> None:
        super().__init__()
        self._core = core
        self._op_id: Optional[int] = None
        self._cancel_wanted = False

    @property
    def op_id(self) -> int:
        """The operation id (> 0)."""
        if self._op_id is None:
            raise StateError("the operation is still being submitted")
        return self._op_id

    def cancel(self) -> bool:
        if self.cancelled():
            return True
        if self.done():
            return False
        return self._core.request_cancel(self)

    # resolution, called once by the engine
    def _fq_set_result(self, value: Any) -> None:
        if not self.done():
            self.set_result(value)

    def _fq_set_exception(self, exc: BaseException) -> None:
        if not self.done():
            self.set_exception(exc)

    def _fq_set_cancelled(self) -> None:
        if concurrent.futures.Future.cancel(self):
            try:
                self.set_running_or_notify_cancel()  # wakes wait()/as_completed()
            except RuntimeError:
                pass

    def _fq_fail_in_child(self, exc: BaseException) -> None:
        """In a child after os.fork(), for a future still pending: resolved
        with ``exc``. Its lock may have been held by a parent thread and its
        waiters (wait(), as_completed()) are parent threads, none of which
        exists here; its done-callbacks are the parent's and do not run here
        (no code of the application runs in the at-fork handler)."""
        self._condition = threading.Condition()
        self._waiters.clear()
        cast(Any, self)._done_callbacks.clear()     # (not in typeshed's Future)
        self._fq_set_exception(exc)


class AsyncFuture(asyncio.Future[_T]):
    """An ``asyncio.Future`` bound to one operation (AsyncEngine).

    Awaiting it gives the result; ``cancel()`` (also through cancelling a task
    awaiting it) cancels the operation; the future is then cancelled when the
    engine confirms, on the loop's thread.
    """

    def __init__(self, core: "_Core", loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._core = core
        self._op_id: Optional[int] = None
        self._cancel_wanted = False
        self._cancel_msg: Any = None

    @property
    def op_id(self) -> int:
        if self._op_id is None:
            raise StateError("the operation is still being submitted")
        return self._op_id

    def cancel(self, msg: Any = None) -> bool:
        if self.done():
            return False
        self._cancel_msg = msg
        return self._core.request_cancel(self)

    def _fq_set_result(self, value: Any) -> None:
        if not self.done():
            self.set_result(value)

    def _fq_set_exception(self, exc: BaseException) -> None:
        if not self.done():
            self.set_exception(exc)

    def _fq_set_cancelled(self) -> None:
        if not self.done():
            asyncio.Future.cancel(self, msg=self._cancel_msg)

    def _fq_fail_in_child(self, exc: BaseException) -> None:
        """In a child after os.fork(), for a future still pending: resolved
        with ``exc`` (its callbacks run if the child runs the loop)."""
        self._fq_set_exception(exc)


AnyFuture = Union["Future[Any]", "AsyncFuture[Any]"]
# What a queue's submits return: Future for an Engine's queues, AsyncFuture
# for an AsyncEngine's (Queue[Future[Any]] and AsyncQueue).
_F = TypeVar("_F", "Future[Any]", "AsyncFuture[Any]")
# headers= and params=: a mapping, or (name, value) pairs with no name twice.
Pairs = Union["Mapping[str, Any]", Iterable[Tuple[str, Any]]]


# --------------------------------------------------------------------------
# Per-operation state

class _OpState:
    __slots__ = ("future", "kind", "fn", "args", "pass_op", "progress", "on_child",
                 "on_update", "queue", "engine", "cause", "interrupted")

    def __init__(self, kind: str, queue: "Queue", fn: Optional[Callable[..., Any]] = None,
                 args: Tuple[Any, ...] = (), pass_op: bool = False,
                 progress: Optional[ProgressFn] = None,
                 on_child: Optional[Callable[[Result], Any]] = None,
                 on_update: Optional[Callable[[Any], Any]] = None) -> None:
        self.kind = kind            # "block" | "request" | "search" | "search_all"
        self.queue = queue          # keeps the queue alive while pending
        self.engine = queue._engine_ref()   # and the engine (a queue holds it weakly)
        # an exception (a KeyboardInterrupt) interrupted the submit after the
        # library may have taken it: its completion, or close, resolves it quietly
        self.interrupted = False
        self.fn = fn
        self.args = args
        self.pass_op = pass_op
        self.progress = progress
        self.on_child = on_child
        self.on_update = on_update
        self.cause: Optional[BaseException] = None
        self.future: Any = None

    @property
    def has_events(self) -> bool:
        """Events of this operation must be routed to it (see _Core.by_op)."""
        return self.progress is not None or self.on_child is not None or self.on_update is not None


# --------------------------------------------------------------------------
# The engine core

class _Core:
    """Owns the fq_engine handle and its callbacks; shared by the Engine
    object, its queues, futures and the finalizer (which must not reference
    the Engine object itself)."""

    def __init__(self, config: Dict[str, Any], mode: str,
                 loop: Optional[asyncio.AbstractEventLoop] = None,
                 use_logging: bool = True) -> None:
        self.lib = _ffi.lib()
        self.has_http = self.lib.has("fq_result_http_status")
        self.has_from_cache = self.lib.has("fq_result_from_cache")
        # requests ask for "lazy_parse": json() parses the body in Python, so
        # the engine only checks it (its value is built if something reads it)
        self.has_lazy_parse = self.lib.has("fq_result_has_value")
        # ... and "marshal": the engine's thread that checks the body also
        # writes its value in marshal's format, and json() makes the objects
        # from that instead of scanning the text again (on CPython)
        self.has_marshal = self.lib.has("fq_result_marshal") and _ffi.MARSHAL_READABLE
        # responses keep the fq_result, not its parts (built only if read)
        self.has_result_retain = self.lib.has("fq_result_retain")
        # option objects reused across submits; cleared when the engine is freed
        self.json_cache = _ffi.JsonCache()
        self.mode = mode
        self.loop = loop
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.submit_lock = threading.Lock()  # submit+register of progress ops
        self.inflight = 0
        self.closing = False
        self.closed_message = "the engine is closed"
        self.handle: Any = None
        # Queues closed from a callback or body, freed later by another
        # thread: their names are taken until then (see Queue.close).
        self.freeing: Dict[str, threading.Event] = {}
        self.fd = -1
        self.pending: Dict[int, _OpState] = {}
        self.by_op: Dict[int, _OpState] = {}
        self.tokens = itertools.count(1)
        self.violations: List[str] = []      # completion-contract breaches seen
        # queues whose handles die with the engine (weak: the Engine object
        # holds them strongly, so the core never keeps the Engine alive)
        self.queues: "weakref.WeakSet[Queue]" = weakref.WeakSet()
        self.async_ops: "set[AsyncOp]" = set()   # started, not yet finished
        self.swept = False      # close() has finished the async ops it found
        # one ctypes callback of each kind per engine, alive until freed
        self.completion_cb = _ffi.COMPLETION_FN(self._on_complete)
        self.block_cb = _ffi.BLOCK_FN(self._on_block)
        self.event_cb = _ffi.EVENT_FN(self._on_event)
        self.async_cb = _ffi.ASYNC_FN(self._on_async)
        self.log_cb = _ffi.LOG_FN(self._on_log)

        cfg = _ffi.to_json(config, "config", argument=True)
        try:
            self.handle = self.lib.fq_engine_new(cfg, None, 0)
        finally:
            _ffi.decref(cfg)
        try:
            if self.lib.has("fq_engine_set_event_fn"):
                self.lib.fq_engine_set_event_fn(self.handle, self.event_cb, None)
            if use_logging and self.lib.has("fq_engine_set_log_fn"):
                self.lib.fq_engine_set_log_fn(self.handle, self.log_cb, None)
            if mode == "poll":
                self.fd = self.lib.fq_engine_event_fd(self.handle)
        except BaseException:
            self.close()                    # nobody else could free it (the tenth review)
            raise
        _live_cores.add(self)

    def forget_after_fork(self) -> None:
        """In a child after os.fork(): the engine's threads are the parent's
        and do not exist here, so nothing may call or free it (the memory is
        left as it is). Its locks may have been held by a parent thread."""
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.submit_lock = threading.Lock()
        self.handle = None
        self.closing = True
        self.closed_message = "the engine belongs to the parent process (os.fork): make a new one here"
        self.inflight = 0
        states = list(self.pending.values())
        self.pending.clear()
        self.by_op.clear()
        self.async_ops.clear()
        for q in list(self.queues):
            q._handle = None
            q._users = 0
        # Their completions would come from the parent's threads: resolved
        # here as a use of the engine is refused (the tenth review: cancel()
        # said True and result() waited for ever).
        for state in states:
            if state.future is not None:
                try:
                    state.future._fq_fail_in_child(ShutdownError(self.closed_message))
                except Exception:   # (a closed loop) nothing more to do in an at-fork handler
                    pass

    # -- guarding the handle against a concurrent close -------------------

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(handle, *args)``, counted in ``inflight`` (see the module's
        lifetime rules for why the counting is written inline)."""
        entered = False
        try:
            with self.lock:
                if self.closing or self.handle is None:
                    raise ShutdownError(self.closed_message)
                h = self.handle
                self.inflight += 1
                entered = True
            return fn(h, *args)
        finally:
            if entered:
                with self.lock:
                    self.inflight -= 1
                    if self.inflight == 0 and self.closing:
                        self.idle.notify_all()

    def call_sliced(self, fn: Callable[..., Any], timeout: Optional[float], *args: Any) -> None:
        """A blocking wait ``fn(handle, *args, timeout_ms)`` made in slices of
        at most 0.1 s, so that Ctrl-C (KeyboardInterrupt) and close() get in
        between: a wait inside C runs no Python signal handler."""
        _timeout_ms(timeout)                # a negative timeout: ValueError
        deadline = None if timeout is None else time.monotonic() + timeout
        first = True
        while True:
            left = 0.1 if deadline is None else min(0.1, max(0.0, deadline - time.monotonic()))
            try:
                fn(*args, _timeout_ms(left))
                return
            except Timeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            except (ShutdownError, StateError) as exc:
                # The engine was closed by another thread during the wait:
                # close() cancels and ends everything, so the wait is over
                # once the close is, as a single wait inside C would have
                # returned. Not a queue closed while the engine is not
                # closing: its running operations go on, so that StateError
                # is raised, as Queue.wait documents (the tenth review: the
                # wait returned while they still ran).
                if first or (isinstance(exc, StateError) and not self.closing):
                    raise
                with self.lock:
                    while self.closing and self.handle is not None:
                        if deadline is not None and time.monotonic() >= deadline:
                            raise Timeout("timed out waiting while another thread closes the engine") from None
                        self.idle.wait(0.1)
                return
            first = False

    # -- ids, futures, cancel ----------------------------------------------

    def new_future(self) -> AnyFuture:
        if self.mode == "poll":
            assert self.loop is not None
            return AsyncFuture(self, self.loop)
        return Future(self)

    def op_id_of(self, ref: OpRef) -> int:
        if isinstance(ref, (Future, AsyncFuture)):
            if ref._core is not self:
                raise InvalidArgument("that future belongs to another engine")
            return ref.op_id
        if isinstance(ref, bool) or not isinstance(ref, int):
            raise TypeError("expected a fetchq future or an operation id, got %r" % (ref,))
        return _c_int(ref, "operation id", 64)

    def request_cancel(self, fut: AnyFuture) -> bool:
        entered = False
        with self.lock:
            if fut._cancel_wanted:          # already accepted: it will end cancelled
                return True
            if fut._op_id is None:          # submit still in progress (other thread)
                fut._cancel_wanted = True
                return True
            if self.closing or self.handle is None:
                return True                 # close cancels everything still pending
            handle = self.handle
            self.inflight += 1
            entered = True
        try:
            status = self.lib.fq_cancel(handle, fut._op_id)
        finally:
            if entered:
                with self.lock:
                    self.inflight -= 1
                    if self.inflight == 0 and self.closing:
                        self.idle.notify_all()
        if status == FQ_OK:
            fut._cancel_wanted = True
            return True
        if status == FQ_ERR_NOT_FOUND:      # finished; its completion is on the way
            return fut.cancelled()
        _ffi.check(status)
        return False

    def check_loop(self, doing: str = "submit") -> None:
        """An AsyncEngine's operations are submitted on its loop, or from a
        thread running no loop: the future of one submitted while another
        loop runs could not be awaited there (its body would run, and its
        awaiting task fail). Its waits run on its loop too (awaited on
        another, asyncio.wait on its futures never returned)."""
        running = asyncio._get_running_loop()
        if running is not None and running is not self.loop:
            raise StateError(
                "this AsyncEngine belongs to the event loop %s, and this thread runs another one, %s: "
                "%s on the engine's loop (asyncio.run_coroutine_threadsafe) or make an engine "
                "on this loop" % (_loop_name(self.loop), _loop_name(running), doing))

    def submitted(self, fut: AnyFuture, op_id: int) -> None:
        with self.lock:
            fut._op_id = op_id
            wanted = fut._cancel_wanted
            fut._cancel_wanted = False
        if wanted:                          # cancel() ran while we were submitting
            self.request_cancel(fut)

    # -- callbacks (run on the delivery thread, or the dispatching thread) -

    def _on_complete(self, result: int, userdata: Optional[int]) -> None:
        cores = _tls.cores
        cores.append(self)
        try:
            state = self.pending.pop(userdata or 0, None)
            if state is None:
                self._violation("completion for unknown or already completed userdata %r (op %d)"
                                % (userdata, self.lib.fq_result_op_id(result)))
                return
            fut = state.future
            try:
                how, value = self._outcome(state, result)
            except BaseException as exc:
                # Making the Python value failed (a RecursionError for a value
                # nested deeper than this thread's stack allows, MemoryError):
                # the future raises it rather than never resolving.
                how, value = "exception", exc
            # Drop the state (its function, arguments and queue) before the
            # future's done-callbacks run, but keep the engine it held until
            # they have: one may submit follow-up work to the queue although
            # the application dropped its own reference to the engine.
            engine = state.engine
            del state
            self._resolve(fut, how, value)
            del engine
        except BaseException:  # never let an exception unwind into C
            log.exception("fetchq: error in completion callback")
        finally:
            cores.pop()

    def _outcome(self, state: _OpState, result: int) -> Tuple[str, Any]:
        """("result", value) | ("exception", exc) | ("cancelled", None)."""
        L = self.lib
        op_id = L.fq_result_op_id(result)
        outcome = L.fq_result_outcome(result)
        if state.progress is not None or state.on_child is not None or state.on_update is not None:
            with self.submit_lock:          # (state.has_events, inlined: every completion asks)
                self.by_op.pop(op_id, None)
        if outcome == FQ_SUCCEEDED:
            if state.kind == "request":
                return "result", Response._from_result(self, result, op_id, True)
            return "result", _ffi.from_json(L.fq_result_value(result))
        status = L.fq_result_status(result)
        message = _ffi.cstr(L.fq_result_error(result)) or _ffi.cstr(L.fq_strerror(status)) or ""
        if outcome == FQ_CANCELLED and status not in (FQ_ERR_DEPENDENCY, FQ_ERR_NOT_FOUND):
            return "cancelled", None
        # FQ_ERR_NOT_FOUND: a depends_on id the engine could not find (one a
        # failed submit used up, fetchq.h) ends the operation CANCELLED
        # although nobody cancelled it: NotFound with the engine's message,
        # as a failed dependency gives DependencyError (the tenth review: the
        # future was cancelled(), its CancelledError empty).
        if outcome not in (FQ_FAILED, FQ_CANCELLED):
            self._violation("op %d completed with outcome %d" % (op_id, outcome))
        exc: FetchqError
        # A response came with it only when the result has an HTTP status: a
        # search-all stopped by fail_fast has none (its child's status is in
        # the message), and gets HTTPError with status 0 and no response, as a
        # search's ParseError does (the response was a made-up one of status 0).
        if (status == FQ_ERR_HTTP or (status == FQ_ERR_PARSE and state.kind == "request")) \
                and self.has_http and L.fq_result_http_status(result) > 0:
            resp = Response._from_result(self, result, op_id, False)
            cls = HTTPError if status == FQ_ERR_HTTP else ParseError
            exc = cls(message, status, status=resp.status, body=resp.body, headers=resp.headers, response=resp)
        elif status == FQ_ERR_DEPENDENCY:
            exc = DependencyError(message, status)
        elif status == FQ_ERR_OPERATION:
            exc = OperationError(message, status)
            if state.cause is not None:
                exc.__cause__ = state.cause
        else:
            exc = error_for_status(status, message)
        exc.op_id = op_id  # type: ignore[attr-defined]
        return "exception", exc

    def _resolve(self, fut: AnyFuture, how: str, value: Any) -> None:
        if self.mode == "poll":
            loop = self.loop
            if loop is None or loop.is_closed():
                return  # freed after its loop closed (finalizer/atexit): nobody can await
            if asyncio._get_running_loop() is not loop and loop.is_running():
                # The loop runs on another thread (an AsyncEngine closed or
                # dispatched off its loop's thread): resolved there, which
                # also wakes the loop up. Not by the thread that created the
                # engine: with loop= that may be another one (the tenth
                # review: close() on it set the futures from a foreign thread,
                # and a coroutine awaiting one stayed pending). A loop that is
                # not running has no thread yet: set at once (dispatch() by
                # hand, close() before or after the loop ran).
                try:
                    loop.call_soon_threadsafe(_apply, fut, how, value)
                except RuntimeError:
                    pass
                return
        _apply(fut, how, value)

    def _on_block(self, op: int, userdata: Optional[int]) -> Optional[int]:
        state = self.pending.get(userdata or 0)
        L = self.lib
        if state is None or state.fn is None:
            self._violation("block body for unknown userdata %r" % (userdata,))
            L.fq_op_set_error(op, b"fetchq binding: unknown operation")
            return None
        ctx = Op(self, op)
        _tls.cores.append(self)
        _tls.ops.append(ctx)
        try:
            args = ((ctx,) + state.args) if state.pass_op else state.args
            value = state.fn(*args)
            ptr = _ffi.to_json(value, "the return value of %s" % getattr(state.fn, "__name__", "the body"))
            return ctypes.cast(ptr, ctypes.c_void_p).value  # NEW, stolen by the library
        except BaseException as exc:
            # Nothing may escape: ctypes would hand the library an undefined
            # pointer as the body's value.
            state.cause = exc
            try:
                L.fq_op_set_error(op, _exception_text(exc).replace("\0", "\\0").encode("utf-8", "replace"))
            except BaseException:
                log.exception("fetchq: fq_op_set_error failed")
            return None
        finally:
            ctx._op = None
            _tls.ops.pop()
            _tls.cores.pop()
            # A kept exception's traceback keeps this frame: it must not keep
            # the operation's queue and engine too.
            state = args = None  # noqa: F841

    def _on_async(self, op: int, userdata: Optional[int]) -> None:
        state = self.pending.get(userdata or 0)
        L = self.lib
        if state is None or state.fn is None:
            self._violation("async start for unknown userdata %r" % (userdata,))
            L.fq_op_finish(op, None, b"fetchq binding: unknown operation")
            return
        ctx = AsyncOp(self, op)
        with self.lock:
            self.async_ops.add(ctx)
        _tls.cores.append(self)
        _tls.ops.append(ctx)
        try:
            state.fn(ctx, *state.args)
            with self.lock:
                late = self.swept
            if late and not ctx.finished:           # started after close()'s sweep
                ctx._finish_for_close()
        except BaseException as exc:
            state.cause = exc
            try:
                ctx.finish(error=_exception_text(exc))
            except StateError:
                log.warning("fetchq: async start of op %d raised after finishing it: %s",
                            ctx.id, _exception_text(exc))
            except BaseException:
                log.exception("fetchq: finishing op %d after its start raised failed", ctx.id)
        finally:
            _tls.ops.pop()
            _tls.cores.pop()
            state = None  # noqa: F841 (as in _on_block; and see _Core.close)

    def _on_log(self, level: int, message: Optional[bytes], userdata: Optional[int]) -> None:
        # any engine thread, possibly several at once; logging is thread-safe
        try:
            engine_log.log(_LOG_LEVELS.get(level, logging.WARNING), "%s",
                           (message or b"").decode("utf-8", "replace"))
        except BaseException:
            pass

    def _on_event(self, event: int, userdata: Optional[int]) -> None:
        _tls.cores.append(self)
        try:
            L = self.lib
            op_id = L.fq_event_op_id(event)
            state = self.by_op.get(op_id)
            if state is None:
                with self.submit_lock:       # its submit may still be registering
                    state = self.by_op.get(op_id)
            if state is None:
                return
            kind = L.fq_event_get_type(event)
            if kind == FQ_EVENT_PROGRESS and state.progress is not None:
                received, expected = _ffi.progress_of(event)
                state.progress(received, expected or None)
            elif kind == FQ_EVENT_CHILD and state.on_child is not None:
                child = L.fq_event_result(event)
                if child:
                    state.on_child(_read_result(self, child, _ffi.cstr(L.fq_event_query(event))))
            elif kind == FQ_EVENT_UPDATE and state.on_update is not None:
                cached = L.fq_event_result(event)
                if cached:
                    if state.kind == "request":
                        state.on_update(Response._from_result(
                            self, cached, op_id, L.fq_result_outcome(cached) == FQ_SUCCEEDED))
                    else:
                        state.on_update(_ffi.from_json(L.fq_result_value(cached)))
        except BaseException:
            log.exception("fetchq: error in an event callback (progress/on_child/on_update)")
        finally:
            _tls.cores.pop()

    def _violation(self, what: str) -> None:
        self.violations.append(what)
        log.error("fetchq: libfetchq broke its completion contract: %s", what)

    # -- poll mode ----------------------------------------------------------

    def dispatch(self, max_count: int = 0) -> int:
        return int(self.call(self.lib.fq_engine_dispatch, _c_int(max_count, "max_count")))

    def on_readable(self) -> None:
        try:
            self.dispatch(0)
        except ShutdownError:
            pass
        except BaseException:
            log.exception("fetchq: fq_engine_dispatch failed")

    # -- closing ------------------------------------------------------------

    def in_callback(self) -> bool:
        return self in _tls.cores

    def close(self) -> None:
        if self.in_callback():
            raise StateError("an engine cannot be closed from its own callback or operation body")
        with self.lock:
            if self.handle is None:
                return
            if self.closing:                # another thread is closing it
                while self.handle is not None:
                    self.idle.wait(0.1)
                return
            self.closing = True
            handle = self.handle
        try:
            self.lib.fq_cancel_all(handle)  # lets waits in other threads return
        except FetchqError:
            pass
        with self.lock:                     # unfinished async ops would block the free
            ops = list(self.async_ops)
            self.swept = True
        for op in ops:
            op._finish_for_close()
        self.async_ops.clear()
        with self.lock:
            while self.inflight > 0:
                self.idle.wait(0.1)
        try:
            self.lib.fq_engine_free(handle)  # delivers every outstanding completion
        except StateError:
            # One of the engine's own threads (a finalizer that ran there,
            # the last reference dropped in a body): freed from another.
            threading.Thread(target=self._free_from_another_thread, args=(handle,), name="fetchq-close",
                             daemon=True).start()
            return
        self._closed()

    def _free_from_another_thread(self, handle: Any) -> None:
        try:
            self.lib.fq_engine_free(handle)
        except BaseException:
            log.exception("fetchq: freeing the engine failed")
        self._closed()

    def _closed(self) -> None:
        """After fq_engine_free: nothing of the engine is left to use."""
        with self.lock:
            self.handle = None
            self.idle.notify_all()
        for q in list(self.queues):
            q._handle = None
        self.json_cache.clear()             # no submit is in flight any more
        leftover = [s for s in self.pending.values() if not s.interrupted]
        for state in self.pending.values():
            if state.interrupted:           # its submit raised: nobody holds the future
                self._resolve(state.future, "exception", ShutdownError(self.closed_message))
        self.pending.clear()
        if leftover:
            self._violation("fq_engine_free returned with %d completion(s) never delivered"
                            % len(leftover))
            for state in leftover:
                self._resolve(state.future, "exception", ShutdownError(
                    "libfetchq freed the engine without completing this operation"))


_live_cores: "weakref.WeakSet[_Core]" = weakref.WeakSet()


def _forget_engines_in_child() -> None:
    # The module-wide locks too: a parent thread converting a lazy Response
    # or loading the library at the fork held one for ever here, so the
    # first r.json() of a new engine in the child hung (the tenth review).
    global _LAZY_LOCK
    _LAZY_LOCK = threading.RLock()
    _ffi.reset_locks_after_fork()
    for core in list(_live_cores):
        core.forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_engines_in_child)


def _finalize(core: _Core, remove_reader: Optional[Callable[[], None]]) -> None:
    """weakref.finalize target (also at interpreter exit)."""
    if remove_reader is not None:
        try:
            remove_reader()
        except Exception:
            pass
    if core.in_callback():
        # dropped from inside its own callback: free it from another thread
        threading.Thread(target=core.close, name="fetchq-close", daemon=True).start()
        return
    try:
        core.close()
    except Exception:
        log.exception("fetchq: closing a forgotten engine failed")


# --------------------------------------------------------------------------
# Queues

def _apply(fut: AnyFuture, how: str, value: Any) -> None:
    """Resolves ``fut`` as ``_Core._outcome`` said."""
    if how == "result":
        fut._fq_set_result(value)
    elif how == "exception":
        fut._fq_set_exception(value)
    else:
        fut._fq_set_cancelled()


def _options_json(core: "_Core", options: Optional[Dict[str, Any]], extra: Any) -> Tuple[Any, Any]:
    """The options as a ``json_t *`` and the reference to drop after the
    submit (see ``_ffi.JsonCache.get``). Options objects are cached per engine
    (most submits repeat the same ones); depends_on lists are per operation:
    not cached. On failure frees ``extra`` (the caller's NEW request object)."""
    try:
        return core.json_cache.get(options, "options", options is not None and "depends_on" not in options)
    except BaseException:
        _ffi.free_private(extra)
        raise


def _one_value_per_name(pairs: Any, what: str) -> Dict[str, Any]:
    """A dict of ``pairs`` (a mapping, or an iterable of (name, value)):
    a name given twice raises ValueError rather than keeping only the last
    value (the request's JSON object holds one value per name)."""
    if isinstance(pairs, Mapping) or hasattr(pairs, "keys"):
        return dict(pairs)                  # a mapping, or what dict() reads as one
    if isinstance(pairs, (str, bytes, bytearray)) or not isinstance(pairs, _AnyIterable):
        raise TypeError(f"{what} must be a mapping or an iterable of (name, value) pairs, "
                        f"not {type(pairs).__name__}")
    result: Dict[str, Any] = {}
    for pair in pairs:
        # a string of two characters would unpack as a pair ("ab": a, b)
        if isinstance(pair, (str, bytes, bytearray)) or not isinstance(pair, _AnySequence) or len(pair) != 2:
            raise TypeError(f"{what}: each item must be a (name, value) pair, not {pair!r}")
        name, value = pair
        if name in result:
            raise ValueError(f"{what}: {name!r} is given twice (one value per name: join the values "
                             f"into one, as the server expects)")
        result[name] = value
    return result


def _request_extras(req: Dict[str, Any], headers: Optional[Pairs], params: Optional[Pairs],
                    json: Any, data: Union[str, bytes, None]) -> None:
    """Adds a request's headers, query and body (from ``request``'s keyword
    arguments) to ``req``."""
    if headers is not None:
        req["headers"] = _one_value_per_name(headers, "headers")
    if params is not None:
        req["query"] = _one_value_per_name(params, "params")
    if json is not _UNSET and data is not None:
        raise TypeError("pass json= or data=, not both")
    if json is not _UNSET:
        if isinstance(json, str):
            # a str would be sent raw; send it as a JSON string value instead
            req["body"] = _json.dumps(json)
            req.setdefault("headers", {})
            if not any(k.lower() == "content-type" for k in req["headers"]):
                req["headers"]["Content-Type"] = "application/json"
        else:
            req["body"] = json
    elif data is not None:
        if isinstance(data, (bytes, bytearray, memoryview)):
            try:
                req["body"] = bytes(data).decode("utf-8")
            except UnicodeDecodeError:
                raise TypeError(
                    "data must be valid UTF-8: libfetchq takes the request body as a "
                    "JSON string, so arbitrary bytes cannot be sent yet") from None
        elif isinstance(data, str):
            req["body"] = data
        else:
            raise TypeError("data must be str or bytes, not %s" % type(data).__name__)


def _callable_or_none(fn: Any, what: str) -> Any:
    if fn is not None and not callable(fn):
        raise TypeError("%s must be callable" % what)
    return fn


def _as_list(deps: Any) -> List[Any]:
    """depends_on= takes one future/id or any iterable of them."""
    if isinstance(deps, (Future, AsyncFuture, int, str, bytes)):
        return [deps]
    try:
        return list(deps)
    except TypeError:
        return [deps]


class Queue(Generic[_F]):
    """An operation queue (``fq_queue``): ordering and max concurrency.

    Created with :meth:`Engine.queue`; owned by its engine, which frees it on
    close (or call :meth:`close` to cancel its queued operations and drop it).
    """

    def __init__(self, engine: "_EngineBase", name: str, max_concurrent: int) -> None:
        # weak: the engine holds its queues (a strong one made a cycle that
        # kept a dropped engine and its threads until the cyclic collector ran)
        self._engine_ref = weakref.ref(engine)
        self._core = engine._core
        self.name = name
        self._max = max_concurrent
        self._suspended = False
        # calls into C with this queue's handle now (under core.lock): close()
        # frees the handle only once they have returned
        self._users = 0
        raw = _ffi.encode_str(name, "queue name")
        self._handle: Any = self._core.call(self._core.lib.fq_queue_new, raw,
                                            _c_int(max_concurrent, "max_concurrent"))

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(handle, *args)``, counted as a use of the queue and of the
        engine (inline: see the module's lifetime rules)."""
        core = self._core
        entered = False
        try:
            with core.lock:
                if core.closing or core.handle is None:
                    raise ShutdownError(core.closed_message)
                h = self._handle
                if h is None:
                    raise StateError("queue %r is closed" % self.name)
                core.inflight += 1
                self._users += 1
                entered = True
            return fn(h, *args)
        finally:
            if entered:
                with core.lock:
                    core.inflight -= 1
                    self._users -= 1
                    if (core.inflight == 0 and core.closing) or (self._users == 0 and self._handle is None):
                        core.idle.notify_all()

    @property
    def engine(self) -> "Engine":
        """Its engine (an :class:`AsyncEngine` for an :class:`AsyncQueue`)."""
        engine = self._engine_ref()
        if engine is None:
            raise StateError("the engine of queue %r was freed" % self.name)
        return cast("Engine", engine)

    @property
    def max_concurrent(self) -> int:
        return self._max

    def set_max_concurrent(self, n: int) -> None:
        self._call(self._core.lib.fq_queue_set_max_concurrent, _c_int(n, "max_concurrent"))
        self._max = n

    @property
    def suspended(self) -> bool:
        return self._suspended

    def suspend(self) -> None:
        """Start nothing new; running operations go on."""
        self._call(self._core.lib.fq_queue_set_suspended, True)
        self._suspended = True

    def resume(self) -> None:
        self._call(self._core.lib.fq_queue_set_suspended, False)
        self._suspended = False

    def cancel_all(self) -> int:
        """Cancels every operation of the queue; returns how many."""
        return int(self._call(self._core.lib.fq_queue_cancel_all))

    def wait(self, timeout: Optional[float] = None) -> None:
        """Blocks until every operation of the queue finished and its future
        is resolved; raises :class:`fetchq.Timeout` when ``timeout`` (seconds)
        runs out, StateError from inside a callback or body (and when the
        queue is closed meanwhile). Ctrl-C interrupts it."""
        self._core.call_sliced(self._call, timeout, self._core.lib.fq_queue_wait)

    def close(self) -> None:
        """Frees the queue: operations not started are cancelled; running ones
        finish. The queue cannot be used afterwards; calls other threads are
        making with it return first (from one of the engine's callbacks or
        bodies, the queue is freed by another thread once they have)."""
        engine = self._engine_ref()
        if engine is not None:
            with engine._queues_lock:
                if engine._queues.get(self.name) is self:
                    del engine._queues[self.name]
        core = self._core
        entered = False
        try:
            with core.lock:
                handle, self._handle = self._handle, None
                core.queues.discard(self)
                if handle is None or core.handle is None:
                    return
                core.inflight += 1           # the free below is a call into C
                entered = True
                busy = self._users > 0
            if busy and core.in_callback():
                # waiting here could wait for a callback that this thread runs
                freed = core.freeing[self.name] = threading.Event()
                threading.Thread(target=self._free, args=(handle, True, freed), name="fetchq-queue-close",
                                 daemon=True).start()
                entered = False              # the thread ends the count
                return
            self._free(handle, counted=False)
        finally:
            if entered:
                with core.lock:
                    core.inflight -= 1
                    if core.inflight == 0 and core.closing:
                        core.idle.notify_all()

    def _free(self, handle: Any, counted: bool = True, freed: Optional[threading.Event] = None) -> None:
        """Frees ``handle`` once no other thread uses it; with ``counted``,
        then ends the engine's count of calls that ``close`` began; sets
        ``freed`` (the name is free again)."""
        core = self._core
        try:
            with core.lock:
                while self._users:
                    core.idle.wait(0.1)
            core.lib.fq_queue_free(handle)
        finally:
            if freed is not None:
                if core.freeing.get(self.name) is freed:
                    del core.freeing[self.name]
                freed.set()
            if counted:
                with core.lock:
                    core.inflight -= 1
                    if core.inflight == 0 and core.closing:
                        core.idle.notify_all()

    # -- submitting ---------------------------------------------------------

    def _options(self, options: Dict[str, Any], progress: Optional[ProgressFn]) -> Optional[Dict[str, Any]]:
        """The options as sent; ``options`` is the caller's ``**options``
        dict (ours alone), changed in place. Every submit calls it before it
        submits anything, so it also refuses one from another event loop."""
        if self._core.loop is not None:
            self._core.check_loop()
        if "depends_on" in options:
            deps = options.pop("depends_on")
            if deps is not None:
                options["depends_on"] = [self._core.op_id_of(d) for d in _as_list(deps)]
        if progress is not None:
            if not callable(progress):
                raise TypeError("progress must be a callable(received, expected)")
            options["progress"] = True
        return options or None

    def _submit(self, state: _OpState, options: Optional[Dict[str, Any]],
                call: Callable[[Any, Any, int], int], extra: Any = None) -> Any:
        """Submits with the options as JSON; ``extra`` (a NEW json_t built
        for this call alone, e.g. the request, which the call borrows) is
        freed afterwards, also on failure.

        This is every submit's path, so it inlines what ``_enter``,
        ``core.exit`` and ``core.submitted`` do (the last two under one
        lock)."""
        core = self._core
        opts, owned = _options_json(core, options, extra)
        token = next(core.tokens)
        fut = core.new_future()
        state.future = fut
        pending = core.pending
        pending[token] = state
        lock = core.lock
        entered = called = False
        op_id = None
        wanted = False
        try:
            try:
                with lock:                  # counted inline: see the module's lifetime rules
                    if core.closing or core.handle is None:
                        raise ShutdownError(core.closed_message)
                    h = self._handle
                    if h is None:
                        raise StateError("queue %r is closed" % self.name)
                    core.inflight += 1
                    self._users += 1
                    entered = True
                if state.progress is None and state.on_child is None and state.on_update is None:
                    called = True
                    op_id = call(h, opts, token)
                else:                       # events are routed by op id (see by_op)
                    with core.submit_lock:
                        called = True
                        op_id = call(h, opts, token)
                        core.by_op[op_id] = state
            finally:
                if entered:                 # and, submitted, what core.submitted does
                    with lock:
                        core.inflight -= 1
                        self._users -= 1
                        if op_id is not None:
                            fut._op_id = op_id
                            wanted = fut._cancel_wanted
                            fut._cancel_wanted = False
                        if (core.inflight == 0 and core.closing) or (self._users == 0 and self._handle is None):
                            core.idle.notify_all()
        except FetchqError:
            pending.pop(token, None)        # refused (by us or the library): no callback comes
            raise
        except BaseException:
            if called:
                # Interrupted (Ctrl-C) in or after the library's submit: it
                # may have taken the operation, whose completion still comes
                # for this token (or close resolves it); nobody holds the future.
                state.interrupted = True
            else:
                pending.pop(token, None)
            raise
        finally:
            # both are ours alone: the library copies what it keeps
            _ffi.free_private(owned)
            _ffi.free_private(extra)
        if wanted:                          # cancel() ran while we were submitting
            core.request_cancel(fut)
        return fut

    def submit(self, fn: Callable[..., Any], *args: Any, pass_op: bool = False,
               **options: Any) -> _F:
        """Runs ``fn(*args)`` on a worker thread as a block operation.

        With ``pass_op=True`` it is called as ``fn(op, *args)`` (an
        :class:`Op`); :func:`current_op` works either way. The return value is
        converted to JSON (the future's result is that JSON read back); an
        exception fails the operation and the future raises
        :class:`OperationError` with the message (``__cause__`` = the
        exception). ``options``: priority, qos, group, depends_on (futures or
        ids), barrier, max_wait_ms."""
        if not callable(fn):
            raise TypeError("fn must be callable")
        state = _OpState("block", self, fn=fn, args=args, pass_op=pass_op)
        L = self._core.lib
        cb_done, cb_body = self._core.completion_cb, self._core.block_cb
        return self._submit(state, self._options(options, None),
                            lambda h, o, t: L.fq_submit_block(h, cb_body, o, cb_done, t))

    def submit_async(self, start: Callable[..., Any], *args: Any, **options: Any) -> _F:
        """An asynchronous operation: ``start(op, *args)`` runs on a worker
        thread and should return quickly; the operation stays running (holding
        its queue slot) until ``op.finish(value)`` or ``op.finish(error=msg)``
        is called, exactly once, from any thread (:class:`AsyncOp`). If
        ``start`` raises before finishing, the operation fails with that
        exception. Same options as :meth:`submit`."""
        if not callable(start):
            raise TypeError("start must be callable")
        state = _OpState("block", self, fn=start, args=args)
        L = self._core.lib
        cb_done, cb_start = self._core.completion_cb, self._core.async_cb
        return self._submit(state, self._options(options, None),
                            lambda h, o, t: L.fq_submit_async(h, cb_start, o, cb_done, t))

    def search(self, query: str, *, progress: Optional[ProgressFn] = None,
               on_update: Optional[Callable[[Any], Any]] = None,
               **options: Any) -> "Future[Dict[str, Any]]":
        """Submits a search; the result is ``{"query", "items", "count"}``.
        ``options`` may override the engine's "search" keys (url, results, id,
        sort, order) and take every network and common option (store, cache,
        retry, ...). With ``cache="stale-while-revalidate"``, ``on_update``
        gets the cached value first. ``progress(received, expected_or_None)``:
        as for :meth:`request`, for the search's response body."""
        raw = _ffi.encode_str(query, "query")
        state = _OpState("search", self, progress=progress)
        state.on_update = _callable_or_none(on_update, "on_update")
        L = self._core.lib
        cb_done = self._core.completion_cb
        return self._submit(state, self._options(options, progress),
                            lambda h, o, t: L.fq_submit_search(h, raw, o, cb_done, t))

    def search_all(self, queries: Iterable[str], *,
                   on_child: Optional[Callable[[Result], Any]] = None,
                   **options: Any) -> "Future[Dict[str, Any]]":
        """Fans out one search per distinct query (each a normal operation of
        this queue) and resolves once with ``{"items", "count", "queries":
        {q: {"count"} | {"error", "status"[, "http_status"]}}}``: items merged
        in query order, de-duplicated by id and sorted. ``on_child(result)``
        (a :class:`Result` with ``.query``) is called as each child ends,
        before the future resolves. Options: those of :meth:`search` plus
        ``fail_fast``. Cancelling the future cancels the children."""
        if isinstance(queries, (str, bytes)):
            raise TypeError("queries must be an iterable of str, not a single string")
        raw = [_ffi.encode_str(q, "query") for q in queries]
        if not raw:
            raise InvalidArgument("search_all needs at least one query")
        array = (ctypes.c_char_p * max(1, len(raw)))(*raw)
        n = len(raw)
        if on_child is not None:
            if not callable(on_child):
                raise TypeError("on_child must be a callable(result)")
            options["child_events"] = True
        state = _OpState("search_all", self, on_child=on_child)
        L = self._core.lib
        cb_done = self._core.completion_cb
        return self._submit(state, self._options(options, None),
                            lambda h, o, t: L.fq_submit_search_all(h, array, n, o, cb_done, t))

    def request(self, method: str, url: str, *, headers: Optional[Pairs] = None,
                params: Optional[Pairs] = None, json: Any = _UNSET,
                data: Union[str, bytes, None] = None,
                progress: Optional[ProgressFn] = None,
                on_update: Optional[Callable[[Any], Any]] = None,
                **options: Any) -> "Future[Response]":
        """Submits an HTTP request; the result is a :class:`Response`.

        ``params`` are URL-encoded into the query string; ``json`` is sent as
        a JSON body (Content-Type: application/json); ``data`` (str or UTF-8
        bytes) is sent as is. Non-UTF-8 bytes raise TypeError: the C request
        carries the body as a JSON string. ``options``: parse ("auto", "json",
        "none"), lazy_parse (default True here: the engine checks the body but
        builds its own value only if a dependent reads it), marshal (default
        True here on CPython: the engine's thread that checks the body also
        writes its value in marshal's format, and ``json()`` makes the objects
        from that instead of parsing the body on the calling thread; False:
        ``json()`` parses the body), accept_status, timeout_ms, retry,
        coalesce, cache, ... and
        every common option. With ``cache="stale-while-revalidate"``,
        ``on_update(response)`` gets the cached :class:`Response` (its
        ``from_cache`` is True) before the future resolves with the fresh one.
        ``progress(received, expected_or_None)`` is called as the body arrives
        (docs/python.md, "Progress"): bytes of the body as ``response.body``
        has it, ``expected`` None when the server did not say or the body is
        gzip; a retry counts from 0 again; the last call has the body's size."""
        if not isinstance(method, str) or not isinstance(url, str):
            raise TypeError("method and url must be str")
        req: Dict[str, Any] = {"method": method, "url": url}
        _request_extras(req, headers, params, json, data)
        on_update = _callable_or_none(on_update, "on_update")
        # {"method", "url"} alone (the common GET): a reused object with the
        # new URL, else one json_pack call
        plain = _ffi.plain_request(method, url) if len(req) == 2 else None
        if plain is not None:
            request = plain.ptr
        else:
            request = _ffi.request_json(method, url) if len(req) == 2 else None
            if request is None:
                request = _ffi.to_json(req, "request")
        state = _OpState("request", self, progress=progress, on_update=on_update)
        core = self._core
        L = core.lib
        cb_done = core.completion_cb
        if core.has_lazy_parse and "lazy_parse" not in options:
            options["lazy_parse"] = True
        if core.has_marshal and "marshal" not in options:
            options["marshal"] = True
        try:
            opts = self._options(options, progress)
        except BaseException:
            if plain is None:
                _ffi.free_private(request)
            else:
                _ffi.give_back(plain)
            raise
        if plain is None:
            return self._submit(state, opts,
                                lambda h, o, t: L.fq_submit_request(h, request, o, cb_done, t),
                                extra=request)
        try:
            return self._submit(state, opts,
                                lambda h, o, t: L.fq_submit_request(h, request, o, cb_done, t))
        finally:
            _ffi.give_back(plain)

    def get(self, url: str, **kwargs: Any) -> "Future[Response]":
        """``request("GET", url, **kwargs)``."""
        return self.request("GET", url, **kwargs)

    def request_many(self, method: str, urls: Iterable[str], *, headers: Optional[Pairs] = None,
                     params: Optional[Pairs] = None, json: Any = _UNSET,
                     data: Union[str, bytes, None] = None,
                     **options: Any) -> "List[Future[Response]]":
        """Submits one request per URL, all with the same method, headers,
        params, body and options, in one call into the library
        (``fq_submit_requests``): the options are read once and the engine's
        lock is taken once per 64 requests. Returns the futures in the order
        of ``urls``, each resolving as :meth:`request`'s does. Every URL is
        checked before any request is submitted: a bad one raises (the
        message names ``urls[i]``) and none is submitted. If the engine or the
        queue is closed while the batch is being submitted (or, with
        ``depends_on``, a dependency leaves the engine's history meanwhile),
        the requests that could not be submitted get futures that have
        already failed with that error. ``progress`` and ``on_update`` are not taken here: use
        :meth:`request`."""
        if not isinstance(method, str):
            raise TypeError("method must be str")
        if isinstance(urls, (str, bytes)):
            raise TypeError("urls must be an iterable of str, not a single string")
        for name in ("progress", "on_update"):
            if name in options:
                raise TypeError("request_many does not take %s: use request()" % name)
        core = self._core
        L = core.lib
        if not L.has("fq_submit_requests"):
            return [self.request(method, url, headers=headers, params=params, json=json, data=data, **options)
                    for url in urls]
        raw = [_ffi.encode_str(u, "url") for u in urls]
        n = len(raw)
        req: Dict[str, Any] = {"method": method}
        _request_extras(req, headers, params, json, data)
        if n == 0:
            return []
        if core.has_lazy_parse and "lazy_parse" not in options:
            options["lazy_parse"] = True
        if core.has_marshal and "marshal" not in options:
            options["marshal"] = True
        opts_dict = self._options(options, None)
        template = _ffi.to_json(req, "request")
        opts, owned = _options_json(core, opts_dict, template)
        url_array = (ctypes.c_char_p * n)(*raw)
        tokens = [next(core.tokens) for _ in range(n)]
        userdata = (ctypes.c_void_p * n)(*tokens)
        ids = (ctypes.c_int64 * n)()
        futures: List[Any] = []
        pending = core.pending
        for token in tokens:
            state = _OpState("request", self)
            fut = core.new_future()
            state.future = fut
            pending[token] = state
            futures.append(fut)
        stopped: Optional[BaseException] = None
        try:
            count = self._call(L.fq_submit_requests, template, url_array, n, opts, core.completion_cb,
                               userdata, ids)
            _ffi.check(count)                   # nothing submitted: raise (the message is read at once)
            if count < n:                       # stopped part way: read the reason at once
                message = _ffi.last_error_message() or "the queue stopped taking requests"
                stopped = (ShutdownError if core.closing else StateError)(message)
        except FetchqError:                 # nothing was submitted: no callback comes
            for token in tokens:
                pending.pop(token, None)
            raise
        except BaseException:               # interrupted (Ctrl-C): the library may have them
            for token in tokens:
                state = pending.get(token)      # (those that completed already are gone)
                if state is not None:
                    state.interrupted = True
            raise
        finally:
            _ffi.free_private(owned)
            _ffi.free_private(template)
        # Nobody else holds these futures yet, so no cancel() can have run.
        for i in range(count):
            futures[i]._op_id = ids[i]
        if stopped is not None:
            for i in range(count, n):
                pending.pop(tokens[i], None)
                core._resolve(futures[i], "exception", stopped)
        return futures

    def get_many(self, urls: Iterable[str], **kwargs: Any) -> "List[Future[Response]]":
        """``request_many("GET", urls, **kwargs)``."""
        return self.request_many("GET", urls, **kwargs)

    def __repr__(self) -> str:
        return "<fetchq.%s %r max_concurrent=%d%s>" % (
            type(self).__name__, self.name, self._max, " closed" if self._handle is None else "")


class AsyncQueue(Queue["AsyncFuture[Any]"]):
    """A queue of an :class:`AsyncEngine`: ``search``/``request``/``submit``
    return :class:`AsyncFuture` objects (awaitable), ``asearch``/``arequest``/
    ``asubmit`` are coroutines, and ``wait`` is a coroutine."""

    if TYPE_CHECKING:
        # The same methods as Queue's, returning AsyncFutures (for type
        # checkers only: nothing changes at run time).
        @property
        def engine(self) -> "AsyncEngine": ...  # type: ignore[override]

        def search(self, query: str, *, progress: Optional[ProgressFn] = None,  # type: ignore[override]
                   on_update: Optional[Callable[[Any], Any]] = None,
                   **options: Any) -> "AsyncFuture[Dict[str, Any]]": ...

        def search_all(self, queries: Iterable[str], *,  # type: ignore[override]
                       on_child: Optional[Callable[[Result], Any]] = None,
                       **options: Any) -> "AsyncFuture[Dict[str, Any]]": ...

        def request(self, method: str, url: str, *,  # type: ignore[override]
                    headers: Optional[Pairs] = None, params: Optional[Pairs] = None, json: Any = _UNSET,
                    data: Union[str, bytes, None] = None,
                    progress: Optional[ProgressFn] = None,
                    on_update: Optional[Callable[[Any], Any]] = None,
                    **options: Any) -> "AsyncFuture[Response]": ...

        def get(self, url: str, **kwargs: Any) -> "AsyncFuture[Response]": ...  # type: ignore[override]

        def request_many(self, method: str, urls: Iterable[str], *,  # type: ignore[override]
                         headers: Optional[Pairs] = None, params: Optional[Pairs] = None, json: Any = _UNSET,
                         data: Union[str, bytes, None] = None,
                         **options: Any) -> "List[AsyncFuture[Response]]": ...

        def get_many(self, urls: Iterable[str],  # type: ignore[override]
                     **kwargs: Any) -> "List[AsyncFuture[Response]]": ...

    async def asearch(self, query: str, **options: Any) -> Dict[str, Any]:
        return await self.search(query, **options)

    async def asearch_all(self, queries: Iterable[str], **options: Any) -> Dict[str, Any]:
        return await self.search_all(queries, **options)

    async def arequest(self, method: str, url: str, **kwargs: Any) -> Response:
        return await self.request(method, url, **kwargs)

    async def asubmit(self, fn: Callable[..., Any], *args: Any, **options: Any) -> Any:
        return await self.submit(fn, *args, **options)

    async def wait(self, timeout: Optional[float] = None) -> None:  # type: ignore[override]
        """Waits until every operation of this queue is resolved (on the loop,
        without blocking it); raises :class:`fetchq.Timeout`, and as
        :meth:`Queue.wait` does ShutdownError once the engine is closed and
        StateError once the queue is."""
        core = self._core
        if core.closing or core.handle is None:
            raise ShutdownError(core.closed_message)
        if self._handle is None:
            raise StateError("queue %r is closed" % self.name)
        await _await_pending(core, lambda s: s.queue is self, timeout)


async def _await_pending(core: _Core, which: Callable[[_OpState], bool],
                         timeout: Optional[float], started_async_too: bool = True) -> None:
    """Waits for the pending futures ``which`` selects; without
    ``started_async_too``, not for those of async operations already
    started and not finished (looked at again each time around)."""
    core.check_loop("wait")
    _timeout_ms(timeout)                    # a negative timeout: ValueError, as the sync waits
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        skipped: "set[int]" = set()
        if not started_async_too:
            with core.lock:
                skipped = {op.id for op in core.async_ops}
        # (not those whose submit was interrupted: nobody holds their future,
        # and the library may never have taken them)
        futs = [s.future for s in list(core.pending.values())
                if which(s) and not s.interrupted and s.future._op_id not in skipped]
        if not futs:
            return
        remaining = None if deadline is None else max(0.0, deadline - loop.time())
        done, not_done = await asyncio.wait(futs, timeout=remaining)
        if not_done:
            raise Timeout("%d operation(s) still unfinished" % len(not_done))


# --------------------------------------------------------------------------
# Engines

class _EngineBase:
    _core: _Core
    _queues: Dict[str, Queue]
    _queue_class: type = Queue
    # Finding or creating a queue by name, and forgetting a closed one: two
    # threads asking for the same new name get the same queue.
    _queues_lock: threading.Lock

    def queue(self, name: str, max_concurrent: Optional[int] = None) -> "Queue[Any]":
        """The queue named ``name``, created on first use with
        ``max_concurrent`` (default 4); for an existing queue a different
        ``max_concurrent`` is applied."""
        freeing = self._core.freeing.get(name)
        if freeing is not None:
            # Closed from a callback or body and not yet freed by the thread
            # that does it (within a wait's slice, 0.1 s, of its users).
            freeing.wait(5.0)
        with self._queues_lock:
            existing = self._queues.get(name)
            if existing is not None and self._core.handle is None:
                # as for a new name (the queue's own creation says it): the
                # engine's queues went with it
                raise ShutdownError(self._core.closed_message)
            if existing is None:
                q = self._queue_class(self, name, 4 if max_concurrent is None else max_concurrent)
                self._queues[name] = q
                self._core.queues.add(q)
                return q
        if max_concurrent is not None and max_concurrent != existing.max_concurrent:
            existing.set_max_concurrent(max_concurrent)
        return existing

    @property
    def closed(self) -> bool:
        return self._core.handle is None

    def cancel(self, op: OpRef) -> bool:
        """Cancels one operation (a future or an id); False if it already
        finished. A future of another engine raises InvalidArgument, as
        every method taking a future does."""
        if isinstance(op, (Future, AsyncFuture)):
            if op._core is not self._core:  # (it cancelled it: the tenth review)
                raise InvalidArgument("that future belongs to another engine")
            return op.cancel()
        status = self._core.call(self._core.lib.fq_cancel, self._core.op_id_of(op))
        if status == FQ_ERR_NOT_FOUND:
            return False
        _ffi.check(status)
        return True

    def state(self, op: OpRef) -> str:
        """Where an operation stands now (fq_state): "waiting" (for a
        dependency or a barrier), "ready" (for a place, its queue's resume,
        a retry's time or a shared transfer), "running", or how it ended:
        "succeeded", "failed", "cancelled" (its future may not be resolved
        yet). Raises NotFound for an id the engine never gave out or no
        longer remembers (config "history")."""
        status = self._core.call(self._core.lib.fq_state, self._core.op_id_of(op))
        if status > 0:
            return _STATES[status]
        _ffi.check(status)
        raise AssertionError("fq_state returned %d" % status)  # pragma: no cover

    def cancel_group(self, group: str) -> int:
        """Cancels every unfinished operation submitted with ``group=``."""
        return int(self._core.call(self._core.lib.fq_cancel_group,
                                   _ffi.encode_str(group, "group")))

    def cancel_all(self) -> int:
        return int(self._core.call(self._core.lib.fq_cancel_all))

    def set_priority(self, op: OpRef, priority: Union[int, str]) -> None:
        """Changes the priority of an operation that has not started."""
        if isinstance(priority, str):
            if priority not in _PRIORITIES:
                raise InvalidArgument("unknown priority %r" % priority)
            priority = _PRIORITIES[priority]
        self._core.call(self._core.lib.fq_set_priority, self._core.op_id_of(op),
                        _c_int(priority, "priority"))

    def add_dependency(self, op: OpRef, dep: OpRef) -> None:
        """Makes ``op`` (not started yet) also wait for ``dep``."""
        self._core.call(self._core.lib.fq_add_dependency,
                        self._core.op_id_of(op), self._core.op_id_of(dep))

    def remove_dependency(self, op: OpRef, dep: OpRef) -> None:
        """Makes ``op`` (not started yet) no longer wait for ``dep``
        (fq_remove_dependency): ``NotFound`` for an unknown id or when it does
        not depend on ``dep``; ``StateError`` once it started, for a
        barrier's wait or a wait only through others, for a search-all's own
        queries, and for a GET that shares another's transfer (``coalesce``)."""
        self._core.call(self._core.lib.fq_remove_dependency,
                        self._core.op_id_of(op), self._core.op_id_of(dep))

    def stats(self) -> Dict[str, Any]:
        """The engine's counters (see fq_engine_stats)."""
        ptr = self._core.call(self._core.lib.fq_engine_stats)
        try:
            return _ffi.from_json(ptr) or {}
        finally:
            _ffi.decref(ptr)  # NEW reference

    @property
    def pending_count(self) -> int:
        """Operations whose future is not resolved yet."""
        return len(self._core.pending)


class Engine(_EngineBase):
    """An engine with thread delivery: futures are
    ``concurrent.futures.Future`` subclasses resolved on the engine's delivery
    thread (their done-callbacks run there; they may submit more work).

    ``Engine(**config)`` takes the keys of ``fq_engine_new`` (workers,
    transfer_threads, aging_ms, history, history_values, max_per_host, connect_timeout_ms,
    timeout_ms, max_wait_ms, max_redirects, max_response_bytes,
    max_json_depth, verify_tls, ca_file, user_agent, proxy, rate_limits, cache, log,
    search={url, results, id, sort, order}). The library's log lines go to the ``logging``
    logger "fetchq.engine" (``use_logging=False``: standard error, the C
    default). Use it as a context manager, or call :meth:`close`.
    """

    _queue_class = Queue

    def __init__(self, *, use_logging: bool = True, **config: Any) -> None:
        delivery = config.pop("delivery", "thread")
        if delivery != "thread":
            raise InvalidArgument("Engine uses thread delivery; use AsyncEngine for poll/asyncio")
        config["delivery"] = "thread"
        self._queues = {}
        self._queues_lock = threading.Lock()
        self._core = _Core(config, "thread", use_logging=use_logging)
        self._finalizer = weakref.finalize(self, _finalize, self._core, None)

    def queue(self, name: str, max_concurrent: Optional[int] = None) -> "Queue[Future[Any]]":
        return super().queue(name, max_concurrent)

    def close(self) -> None:
        """Cancels pending work, waits for running operations, resolves every
        future (cancelled) and frees the engine. Idempotent. StateError from
        inside one of its callbacks or bodies."""
        self._core.close()
        self._finalizer.detach()

    def wait_idle(self, timeout: Optional[float] = None) -> None:
        """Blocks until every operation finished and its future is resolved;
        raises :class:`fetchq.Timeout`. Ctrl-C interrupts it."""
        core = self._core
        core.call_sliced(core.call, timeout, core.lib.fq_engine_wait_idle)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "<fetchq.Engine %s>" % ("closed" if self.closed else "open")


class AsyncEngine(_EngineBase):
    """An engine for asyncio (config "delivery": "poll").

    Create it inside a running loop (or pass ``loop=``); its event fd is
    watched with ``loop.add_reader`` and completions are dispatched on the
    loop's thread. Queues are :class:`AsyncQueue`. Use ``async with``, or
    ``await aclose()`` / ``close()``.

    ``transfer_threads`` defaults to 1 here (the library's default is 2):
    the loop's thread does every response's Python work and sets the pace,
    one transfer thread keeps up with it, and a second one only competes
    with it for the engine's lock and the CPU (P4, 20 000 GETs: 19.5-25.0 k
    against 23.1-25.6 k req/s; bench/findings.md, "Seventh round").
    """

    _queue_class = AsyncQueue

    def __init__(self, *, loop: Optional[asyncio.AbstractEventLoop] = None,
                 use_logging: bool = True, **config: Any) -> None:
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise StateError("create an AsyncEngine inside a running event loop "
                                 "(or pass loop=)") from None
        delivery = config.pop("delivery", "poll")
        if delivery != "poll":
            raise InvalidArgument("AsyncEngine uses poll delivery; use Engine for threads")
        config["delivery"] = "poll"
        config.setdefault("transfer_threads", 1)
        self._loop = loop
        self._queues = {}
        self._queues_lock = threading.Lock()
        self._core = _Core(config, "poll", loop, use_logging=use_logging)
        fd = self._core.fd
        try:
            loop.add_reader(fd, self._core.on_readable)
        except BaseException:
            # (a closed loop, a loop without add_reader): nothing would ever
            # free the engine just made, nor end its threads (the tenth review)
            self._core.close()
            raise

        removed = [False]

        def remove_reader() -> None:
            # once only: after the free, fd may be another engine's event fd
            if not removed[0]:
                removed[0] = True
                if not loop.is_closed():
                    loop.remove_reader(fd)

        self._remove_reader = remove_reader
        self._finalizer = weakref.finalize(self, _finalize, self._core, remove_reader)

    @property
    def event_fd(self) -> int:
        """The descriptor the loop watches; ShutdownError once the engine is
        closed (the number may belong to another file by then)."""
        core = self._core
        if core.handle is None:
            raise ShutdownError(core.closed_message)
        return core.fd

    def dispatch(self, max_count: int = 0) -> int:
        """Runs waiting completions now (the loop's reader does this)."""
        return self._core.dispatch(max_count)

    def close(self) -> None:
        """Frees the engine now; pending futures are resolved (cancelled)
        before it returns. Called on another thread while the loop runs,
        it hands their resolution to the loop's thread
        (``call_soon_threadsafe``) before it returns: they are resolved
        there, and a coroutine awaiting one resumes. Blocks the loop while
        running operations end; prefer ``await aclose()``."""
        if self._core.in_callback():         # before the reader goes: it stays the loop's
            raise StateError("an engine cannot be closed from its own callback or operation body")
        self._remove_reader()
        self._core.close()
        self._finalizer.detach()

    async def aclose(self, timeout: Optional[float] = 30.0) -> None:
        """Cancels everything, lets the completions arrive through the loop,
        then frees the engine."""
        if not self.closed:
            self._core.check_loop("close")   # (its reader is the loop's to remove)
        try:
            if not self.closed:
                self.cancel_all()
                # Not for async operations already started: cancelled now,
                # they end when their code finishes them, or at close(),
                # cancelled either way (as Engine.close() does). Waiting for
                # them would wait out the timeout for a finish nobody may call.
                await _await_pending(self._core, lambda s: True, timeout, started_async_too=False)
        except Timeout:
            pass
        finally:
            self.close()                    # also when the awaiting task was cancelled

    def queue(self, name: str, max_concurrent: Optional[int] = None) -> AsyncQueue:
        q = super().queue(name, max_concurrent)
        assert isinstance(q, AsyncQueue)
        return q

    async def wait_idle(self, timeout: Optional[float] = None) -> None:
        """Waits (on the loop) until every future is resolved; raises
        :class:`fetchq.Timeout`, and ShutdownError once the engine is closed
        (as :meth:`Engine.wait_idle` does)."""
        core = self._core
        if core.closing or core.handle is None:
            raise ShutdownError(core.closed_message)
        await _await_pending(core, lambda s: True, timeout)

    async def __aenter__(self) -> "AsyncEngine":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return "<fetchq.AsyncEngine %s>" % ("closed" if self.closed else "open")


def _c_int(value: Any, what: str, bits: int = 32) -> int:
    """``value`` checked for a C integer argument of ``bits`` bits: ctypes
    would silently wrap an int out of range (2**32 + 1 becoming 1) and
    raise its own ArgumentError for another type."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("%s must be an int, not %s" % (what, type(value).__name__))
    limit = 1 << (bits - 1)
    if not -limit <= value < limit:
        raise InvalidArgument("%s %d is out of range (a %d-bit integer)" % (what, value, bits))
    return value


def _loop_name(loop: Optional[asyncio.AbstractEventLoop]) -> str:
    return "<%s at %#x>" % (type(loop).__name__, id(loop))


def _exception_text(exc: BaseException) -> str:
    """``"Type: message"`` for an exception raised by user code, for the
    library's error text. Never raises: an exception whose ``__str__`` fails
    is named by its type."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except BaseException as failure:  # noqa: BLE001 - a broken __str__ must not unwind into C
        return "%s (str() of it raised %s)" % (name, type(failure).__name__)
    return "%s: %s" % (name, text) if text else name


def version() -> str:
    """The loaded library's version string (fq_version_string)."""
    return (_ffi.lib().fq_version_string() or b"").decode()


def library_path() -> str:
    """The path of the loaded libfetchq."""
    return _ffi.lib().path


__all__ = [
    "Engine", "AsyncEngine", "Queue", "AsyncQueue", "Future", "AsyncFuture",
    "Response", "Result", "Op", "AsyncOp", "current_op", "version", "library_path",
]
