"""The ctypes layer: finding libfetchq, one declaration table for every C
function of ``include/fetchq.h``, the callback types, and the jansson bridge.

Nothing here knows about futures or engines; ``_engine.py`` builds on it.

Loading order (the first that loads wins; every failure is remembered so the
final error lists each path tried and why it failed):

1. ``$FETCHQ_LIBRARY`` (a path to libfetchq.so*), if set;
2. a copy inside this package (``fetchq/libfetchq.so*``, put there by
   ``make`` — the build copies ``build/lib/libfetchq.so.0``);
3. the system loader: ``ctypes.util.find_library("fetchq")`` and then
   ``libfetchq.so.0`` (``LD_LIBRARY_PATH``, ``ldconfig`` cache, rpath).

JSON. The C ABI passes ``json_t *`` (jansson). This module resolves jansson's
functions through the libfetchq handle itself (``dlsym`` on a library handle
searches that library's dependencies), so it uses exactly the libjansson that
libfetchq is linked with; it falls back to loading ``libjansson.so.4``.

Reference counting. ``json_incref``/``json_decref`` are ``static inline`` in
``jansson.h`` (atomic operations on ``json_t.refcount``), so libjansson.so.4
does not export them; it exports ``json_delete``, which frees unconditionally.
Calling ``json_delete`` on a value someone else may still reference would be a
use-after-free, so the binding never calls it on a foreign value. Instead:

* Values the library hands us (callback results, dependency results) are
  BORROWED. To keep one past the callback, :func:`hold` puts a NEW reference
  to it into a fresh private array with ``json_pack("[O...]")`` — jansson's
  own ``json_incref`` does the counting, atomically — and :func:`release`
  ``json_delete``s that array (the same argument as below). Converting to a
  Python value (``json_dumps`` + ``json.loads``) only reads.
* To drop a reference we own (a config/options/request object we built, or
  the NEW reference from ``fq_engine_stats``) we move it into a fresh array
  with ``json_array_append_new`` (which steals it) and ``json_delete`` that
  array. The array was created by us and never shared, so deleting it is
  exactly ``json_decref`` of the array, and jansson's own array destructor then
  performs a real, atomic ``json_decref`` on the element — correct whatever
  the element's refcount is (shared, or one of the immortal singletons).
* Block bodies return a NEW reference that the library STEALS: nothing to do.

The string from ``json_dumps`` is released with the free function jansson
reports through ``json_get_alloc_funcs`` (the allocator it actually used).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import json as _json
import marshal as _marshal
import math
import os
import sys
import threading
from ctypes import (
    CFUNCTYPE, POINTER, Structure, byref, c_bool, c_char, c_char_p, c_int,
    c_int64, c_long, c_size_t, c_uint32, c_uint64, c_void_p,
)
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .errors import (
    InvalidArgument, LibraryNotFound, UnsupportedError, _InvalidArgumentType, error_for_status,
)

# --------------------------------------------------------------------------
# Constants mirrored from fetchq.h and jansson.h

BINDING_VERSION_MAJOR = 0  # the FQ_VERSION_MAJOR this binding was written for

FQ_OK = 0
FQ_ERR_INVALID = -1
FQ_ERR_NOT_FOUND = -2
FQ_ERR_STATE = -3
FQ_ERR_SHUTDOWN = -5
FQ_ERR_CANCELLED = -7
FQ_ERR_DEPENDENCY = -8
FQ_ERR_OPERATION = -9
FQ_ERR_HTTP = -11
FQ_ERR_PARSE = -14

FQ_SUCCEEDED = 1
FQ_FAILED = 2
FQ_CANCELLED = 3

FQ_EVENT_PROGRESS = 1
FQ_EVENT_CHILD = 2
FQ_EVENT_UPDATE = 3

JSON_DECODE_ANY = 0x4
JSON_ALLOW_NUL = 0x10
JSON_COMPACT = 0x20
JSON_ENCODE_ANY = 0x200

_LOAD_FLAGS = JSON_DECODE_ANY | JSON_ALLOW_NUL
_DUMP_FLAGS = JSON_ENCODE_ANY | JSON_COMPACT


# --------------------------------------------------------------------------
# Typed opaque handles (a wrong handle type is a ctypes ArgumentError)

class _FqEngine(Structure):
    pass


class _FqQueue(Structure):
    pass


class _FqStore(Structure):
    pass


class JsonT(Structure):
    """``json_t``'s public layout (jansson.h); only used as a pointer type."""

    _fields_ = [("type", c_int), ("refcount", c_size_t)]


EngineP = POINTER(_FqEngine)
QueueP = POINTER(_FqQueue)
StoreP = POINTER(_FqStore)
JsonP = POINTER(JsonT)

# fq_op / fq_result / fq_event only exist during a callback: passed as raw
# addresses (c_void_p) for speed.

