"""Reads from the host's informer caches: fast (no network), possibly slightly stale.

Only the kinds the plugin's TOML declares are readable; others raise a ``forbidden``
``HostError``.
"""

from __future__ import annotations

from typing import List, Optional, TypeVar

from wit_world.imports import cache as _wit
from wit_world.imports import types as _types

from .errors import host_call
from .objects import Kind, decode

T = TypeVar("T")


def _gvk(kind: Kind) -> _types.Gvk:
    return _types.Gvk(api_version=kind.api_version, kind=kind.kind)


def get(kind: Kind[T], namespace: Optional[str], name: str) -> Optional[T]:
    """The cached object, or ``None`` when the cache has none."""
    data = host_call(lambda: _wit.get(_gvk(kind), namespace, name))
    return None if data is None else decode(data)


def list_objects(kind: Kind[T], namespace: Optional[str] = None, label_selector: Optional[str] = None) -> List[T]:
    """Every cached object of ``kind``, optionally in ``namespace`` and matching ``label_selector``
    (``list`` in the Rust and TypeScript SDKs; named so as not to shadow the builtin)."""
    return [decode(b) for b in host_call(lambda: _wit.list(_gvk(kind), namespace, label_selector))]


def by_index(kind: Kind[T], index: str, value: str) -> List[T]:
    """Objects of ``kind`` whose index ``index`` (declared in the TOML, or ``namespace``) holds ``value``."""
    return [decode(b) for b in host_call(lambda: _wit.by_index(_gvk(kind), index, value))]
