"""Finalizers: add one before creating what needs cleaning up, remove it once cleaned up.

``ensure_added`` / ``ensure_removed`` write only when something changes, as a merge patch
of ``metadata.finalizers`` carrying the object's resourceVersion (so a concurrent change
fails with ``conflict`` instead of being overwritten).
"""

from __future__ import annotations

from typing import Any, List, Optional, TypeVar

from . import client
from .errors import HostError
from .objects import Kind, meta

T = TypeVar("T")


def has(o: Any, finalizer: str) -> bool:
    """Whether ``o`` carries ``finalizer``."""
    return finalizer in (meta(o).get("finalizers") or [])


def ensure_added(o: T, finalizer: str) -> T:
    """``o`` with ``finalizer``, written when it was missing; returns the stored object."""
    if has(o, finalizer):
        return o
    stored = _write(o, [*(meta(o).get("finalizers") or []), finalizer], gone_is_fine=False)
    return o if stored is None else stored


def ensure_removed(o: T, finalizer: str) -> Optional[T]:
    """``o`` without ``finalizer``, written when it was there; returns the stored object, or
    ``None`` when removing the last finalizer let a deleting object go."""
    if not has(o, finalizer):
        return o
    return _write(o, [f for f in meta(o).get("finalizers") or [] if f != finalizer], gone_is_fine=True)


def _write(o: Any, finalizers: List[str], gone_is_fine: bool) -> Any:
    m = meta(o)
    body_meta: dict = {"finalizers": finalizers}
    if m.get("resourceVersion") is not None:
        body_meta["resourceVersion"] = m["resourceVersion"]
    kind: Kind = Kind(o.get("apiVersion", ""), o.get("kind", ""))
    try:
        return client.patch(kind, m.get("namespace"), m.get("name", ""), {"metadata": body_meta})
    except HostError as e:
        if gone_is_fine and e.not_found:
            return None
        raise