COMPLETION_FN = CFUNCTYPE(None, c_void_p, c_void_p)      # (const fq_result *, void *)
BLOCK_FN = CFUNCTYPE(c_void_p, c_void_p, c_void_p)       # json_t *(fq_op *, void *)
ASYNC_FN = CFUNCTYPE(None, c_void_p, c_void_p)           # (fq_op *, void *)
EVENT_FN = CFUNCTYPE(None, c_void_p, c_void_p)           # (const fq_event *, void *)
LOG_FN = CFUNCTYPE(None, c_int, c_char_p, c_void_p)      # (int level, const char *, void *)


class JsonError(Structure):
    """``json_error_t``."""

    _fields_ = [
        ("line", c_int),
        ("column", c_int),
        ("position", c_int),
        ("source", c_char * 80),
        ("text", c_char * 160),
    ]


# --------------------------------------------------------------------------
# errcheck functions: status codes -> exceptions

def _message() -> str:
    """fq_last_error() of this thread (read right after the failing call)."""
    raw = _LIB_STATE.last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def _check_status(result: int, func: Any, args: Tuple[Any, ...]) -> int:
    if result < 0:
        raise error_for_status(result, _message() or _strerror(result))
    return result


def _check_handle(result: Any, func: Any, args: Tuple[Any, ...]) -> Any:
    if not result:
        # NULL: fq_last_status() says why (FQ_ERR_INVALID for what was
        # passed, FQ_ERR_NOMEM for a refused thread, FQ_ERR_STORE for a file).
        status = _LIB_STATE.last_status()
        message = _message() or "%s failed" % func.__name__
        if status >= 0:
            raise InvalidArgument(message)
        raise error_for_status(status, message)
    return result


def last_error_message() -> str:
    """fq_last_error() of this thread, decoded."""
    return _message()


def _strerror(status: int) -> str:
    raw = _LIB_STATE.strerror(status)
    return raw.decode("utf-8", "replace") if raw else "status %d" % status


# --------------------------------------------------------------------------
# THE declaration table: (name, restype, argtypes, errcheck).
# Keep in the order of include/fetchq.h.

_Decl = Tuple[str, Any, List[Any], Optional[Callable[..., Any]]]

