"""Errors, as Python exceptions.

- ``HostError``: a host call (cache, client, events) failed. ``kind`` is the WIT ``error``
  case; ``retryable`` is false only for ``invalid`` (the same input will fail again).
- ``RetryableError`` / ``TerminalError``: raised by a plugin's ``reconcile`` to end it with
  the WIT ``reconcile-error`` case of the same name. A ``HostError`` escaping ``reconcile``
  becomes retryable or terminal by its ``retryable`` flag; any other exception becomes
  retryable with its message (the object is retried with backoff).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional, TypeVar

from componentize_py_types import Err

T = TypeVar("T")

_CASE_TEXT = {
    "not-found": "not found",
    "already-exists": "already exists",
    "conflict": "conflict",
    "forbidden": "forbidden",
    "invalid": "invalid",
    "unavailable": "unavailable",
    "other": "error",
}


class HostError(Exception):
    """A failed host call."""

    def __init__(self, kind: str, detail: str, status: int = 0) -> None:
        text = f"HTTP {status}: {detail}" if kind == "other" and status else f"{_CASE_TEXT[kind]}: {detail}"
        super().__init__(text)
        self.kind = kind
        self.detail = detail
        self.status = status

    @property
    def message(self) -> str:
        return str(self)

    @property
    def retryable(self) -> bool:
        """Whether retrying later may succeed (everything but ``invalid``)."""
        return self.kind != "invalid"

    @property
    def not_found(self) -> bool:
        return self.kind == "not-found"

    @property
    def already_exists(self) -> bool:
        return self.kind == "already-exists"

    @property
    def conflict(self) -> bool:
        return self.kind == "conflict"

    @property
    def forbidden(self) -> bool:
        return self.kind == "forbidden"


class RetryableError(Exception):
    """Ends a reconcile with ``retryable(message)``: retried with per-key exponential backoff."""


class TerminalError(Exception):
    """Ends a reconcile with ``terminal(message)``: not retried until the object changes."""


def _from_wit(err: object) -> HostError:
    """The ``HostError`` for a WIT ``error`` value (``Error_NotFound(value=...)``, ...)."""
    case = type(err).__name__.removeprefix("Error_")
    kind = "".join("-" + c.lower() if c.isupper() else c for c in case).lstrip("-")
    value = getattr(err, "value", "")
    if kind == "other":
        status, detail = value
        return HostError("other", detail, status)
    return HostError(kind if kind in _CASE_TEXT else "other", str(value))


def host_call(f: Callable[[], T]) -> T:
    """Runs ``f``, turning what a WIT import raises (``Err(error)``) into a ``HostError``."""
    try:
        return f()
    except Err as e:
        raise _from_wit(e.value) from None


@contextmanager
def context(what: str) -> Iterator[None]:
    """Adds ``what`` in front of a failure's message, keeping retryable vs terminal::

    with context(f"creating copy {ns}/{name}"):
        client.create(copy)
    """
    try:
        yield
    except HostError as e:
        cls = RetryableError if e.retryable else TerminalError
        raise cls(f"{what}: {e}") from e
    except TerminalError as e:
        raise TerminalError(f"{what}: {e}") from e
    except RetryableError as e:
        raise RetryableError(f"{what}: {e}") from e


def ignore_not_found(f: Callable[[], T]) -> Optional[T]:
    """``None`` instead of a not-found ``HostError``."""
    try:
        return f()
    except HostError as e:
        if e.not_found:
            return None
        raise
