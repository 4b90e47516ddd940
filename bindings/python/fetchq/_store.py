"""The item store (``fq_store``): a SQLite file of JSON items keyed by
(collection, id), the same file the search option ``store`` writes."""

from __future__ import annotations

import os
import threading
import weakref
from ctypes import byref
from typing import Any, Dict, List, Optional, Union

from . import _ffi
from .errors import StateError, StoreError


def _free(lib: Any, guard: "_Guard") -> None:
    handle = guard.take()
    if handle is not None:
        lib.fq_store_free(handle)


class _Guard:
    """The handle plus a count of calls using it, so close() never frees it
    under a call running in another thread."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.busy = 0
        self.cond = threading.Condition()

    def enter(self) -> Any:
        with self.cond:
            if self.handle is None:
                raise StateError("the store is closed")
            self.busy += 1
            return self.handle

    def exit(self) -> None:
        with self.cond:
            self.busy -= 1
            if self.busy == 0:
                self.cond.notify_all()

    def take(self) -> Any:
        with self.cond:
            handle, self.handle = self.handle, None
            while self.busy:
                self.cond.wait()
            return handle


class Store:
    """``Store(path)`` opens (creating if needed) an item store.

    ``items(collection, sort=None, descending=False)``, ``get(collection,
    id)``, ``count(collection)``, ``upsert(collection, items, id_pointer="/id",
    merge=None)``; ``close()`` or ``with``. Safe from any thread. Ids are
    compared as JSON values ("1" and 1 differ); ``get`` takes string ids.
    Errors raise :class:`StoreError` (or :class:`InvalidArgument`).
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self._lib = _ffi.lib()
        self.path = os.fspath(path)
        raw = _ffi.encode_str(self.path, "path")
        handle = self._lib.fq_store_open(raw, None, 0)
        if not handle:
            raise StoreError(_ffi.last_error_message() or "cannot open %s" % self.path)
        self._guard = _Guard(handle)
        self._finalizer = weakref.finalize(self, _free, self._lib, self._guard)

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._guard.handle is None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def items(self, collection: str, sort: Optional[str] = None,
              descending: bool = False) -> List[Any]:
        """Every item of ``collection``, sorted by the JSON Pointer ``sort``
        (None: by id), ascending or ``descending``, with a search's order
        rules (numbers numerically, strings by code point)."""
        col = _ffi.encode_str(collection, "collection")
        srt = None if sort is None else _ffi.encode_str(sort, "sort")
        h = self._guard.enter()
        try:
            ptr = self._lib.fq_store_items(h, col, srt, descending)
            if not ptr:
                raise StoreError(_ffi.last_error_message() or "fq_store_items failed")
        finally:
            self._guard.exit()
        try:
            return list(_ffi.from_json(ptr))
        finally:
            _ffi.decref(ptr)  # NEW reference

    def get(self, collection: str, id: str) -> Optional[Any]:
        """The item whose id is the string ``id``, or None. (fq_store_get
        looks up string ids only; an item with a numeric id is reachable
        through :meth:`items`.)"""
        col = _ffi.encode_str(collection, "collection")
        if not isinstance(id, str):
            raise TypeError("fq_store_get looks up string ids only, not %s" % type(id).__name__)
        key = _ffi.encode_str(id, "id")
        out = _ffi.JsonP()
        h = self._guard.enter()
        try:
            self._lib.fq_store_get(h, col, key, byref(out))
        finally:
            self._guard.exit()
        if not out:
            return None
        try:
            return _ffi.from_json(out)
        finally:
            _ffi.decref(out)  # NEW reference

    def count(self, collection: str) -> int:
        col = _ffi.encode_str(collection, "collection")
        h = self._guard.enter()
        try:
            return int(self._lib.fq_store_count(h, col))
        finally:
            self._guard.exit()

    def upsert(self, collection: str, items: List[Dict[str, Any]], id_pointer: str = "/id",
               merge: Optional[str] = None) -> Dict[str, int]:
        """Inserts or updates ``items`` by the id at ``id_pointer``, all or
        nothing; ``merge`` is "overwrite" (default) or "keep-local". Returns
        {"inserted", "updated", "unchanged", "skipped"}."""
        col = _ffi.encode_str(collection, "collection")
        ptr_raw = _ffi.encode_str(id_pointer, "id_pointer")
        merge_raw = None if merge is None else _ffi.encode_str(merge, "merge")
        arr = _ffi.to_json(list(items), "items")
        report = _ffi.JsonP()
        try:
            h = self._guard.enter()
            try:
                self._lib.fq_store_upsert(h, col, arr, ptr_raw, merge_raw, byref(report))
            finally:
                self._guard.exit()
        finally:
            _ffi.decref(arr)  # BORROWED by the call
        try:
            return dict(_ffi.from_json(report) or {})
        finally:
            _ffi.decref(report)  # NEW reference

    def __repr__(self) -> str:
        return "<fetchq.Store %r%s>" % (self.path, " closed" if self.closed else "")