FUNCTIONS: List[_Decl] = [
    # Version / status
    ("fq_version", c_uint32, [], None),
    ("fq_version_string", c_char_p, [], None),
    ("fq_strerror", c_char_p, [c_int], None),
    ("fq_last_error", c_char_p, [], None),
    ("fq_last_status", c_int, [], None),
    # Engine
    ("fq_engine_new", EngineP, [JsonP, c_char_p, c_size_t], _check_handle),
    ("fq_engine_free", c_int, [EngineP], _check_status),
    ("fq_engine_wait_idle", c_int, [EngineP, c_int], _check_status),
    ("fq_engine_set_log_fn", c_int, [EngineP, LOG_FN, c_void_p], _check_status),
    ("fq_engine_stats", JsonP, [EngineP], None),
    ("fq_engine_event_fd", c_int, [EngineP], _check_status),
    ("fq_engine_dispatch", c_int, [EngineP, c_int], _check_status),
    # Queues
    ("fq_queue_new", QueueP, [EngineP, c_char_p, c_int], _check_handle),
    ("fq_queue_free", None, [QueueP], None),
    ("fq_queue_set_max_concurrent", c_int, [QueueP, c_int], _check_status),
    ("fq_queue_set_suspended", c_int, [QueueP, c_bool], _check_status),
    ("fq_queue_cancel_all", c_int, [QueueP], _check_status),
    ("fq_queue_wait", c_int, [QueueP, c_int], _check_status),
    # Submitting (return an id > 0 or a negative status)
    ("fq_submit_block", c_int64, [QueueP, BLOCK_FN, JsonP, COMPLETION_FN, c_void_p], _check_status),
    ("fq_submit_async", c_int64, [QueueP, ASYNC_FN, JsonP, COMPLETION_FN, c_void_p], _check_status),
    ("fq_submit_request", c_int64, [QueueP, JsonP, JsonP, COMPLETION_FN, c_void_p], _check_status),
    ("fq_submit_search", c_int64, [QueueP, c_char_p, JsonP, COMPLETION_FN, c_void_p], _check_status),
    # how many were submitted (<= n; fewer: fq_last_error says why) or a negative status
    ("fq_submit_requests", c_int64,
     [QueueP, JsonP, POINTER(c_char_p), c_size_t, JsonP, COMPLETION_FN, POINTER(c_void_p), POINTER(c_int64)],
     None),
    ("fq_submit_search_all", c_int64,
     [QueueP, POINTER(c_char_p), c_size_t, JsonP, COMPLETION_FN, c_void_p], _check_status),
    # Events
    ("fq_engine_set_event_fn", c_int, [EngineP, EVENT_FN, c_void_p], _check_status),
    ("fq_event_op_id", c_int64, [c_void_p], None),
    ("fq_event_get_type", c_int, [c_void_p], None),
    ("fq_event_progress", c_int, [c_void_p, POINTER(c_uint64), POINTER(c_uint64)], _check_status),
    ("fq_event_result", c_void_p, [c_void_p], None),
    ("fq_event_query", c_char_p, [c_void_p], None),
    # Inside an operation's body
    ("fq_op_get_id", c_int64, [c_void_p], None),
    ("fq_op_is_cancelled", c_bool, [c_void_p], None),
    ("fq_op_set_error", c_int, [c_void_p, c_char_p], _check_status),
    ("fq_op_finish", c_int, [c_void_p, JsonP, c_char_p], _check_status),
    ("fq_op_dependency_result", JsonP, [c_void_p, c_int64], None),
    ("fq_op_dependency", c_void_p, [c_void_p, c_int64], None),
    # Controlling operations
    ("fq_cancel", c_int, [EngineP, c_int64], None),  # raw: Future.cancel() reads the status
    ("fq_state", c_int, [EngineP, c_int64], None),  # raw: > 0 is the state
    ("fq_wait", c_int, [EngineP, c_int64, c_int], _check_status),  # not used: futures wait
    ("fq_cancel_group", c_int, [EngineP, c_char_p], _check_status),
    ("fq_cancel_all", c_int, [EngineP], _check_status),
    ("fq_set_priority", c_int, [EngineP, c_int64, c_int], _check_status),
    ("fq_add_dependency", c_int, [EngineP, c_int64, c_int64], _check_status),
    ("fq_remove_dependency", c_int, [EngineP, c_int64, c_int64], _check_status),
    # Results (inside a completion callback)
    ("fq_result_op_id", c_int64, [c_void_p], None),
    ("fq_result_outcome", c_int, [c_void_p], None),
    ("fq_result_status", c_int, [c_void_p], None),
    ("fq_result_error", c_char_p, [c_void_p], None),
    ("fq_result_value", c_void_p, [c_void_p], None),  # json_t * as an int
    ("fq_result_has_value", c_bool, [c_void_p], None),
    ("fq_result_retain", c_void_p, [c_void_p], None),
    ("fq_result_release", None, [c_void_p], None),
    ("fq_result_http_status", c_long, [c_void_p], None),
    ("fq_result_headers", c_void_p, [c_void_p], None),
    # the length goes to a size_t the caller names by address (see _LengthCell)
    ("fq_result_body", c_void_p, [c_void_p, c_void_p], None),
    ("fq_result_metrics", c_void_p, [c_void_p], None),
    ("fq_result_marshal", c_void_p, [c_void_p, c_void_p], None),
    ("fq_result_from_cache", c_bool, [c_void_p], None),
    # Item store
    ("fq_store_open", StoreP, [c_char_p, c_char_p, c_size_t], None),  # NULL: checked by Store
    ("fq_store_free", None, [StoreP], None),
    ("fq_store_items", JsonP, [StoreP, c_char_p, c_char_p, c_bool], None),  # NULL: checked
    ("fq_store_get", c_int, [StoreP, c_char_p, c_char_p, POINTER(JsonP)], _check_status),
    ("fq_store_get_json", c_int, [StoreP, c_char_p, JsonP, POINTER(JsonP)], _check_status),
    ("fq_store_count", c_int64, [StoreP, c_char_p], _check_status),
    ("fq_store_upsert", c_int, [StoreP, c_char_p, JsonP, c_char_p, c_char_p, POINTER(JsonP)],
     _check_status),
]

# Older names still accepted when the library predates a rename in the header.
ALIASES: Dict[str, str] = {"fq_event_result": "fq_event_child_result"}

# jansson functions used by the bridge (all exported by libjansson.so.4).
# json_t * arguments declared c_void_p take a JsonP as well as an address.
JANSSON_FUNCTIONS: List[_Decl] = [
    ("json_loadb", JsonP, [c_char_p, c_size_t, c_size_t, POINTER(JsonError)], None),
    ("json_dumps", c_void_p, [c_void_p, c_size_t], None),  # char *, freed below
    ("json_pack", JsonP, None, None),  # variadic: no argtypes (pointers as c_void_p)
    ("json_array", JsonP, [], None),
    ("json_array_append_new", c_int, [JsonP, JsonP], None),
    ("json_array_extend", c_int, [JsonP, JsonP], None),
    ("json_array_size", c_size_t, [JsonP], None),
    ("json_delete", None, [c_void_p], None),
    ("json_object_get", c_void_p, [c_void_p, c_char_p], None),
    ("json_string_setn", c_int, [c_void_p, c_char_p, c_size_t], None),
    ("json_get_alloc_funcs", None, [POINTER(c_void_p), POINTER(c_void_p)], None),
]

_FREE_FN = CFUNCTYPE(None, c_void_p)


class _Missing:
    """Stands in for a function the loaded library does not export."""

    def __init__(self, name: str, path: str) -> None:
        self.__name__ = name
        self._path = path

    def __call__(self, *args: Any) -> Any:
        raise UnsupportedError(
            "%s is not exported by %s (the library is older than the header "
            "this binding was written for)" % (self.__name__, self._path))

    def __bool__(self) -> bool:
        return False


