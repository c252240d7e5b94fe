"""Kubernetes Events about objects, as ``kubectl describe`` shows them.

The host deduplicates and rate-limits them; a failure raises ``HostError``.
"""

from __future__ import annotations

from typing import Any, Literal

from wit_world.imports import events as _wit
from wit_world.imports import types as _types

from .errors import host_call
from .objects import meta


def publish(regarding: Any, event_type: Literal["normal", "warning"], reason: str, action: str, note: str) -> None:
    """Records an event of ``type`` about ``regarding`` (which needs ``apiVersion`` and ``kind``)."""
    ref = _types.ObjectRef(
        kind=_types.Gvk(api_version=regarding.get("apiVersion", ""), kind=regarding.get("kind", "")),
        namespace=meta(regarding).get("namespace"),
        name=meta(regarding).get("name", ""),
    )
    event = _wit.Event(
        regarding=ref,
        type=_wit.EventType.WARNING if event_type == "warning" else _wit.EventType.NORMAL,
        reason=reason,
        action=action,
        note=note,
    )
    host_call(lambda: _wit.publish(event))


def normal(regarding: Any, reason: str, action: str, note: str) -> None:
    """A ``Normal`` event: ``events.normal(cm, "Mirrored", "Sync", "copies created in [a]")``."""
    publish(regarding, "normal", reason, action, note)


def warning(regarding: Any, reason: str, action: str, note: str) -> None:
    """A ``Warning`` event."""
    publish(regarding, "warning", reason, action, note)
