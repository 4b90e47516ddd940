"""The exception hierarchy: one class per ``fq_status``, mapped 1:1.

Every exception raised for a library status derives from :class:`FetchqError`,
which carries the numeric status as ``.code`` and the library's message as
``.message``. :func:`error_for_status` picks the class for a status.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Type

if TYPE_CHECKING:   # (a runtime import would be circular: _engine imports this module and binds
    # Response here once it defines it, for typing.get_type_hints)
    from ._engine import Response

__all__ = [
    "FetchqError",
    "InvalidArgument",
    "NotFound",
    "StateError",
    "CycleError",
    "ShutdownError",
    "Timeout",
    "Cancelled",
    "DependencyError",
    "OperationError",
    "QueueTimeout",
    "HTTPError",
    "NetworkError",
    "TooLarge",
    "ParseError",
    "TLSError",
    "RedirectError",
    "OutOfMemory",
    "StoreError",
    "CacheMiss",
    "LibraryNotFound",
    "UnsupportedError",
    "error_for_status",
]


class FetchqError(Exception):
    """Base class of every fetchq error.

    ``code`` is the ``fq_status`` (a negative int; 0 for errors raised by the
    binding itself), ``message`` the library's explanation.
    """

    code: int = 0

    def __init__(self, message: str = "", code: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message or type(self).__name__


class InvalidArgument(FetchqError, ValueError):
    """FQ_ERR_INVALID: a bad argument, handle, option or config value."""

    code = -1


class _InvalidArgumentType(InvalidArgument, TypeError):
    """InvalidArgument for a config or option value of a type JSON cannot
    hold (bytes, a set, an object...): also a TypeError, which the binding
    raised for them before."""


class NotFound(FetchqError, LookupError):
    """FQ_ERR_NOT_FOUND: an unknown operation id (or one already finished)."""

    code = -2


class StateError(FetchqError):
    """FQ_ERR_STATE: not allowed now (already started, or from a callback)."""

    code = -3


class CycleError(FetchqError):
    """FQ_ERR_CYCLE: the dependency would create a cycle."""

    code = -4


class ShutdownError(FetchqError):
    """FQ_ERR_SHUTDOWN: the engine is being freed (or is closed)."""

    code = -5


class Timeout(FetchqError):
    """FQ_ERR_TIMEOUT: a wait, or an operation's time limit, ran out."""

    code = -6


class Cancelled(FetchqError):
    """FQ_ERR_CANCELLED, when a call (not a future) reports it.

    A cancelled *future* raises the standard ``CancelledError`` of
    ``concurrent.futures`` / ``asyncio`` instead.
    """

    code = -7


class DependencyError(FetchqError):
    """FQ_ERR_DEPENDENCY: a dependency failed or was cancelled."""

    code = -8


class OperationError(FetchqError):
    """FQ_ERR_OPERATION: the operation's body reported an error.

    For a Python body, ``__cause__`` is the exception the body raised.
    """

    code = -9


class QueueTimeout(Timeout):
    """FQ_ERR_QUEUE_TIMEOUT: waited in its queue longer than max_wait_ms."""

    code = -10


class _WithResponse(FetchqError):
    """An error that came with a whole response: ``status`` is the HTTP
    status, ``body`` the raw body (bytes), ``headers`` the response headers
    and ``response`` the whole :class:`fetchq.Response`."""

    def __init__(
        self,
        message: str = "",
        code: Optional[int] = None,
        *,
        status: int = 0,
        body: bytes = b"",
        headers: Optional[Dict[str, str]] = None,
        response: Optional[Response] = None,
    ) -> None:
        super().__init__(message, code)
        self.status = status
        self.body = body
        self.headers: Dict[str, str] = dict(headers or {})
        self.response: Optional[Response] = response


class HTTPError(_WithResponse):
    """FQ_ERR_HTTP: the server answered with a status that is not accepted.

    ``status`` is the HTTP status, ``body`` the raw body (bytes), ``headers``
    the response headers and ``response`` the whole :class:`fetchq.Response`.
    """

    code = -11


class NetworkError(FetchqError):
    """FQ_ERR_NETWORK: refused/reset/closed connection, DNS, bad framing."""

    code = -12


class TooLarge(FetchqError):
    """FQ_ERR_TOO_LARGE: the response exceeded max_response_bytes."""

    code = -13


class ParseError(_WithResponse):
    """FQ_ERR_PARSE: the body is not valid JSON, is nested too deeply, or
    holds what jansson cannot (an integer beyond 64 bits, 1e400). For a response
    that arrived whole, ``status``, ``body``, ``headers`` and ``response`` say
    what it was (as for :class:`HTTPError`); otherwise status 0, no response."""

    code = -14


class TLSError(FetchqError):
    """FQ_ERR_TLS: TLS handshake or certificate verification failed."""

    code = -15


class RedirectError(FetchqError):
    """FQ_ERR_REDIRECT: too many redirects."""

    code = -16


class OutOfMemory(FetchqError, MemoryError):
    """FQ_ERR_NOMEM: the library ran out of memory."""

    code = -17


class StoreError(FetchqError):
    """FQ_ERR_STORE: the item store (SQLite) failed."""

    code = -18


class CacheMiss(FetchqError):
    """FQ_ERR_CACHE_MISS: option cache="only-if-cached" and nothing cached."""

    code = -19


class LibraryNotFound(FetchqError, ImportError):
    """libfetchq could not be loaded; the message lists every path tried."""


class UnsupportedError(FetchqError, NotImplementedError):
    """The loaded libfetchq does not export a function this binding needs
    (the library is older than the header the binding was written for)."""


_BY_CODE: Dict[int, Type[FetchqError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument, NotFound, StateError, CycleError, ShutdownError,
        Timeout, Cancelled, DependencyError, OperationError, QueueTimeout,
        HTTPError, NetworkError, TooLarge, ParseError, TLSError,
        RedirectError, OutOfMemory, StoreError, CacheMiss,
    )
}


def error_for_status(code: int, message: str = "", **extra: Any) -> FetchqError:
    """The exception for ``fq_status`` ``code`` (FetchqError for an unknown one)."""
    cls = _BY_CODE.get(code, FetchqError)
    if cls is HTTPError:
        return HTTPError(message, code, **extra)
    return cls(message, code)