class Library:
    """The loaded libfetchq with every declared function as an attribute."""

    def __init__(self, cdll: ctypes.CDLL, path: str) -> None:
        self.cdll = cdll
        self.path = path
        self.missing: List[str] = []
        for name, restype, argtypes, errcheck in FUNCTIONS:
            try:
                fn = getattr(cdll, name)
            except AttributeError:
                try:
                    fn = getattr(cdll, ALIASES[name])
                except (KeyError, AttributeError):
                    self.missing.append(name)
                    setattr(self, name, _Missing(name, path))
                    continue
            fn.restype = restype
            fn.argtypes = argtypes
            if errcheck is not None:
                fn.errcheck = errcheck
            setattr(self, name, fn)
        self.jansson_path = path
        self.jansson = self._jansson(cdll)
        self.last_error = self.fq_last_error
        self.last_status = self.fq_last_status
        self.strerror = self.fq_strerror
        malloc_fn, free_fn = c_void_p(), c_void_p()
        self.jansson.json_get_alloc_funcs(byref(malloc_fn), byref(free_fn))
        if not free_fn.value:
            raise LibraryNotFound("jansson reports no free function")
        self.json_free = _FREE_FN(free_fn.value)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not set in __init__; tells type checkers
        # that the declared functions are dynamic attributes.
        raise AttributeError(name)

    def has(self, name: str) -> bool:
        return name not in self.missing

    def _jansson(self, cdll: ctypes.CDLL) -> Any:
        # dlsym through libfetchq's handle finds the jansson it is linked with.
        source: Any = cdll
        try:
            getattr(cdll, "json_loadb")
        except AttributeError:
            source = ctypes.CDLL("libjansson.so.4")
            self.jansson_path = "libjansson.so.4"

        class _J:
            pass

        j: Any = _J()
        for name, restype, argtypes, _ in JANSSON_FUNCTIONS:
            fn = getattr(source, name)
            fn.restype = restype
            if argtypes is not None:
                fn.argtypes = argtypes
            setattr(j, name, fn)
        return j


class _LibState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lib: Optional[Library] = None
        self.last_error: Callable[[], Optional[bytes]] = lambda: None
        self.last_status: Callable[[], int] = lambda: 0
        self.strerror: Callable[[int], Optional[bytes]] = lambda s: None


_LIB_STATE = _LibState()


def reset_locks_after_fork() -> None:
    """In a child after os.fork() (called by the binding's at-fork
    handler): the module's lock may have been held by a parent thread,
    which does not exist here."""
    _LIB_STATE.lock = threading.Lock()


def candidate_paths(env: Optional[str] = None, package_dir: Optional[str] = None,
                    system: bool = True) -> List[str]:
    """The paths/names tried, in order (see the module docstring)."""
    out: List[str] = []
    if env:
        out.append(env)
    if package_dir is None:
        package_dir = os.path.dirname(os.path.abspath(__file__))
    copies = sorted(glob.glob(os.path.join(package_dir, "libfetchq.so*")),
                    key=lambda p: (not p.endswith(".so.0"), p))
    out.extend(copies)
    if system:
        out.extend(_system_candidates()[0])
    seen: Dict[str, None] = {}
    for p in out:
        seen.setdefault(p, None)
    return list(seen)


def _system_candidates() -> Tuple[List[str], bool]:
    """What the system loader may find, and whether find_library found it."""
    found = ctypes.util.find_library("fetchq")
    return ([found] if found else []) + ["libfetchq.so.0"], bool(found)


def load_library(candidates: Optional[Iterable[str]] = None) -> Library:
    """Loads the first candidate that works; raises LibraryNotFound listing
    every candidate and its error when none does.

    Without ``candidates``: ``$FETCHQ_LIBRARY`` and the package's copy first;
    the system loader's candidates only if neither loads, since
    ``ctypes.util.find_library`` runs ``ldconfig``/``gcc`` (about 10 ms each
    call, measured on every engine's first use before)."""
    tried: List[str] = []
    if candidates is None:
        env = os.environ.get("FETCHQ_LIBRARY")
        local = candidate_paths(env, system=False)
        try:
            return _load_first(local, tried)
        except LibraryNotFound:
            pass
        system, found = _system_candidates()
        system_note = None if found else "  (ctypes.util.find_library('fetchq') found nothing)"
        return _load_first([p for p in system if p not in local], tried, system_note)
    return _load_first(candidates, tried)


