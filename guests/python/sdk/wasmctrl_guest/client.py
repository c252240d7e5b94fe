"""Writes (and live reads) through the host's Kubernetes client.

Every call is checked against the plugin's ``permissions.write`` and carries its field
manager; failures raise ``HostError``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, TypeVar

from wit_world.imports import client as _wit
from wit_world.imports import types as _types

from .errors import host_call
from .objects import Kind, decode, encode

T = TypeVar("T")

PatchType = Literal["merge", "json", "strategic"]


def _gvk(kind: Kind) -> _types.Gvk:
    return _types.Gvk(api_version=kind.api_version, kind=kind.kind)


def _body(body: Any, patch_type: PatchType) -> _wit.PatchBody:
    data = encode(body)
    if patch_type == "merge":
        return _wit.PatchBody_Merge(data)
    if patch_type == "json":
        return _wit.PatchBody_Json(data)
    if patch_type == "strategic":
        return _wit.PatchBody_Strategic(data)
    raise ValueError(f"unknown patch type {patch_type!r} (merge, json or strategic)")


def get(kind: Kind[T], namespace: Optional[str], name: str) -> T:
    """Reads the object from the API server, bypassing the cache."""
    return decode(host_call(lambda: _wit.get(_gvk(kind), namespace, name)))


def create(obj: T) -> T:
    """Creates ``obj``; returns the stored object."""
    return decode(host_call(lambda: _wit.create(encode(obj))))


def replace(obj: T) -> T:
    """Replaces the object; its ``metadata.resourceVersion``, when set, makes this a compare-and-swap."""
    return decode(host_call(lambda: _wit.replace(encode(obj))))


def patch(kind: Kind[T], namespace: Optional[str], name: str, body: Any, patch_type: PatchType = "merge") -> T:
    """Patches the object's main resource (a merge patch unless ``patch_type`` says otherwise)."""
    return decode(host_call(lambda: _wit.patch(_gvk(kind), namespace, name, _body(body, patch_type))))


def patch_status(kind: Kind[T], namespace: Optional[str], name: str, body: Any, patch_type: PatchType = "merge") -> T:
    """Patches the object's ``status`` subresource."""
    return decode(host_call(lambda: _wit.patch_status(_gvk(kind), namespace, name, _body(body, patch_type))))


def update_status(obj: T) -> T:
    """Replaces the object's ``status`` subresource."""
    return decode(host_call(lambda: _wit.update_status(encode(obj))))


def apply(obj: T, *, force: bool = False, dry_run: bool = False, field_manager: Optional[str] = None) -> T:
    """Server-side apply of a (partial) object, with the plugin's field manager unless given."""
    options = _wit.ApplyOptions(force=force, dry_run=dry_run, field_manager=field_manager)
    return decode(host_call(lambda: _wit.apply(encode(obj), options)))


def delete(
    kind: Kind,
    namespace: Optional[str],
    name: str,
    *,
    uid: Optional[str] = None,
    resource_version: Optional[str] = None,
    propagation: Optional[Literal["background", "foreground", "orphan"]] = None,
) -> None:
    """Deletes the object (an object with finalizers is only marked for deletion). A missing
    object raises a not-found ``HostError``, as in every SDK; where absence is fine, wrap the
    call: ``ignore_not_found(lambda: client.delete(...))``."""
    prop = None if propagation is None else _wit.Propagation[propagation.upper()]
    options = _wit.DeleteOptions(uid=uid, resource_version=resource_version, propagation=prop)
    host_call(lambda: _wit.delete(_gvk(kind), namespace, name, options))