def _load_first(candidates: Iterable[str], tried: List[str],
                system_note: Optional[str] = None) -> Library:
    """The first of ``candidates`` that loads; each failure is added to
    ``tried``, and LibraryNotFound lists them all when none loads."""
    for path in candidates:
        try:
            cdll = ctypes.CDLL(path)
        except OSError as exc:
            tried.append("  %s: %s" % (path, exc))
            continue
        try:
            getattr(cdll, "fq_version")
        except AttributeError:
            tried.append("  %s: loaded, but it does not export fq_version" % path)
            continue
        real = _real_path(cdll, path)
        lib = Library(cdll, real)
        major = (lib.fq_version() >> 16) & 0xFF
        if major != BINDING_VERSION_MAJOR:
            tried.append("  %s: version %s, this binding needs %d.x" % (
                real, lib.fq_version_string().decode(), BINDING_VERSION_MAJOR))
            continue
        return lib
    if system_note is not None:
        tried.append(system_note)
    raise LibraryNotFound(
        "could not load libfetchq; tried (set FETCHQ_LIBRARY to its path):\n"
        + ("\n".join(tried) if tried else "  (no candidates)"))


def _real_path(cdll: ctypes.CDLL, fallback: str) -> str:
    """The file the loader actually mapped (via dladdr-free /proc lookup)."""
    if os.path.sep in fallback:
        return os.path.realpath(fallback)
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libfetchq" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return fallback


def lib() -> Library:
    """The process-wide library, loaded on first use."""
    state = _LIB_STATE
    loaded = state.lib
    if loaded is not None:
        return loaded
    with state.lock:
        if state.lib is None:
            loaded = load_library()
            state.last_error = loaded.fq_last_error
            state.last_status = loaded.fq_last_status
            state.strerror = loaded.fq_strerror
            state.lib = loaded
        return state.lib


# --------------------------------------------------------------------------
# Python objects <-> json_t

def _dumps(value: Any, what: str, argument: bool = False) -> bytes:
    """The compact ASCII JSON text of a Python value, as to_json sends it.
    ``argument``: ``value`` is a config or options dict (see to_json)."""
    try:
        text = _json.dumps(value, ensure_ascii=True, allow_nan=False,
                           separators=(",", ":"), default=_fspath if argument else None)
    except ValueError as exc:
        if argument:
            raise _argument_error(value, what, exc) from None
        raise InvalidArgument("%s is not valid JSON: %s" % (what, exc)) from None
    except TypeError as exc:
        if argument:
            raise _argument_error(value, what, exc) from None
        raise TypeError("%s is not JSON-serializable: %s" % (what, exc)) from None
    return text.encode("ascii")


def _loadb(data: bytes, what: str, value: Any = None, argument: bool = False) -> Any:
    """A NEW ``json_t *`` (JsonP) parsed by jansson from text made by _dumps
    (of ``value``, for the message of a refused ``argument``)."""
    err = JsonError()
    ptr = lib().jansson.json_loadb(data, len(data), _LOAD_FLAGS, byref(err))
    if not ptr:
        exc = InvalidArgument("%s cannot be represented in jansson: %s" % (
            what, err.text.decode("utf-8", "replace")))
        raise _argument_error(value, what, exc) if argument else exc
    return ptr


def to_json(value: Any, what: str = "value", argument: bool = False) -> Any:
    """A NEW ``json_t *`` (JsonP) for a Python value (dict/list/str/int/float/
    bool/None). Raises TypeError for values JSON cannot hold and ValueError
    for those jansson rejects (NaN, integers beyond int64, lone surrogates).

    ``argument``: ``value`` is a config or options dict, whose bad values
    raise :class:`InvalidArgument` naming the key (``"config.ca_file: ..."``,
    as the library's own messages do; one of a type JSON cannot hold is also
    a TypeError), and whose ``os.PathLike`` values are sent as their path."""
    return _loadb(_dumps(value, what, argument), what, value, argument)


def _fspath(value: Any) -> str:
    """json.dumps' ``default`` for config and options: a path object is its
    str path (ca_file, cache and store paths...)."""
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
    raise TypeError("Object of type %s is not JSON serializable" % type(value).__name__)


_INT64 = 1 << 63


def _json_problem(value: Any, where: str, ancestors: "set[int]") -> Optional[Tuple[str, str, bool]]:
    """(where, what is wrong, whether it is a wrong type) for the first value
    inside ``value`` that the JSON of a config or options dict cannot hold
    (as ``_dumps(argument=True)`` and jansson take it), or None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return where, "the string %r is not valid UTF-8 (a lone surrogate)" % value, False
        return None
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            return where, "%d is out of range (a 64-bit integer)" % value, False
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return where, "expected a finite number, got %r" % value, False
        return None
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return _json_problem(path, where, ancestors)
        return where, "expected a str path, got a %s path (%r)" % (type(path).__name__, value), True
    if not isinstance(value, (dict, list, tuple)):
        return (where, "expected a JSON value (str, int, float, bool, None, dict or list), got %s"
                % type(value).__name__, True)
    if id(value) in ancestors:
        return where, "the value contains itself", False
    ancestors.add(id(value))
    found = None
    if isinstance(value, dict):
        for key, item in value.items():
            if key is None or isinstance(key, int):     # written as a string, as JSON keys are
                found = None
            elif isinstance(key, (str, float)):
                found = _json_problem(key, where + " (a key)", ancestors)
            else:
                found = where, "a key must be a str, not %s (%r)" % (type(key).__name__, key), True
            found = found or _json_problem(item, "%s.%s" % (where, key), ancestors)
            if found:
                break
    else:
        for i, item in enumerate(value):
            found = _json_problem(item, "%s[%d]" % (where, i), ancestors)
            if found:
                break
    ancestors.discard(id(value))
    return found


def _argument_error(value: Any, what: str, exc: Exception) -> InvalidArgument:
    """The InvalidArgument for a config or options dict that JSON cannot
    hold (``exc``: the error of json.dumps or jansson)."""
    found = _json_problem(value, what, set())
    if found is None:
        found = what, str(exc), isinstance(exc, TypeError)
    where, problem, wrong_type = found
    return (_InvalidArgumentType if wrong_type else InvalidArgument)("%s: %s" % (where, problem))


def to_json_or_null(value: Optional[Dict[str, Any]], what: str) -> Any:
    """Like to_json, but None gives a NULL pointer (C "no options")."""
    if value is None:
        return None
    return to_json(value, what)


class JsonCache:
    """NEW ``json_t *`` objects for option dicts, keyed by their contents
    (see _flat_key) or their JSON text, so that submitting the same options
    again skips serializing them and jansson's parse.

    The library only reads options during a submit call (it copies what it
    keeps), so one object serves every submit, also concurrent ones. Holds at
    most ``limit`` entries (no eviction: an entry may be in use by a submit
    on another thread); beyond that :meth:`get` builds a private object.
    :meth:`clear` must only run when no submit can still use an entry (the
    engine's close, after every in-flight call returned)."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self.entries: Dict[Any, Any] = {}   # _flat_key tuple or JSON text -> json_t *
        self.closed = False
        self.lock = threading.Lock()

    def get(self, value: Optional[Dict[str, Any]], what: str,
            cacheable: bool = True) -> Tuple[Any, Any]:
        """(ptr, owned): pass ``ptr`` to the submit, then ``decref(owned)``
        (None when ``ptr`` belongs to the cache). (None, None) for None."""
        if value is None:
            return None, None
        key: Any = _flat_key(value)
        ptr = self.entries.get(key) if key is not None else None
        if ptr is not None:
            return ptr, None
        data = _dumps(value, what, True)
        if key is None:
            key = data
            ptr = self.entries.get(key)
            if ptr is not None:
                return ptr, None
        ptr = _loadb(data, what, value, True)
        if cacheable and len(self.entries) < self.limit:
            with self.lock:
                if not self.closed and key not in self.entries and len(self.entries) < self.limit:
                    self.entries[key] = ptr
                    return ptr, None
        return ptr, ptr

    def clear(self) -> None:
        with self.lock:
            self.closed = True
            entries, self.entries = self.entries, {}
        for ptr in entries.values():
            decref(ptr)


def _flat_key(value: Dict[str, Any]) -> Optional[Tuple[Any, ...]]:
    """A cache key for an options dict whose values are all str, int, bool or
    None (the common case), without serializing it: each value with its exact
    type, since True == 1 but "true" is not "1" in JSON. None otherwise (the
    JSON text is the key then)."""
    key = []
    for k, v in value.items():
        t = type(v)
        if type(k) is not str or (t is not str and t is not bool and t is not int and v is not None):
            return None
        key.append((k, t, v))
    return tuple(key)


def request_json(method: str, url: str) -> Any:
    """A NEW ``json_t *`` for ``{"method": method, "url": url}`` built with one
    ``json_pack`` call, or None when the strings cannot be encoded as UTF-8
    (the caller then uses to_json, which reports the error)."""
    try:
        m = method.encode("utf-8")
        u = url.encode("utf-8")
    except UnicodeEncodeError:
        return None
    pack = lib().jansson.json_pack
    if b"\0" in m or b"\0" in u:   # sent as is: the library says what is wrong
        ptr = pack(b"{s:s%,s:s%}", b"method", m, c_size_t(len(m)), b"url", u, c_size_t(len(u)))
    else:
        ptr = pack(b"{s:s,s:s}", b"method", m, b"url", u)
    return ptr or None


def decref(ptr: Any) -> None:
    """Drops one reference we own (see the module docstring for why this is
    json_array_append_new + json_delete of our private array)."""
    if not ptr:
        return
    j = lib().jansson
    holder = j.json_array()
    if not holder:
        raise MemoryError("json_array failed")
    j.json_array_append_new(holder, ptr)  # steals ptr (decrefs it on failure)
    j.json_delete(holder)


# ctypes.string_at without its Python-level wrapper (one frame less per
# response body); the wrapper where a ctypes lacks the private name.
string_at: Callable[[Any, int], bytes] = getattr(ctypes, "_string_at", None) or ctypes.string_at


class PlainRequest:
    """A private ``{"method": M, "url": U}`` json_t, reused: see
    :func:`plain_request`."""

    __slots__ = ("ptr", "url_value", "method")

    def __init__(self, ptr: Any, url_value: int, method: str) -> None:
        self.ptr = ptr
        self.url_value = url_value
        self.method = method


# Reusable request objects for the common methods, a few per method (one is
# in use per submit in progress; list.pop/append are atomic under the GIL).
_PLAIN_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_PLAIN_FREE: Dict[str, List[PlainRequest]] = {m: [] for m in _PLAIN_METHODS}
_PLAIN_KEEP = 8


def plain_request(method: str, url: str) -> Optional[PlainRequest]:
    """``{"method": method, "url": url}`` for one submit, then
    :func:`give_back`: instead of building the object and freeing it for
    every request (json_pack and json_delete), a reused one gets the new URL
    with json_string_setn. The library only borrows a request during the
    submit call ("copies what it keeps", include/fetchq.h), so the object is
    free again once the call returned. None for other methods, or when the
    URL cannot be encoded as UTF-8 (the caller then uses request_json or
    to_json, which report it)."""
    free = _PLAIN_FREE.get(method)
    if free is None:
        return None
    try:
        u = url.encode("utf-8")
    except UnicodeEncodeError:
        return None
    J = lib().jansson
    try:
        item = free.pop()
    except IndexError:
        ptr = J.json_pack(b"{s:s,s:s}", b"method", method.encode(), b"url", b"")
        if not ptr:
            raise MemoryError("json_pack failed")
        item = PlainRequest(ptr, J.json_object_get(ptr, b"url"), method)
    if J.json_string_setn(item.url_value, u, len(u)) != 0:
        give_back(item)
        return None
    return item


def give_back(item: PlainRequest) -> None:
    """Returns a :func:`plain_request` object (after the submit call)."""
    free = _PLAIN_FREE[item.method]
    if len(free) < _PLAIN_KEEP:
        free.append(item)
    else:
        free_private(item.ptr)


def free_private(ptr: Any) -> None:
    """Frees a NEW ``json_t *`` that was never shared: made by this module
    for one call that only borrowed it (the library "copies what it keeps",
    include/fetchq.h), so ours is its only reference and ``json_delete`` is
    exactly its ``json_decref`` (one call instead of :func:`decref`'s
    three). None/NULL is ignored."""
    if ptr:
        lib().jansson.json_delete(ptr)


# Arrays made by hold() and not yet released, by id() of their JsonP (ctypes
# pointers are not hashable). Lets tests count live references; release() of
# an array not in it does nothing.
_HELD: Dict[int, Any] = {}
_HOLD_FORMATS: Dict[Tuple[bool, ...], bytes] = {}


def hold(*ptrs: Any) -> Any:
    """Keeps BORROWED ``json_t *`` values (addresses or JsonP; NULL allowed)
    alive past the call that lent them: returns a new private array (JsonP)
    holding one NEW reference to each non-NULL value (NULLs become json
    null), taken by jansson's ``json_pack`` "O" (an atomic json_incref).
    0 when every pointer is NULL. The caller owns the array: exactly one
    :func:`release` frees it and drops those references. The values stay at
    the addresses the caller already has."""
    present = tuple(bool(p) for p in ptrs)
    if not any(present):
        return 0
    fmt = _HOLD_FORMATS.get(present)
    if fmt is None:
        fmt = _HOLD_FORMATS.setdefault(
            present, b"[" + b"".join(b"O" if p else b"n" for p in present) + b"]")
    args = [c_void_p(p) if isinstance(p, int) else p for p in ptrs if p]
    holder = lib().jansson.json_pack(fmt, *args)
    if not holder:
        raise MemoryError("json_pack failed")
    _HELD[id(holder)] = holder
    return holder


class ResultHold:
    """A retained ``fq_result`` (see :func:`hold_result`)."""

    __slots__ = ("address",)

    def __init__(self, address: int) -> None:
        self.address = address


def hold_result(result: int) -> ResultHold:
    """Keeps a BORROWED ``fq_result`` (and what its accessors return, also
    later) valid past the call that lent it (``fq_result_retain``). The
    caller owns the hold: exactly one :func:`release` drops it."""
    holder = ResultHold(lib().fq_result_retain(result))
    _HELD[id(holder)] = holder
    return holder


def release(holder: Any) -> None:
    """Frees an array made by :func:`hold`, dropping its references (the
    array is ours alone, so json_delete is exactly its json_decref; jansson
    then decrefs each element atomically), or drops a :func:`hold_result`.
    Safe from any thread."""
    if not holder or _HELD.pop(id(holder), None) is not holder:
        return      # not ours, or released already: never free twice
    if type(holder) is ResultHold:
        lib().fq_result_release(holder.address)
    else:
        lib().jansson.json_delete(holder)


def held_count() -> int:
    """How many hold() arrays and hold_result() holds are alive (for tests)."""
    return len(_HELD)


def refcount(ptr: Any) -> int:
    """The reference count of a ``json_t *`` (address or JsonP); for tests."""
    address = ptr if isinstance(ptr, int) else ctypes.cast(ptr, c_void_p).value
    return int(c_size_t.from_address(address + JsonT.refcount.offset).value)


def from_json(ptr: Any) -> Any:
    """The Python value of a BORROWED ``json_t *`` (address or JsonP; None
    for NULL)."""
    if not ptr:
        return None
    L = lib()
    raw = L.jansson.json_dumps(ptr, _DUMP_FLAGS)
    if not raw:
        raise MemoryError("json_dumps failed")
    try:
        data = ctypes.string_at(raw)
    finally:
        L.json_free(raw)
    try:
        return _json.loads(data)
    except UnicodeDecodeError:
        # A string the library built without UTF-8 validation (e.g. a header
        # with obs-text bytes): keep it readable.
        return _json.loads(data.decode("utf-8", "replace"))


def has_json(ptr: Any) -> bool:
    return bool(ptr)


def bytes_at(address: Optional[int], length: int) -> bytes:
    if not address or length <= 0:
        return b""
    return ctypes.string_at(address, length)


def cstr(value: Optional[bytes]) -> Optional[str]:
    return None if value is None else value.decode("utf-8", "replace")


def encode_str(value: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s" % (what, type(value).__name__))
    data = value.encode("utf-8")
    if b"\0" in data:
        raise InvalidArgument("%s must not contain NUL characters" % what)
    return data


def check(status: int) -> int:
    """Turns a raw status (from a function declared without errcheck) into an
    exception, reading fq_last_error() at once."""
    if status < 0:
        raise error_for_status(status, _message() or _strerror(status))
    return status


def progress_of(event: int) -> Tuple[int, int]:
    received, expected = c_uint64(), c_uint64()
    lib().fq_event_progress(event, byref(received), byref(expected))
    return received.value, expected.value


class _LengthCell(threading.local):
    """A size_t of this thread's own, passed to the accessors that report a
    length by its address: a ctypes call with ``byref`` of a new ``c_size_t``
    costs about 0.9 µs here, with an address 0.5 µs (bench/findings.md,
    Twenty-third round). Per thread, since the call releases the GIL."""

    def __init__(self) -> None:
        self.cell = c_size_t(0)
        self.address = ctypes.addressof(self.cell)


_LENGTH = _LengthCell()


def body_at(result: int) -> Tuple[Optional[int], int]:
    """(address, length) of a result's body (fq_result_body)."""
    cell = _LENGTH
    address = lib().fq_result_body(result, cell.address)
    return address, cell.cell.value


def body_of(result: int) -> bytes:
    return bytes_at(*body_at(result))


def _utf8_decoder() -> Optional[Callable[[Any, int, Optional[bytes]], str]]:
    """CPython's PyUnicode_DecodeUTF8 (str from C memory in one copy), or
    None where ctypes has no pythonapi."""
    api = getattr(ctypes, "pythonapi", None)
    if api is None:
        return None
    fn = api.PyUnicode_DecodeUTF8
    fn.restype = ctypes.py_object
    fn.argtypes = [c_void_p, ctypes.c_ssize_t, c_char_p]
    return fn


_DECODE_UTF8 = _utf8_decoder()


# The library writes marshal's format as CPython reads it (fetchq.h,
# fq_result_marshal); other Pythons parse the body instead.
MARSHAL_READABLE = sys.implementation.name == "cpython"


def _marshal_reader() -> Optional[Callable[[Any, int], Any]]:
    """CPython's PyMarshal_ReadObjectFromString (the objects straight from C
    memory, no bytes copy), or None where ctypes cannot reach it."""
    api = getattr(ctypes, "pythonapi", None)
    if api is None or not MARSHAL_READABLE:
        return None
    fn = getattr(api, "PyMarshal_ReadObjectFromString", None)
    if fn is None:      # then marshal.loads of a bytes copy
        return None
    fn.restype = ctypes.py_object
    fn.argtypes = [c_void_p, ctypes.c_ssize_t]
    return fn


_READ_MARSHAL = _marshal_reader()
# What marshal_value returns when the result holds no marshal data.
NO_MARSHAL: Any = object()


def marshal_value(result: int) -> Any:
    """The value a result holds in marshal's format (option "marshal"), or
    NO_MARSHAL when it holds none (then parse the body)."""
    cell = _LENGTH
    address = lib().fq_result_marshal(result, cell.address)
    if not address:
        return NO_MARSHAL
    length = cell.cell.value
    if _READ_MARSHAL is not None:
        return _READ_MARSHAL(address, length)
    return _marshal.loads(bytes_at(address, length))


def body_text(result: int) -> str:
    """The body of a result as str, decoded as UTF-8 (strict)."""
    address, size = body_at(result)
    if not address or not size:
        return ""
    if _DECODE_UTF8 is not None:
        return _DECODE_UTF8(address, size, None)
    return bytes_at(address, size).decode("utf-8")


__all__ = [
    "Library", "lib", "load_library", "candidate_paths", "to_json", "to_json_or_null",
    "from_json", "decref", "hold", "release", "request_json", "JsonCache", "check",
    "COMPLETION_FN", "BLOCK_FN", "ASYNC_FN", "EVENT_FN", "LOG_FN",
]
