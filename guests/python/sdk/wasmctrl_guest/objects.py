"""Kubernetes objects as plain dicts (the JSON the API server speaks), and the kinds that
name them.

A ``Kind`` is an ``(api_version, kind)`` pair; ``Kind[ConfigMap]`` carries the ``TypedDict``
of its objects for type checkers, so ``cache.get(CONFIG_MAP, ns, name)`` is an
``Optional[ConfigMap]``. The ``TypedDict``s here cover the metadata every object has and a
few core kinds; any other kind is ``Kind("example.com/v1", "Website")``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Generic, List, Optional, TypedDict, TypeVar

T = TypeVar("T")


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    creationTimestamp: str
    deletionTimestamp: str
    labels: Dict[str, str]
    annotations: Dict[str, str]
    finalizers: List[str]
    ownerReferences: List[Dict[str, Any]]


class KubeObject(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta


class ConfigMap(KubeObject, total=False):
    data: Dict[str, str]
    binaryData: Dict[str, str]
    immutable: bool


class Secret(KubeObject, total=False):
    type: str
    data: Dict[str, str]
    stringData: Dict[str, str]
    immutable: bool


class Namespace(KubeObject, total=False):
    spec: Dict[str, Any]
    status: Dict[str, Any]


@dataclass(frozen=True)
class Kind(Generic[T]):
    """A kind: ``Kind("apps/v1", "Deployment")``."""

    api_version: str
    kind: str

    def matches(self, gvk: Any) -> bool:
        """Whether a WIT ``gvk`` (``api_version``, ``kind``) names this kind."""
        return gvk.api_version == self.api_version and gvk.kind == self.kind


CONFIG_MAP: Kind[ConfigMap] = Kind("v1", "ConfigMap")
SECRET: Kind[Secret] = Kind("v1", "Secret")
NAMESPACE: Kind[Namespace] = Kind("v1", "Namespace")


def meta(o: Any) -> ObjectMeta:
    return o.get("metadata") or {}


def name(o: Any) -> str:
    return meta(o).get("name", "")


def namespace(o: Any) -> Optional[str]:
    return meta(o).get("namespace")


def key(o: Any) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object (as client-go keys objects)."""
    ns = namespace(o)
    return f"{ns}/{name(o)}" if ns else name(o)


def label(o: Any, k: str) -> Optional[str]:
    return (meta(o).get("labels") or {}).get(k)


def annotation(o: Any, k: str) -> Optional[str]:
    return (meta(o).get("annotations") or {}).get(k)


def is_being_deleted(o: Any) -> bool:
    """Whether ``metadata.deletionTimestamp`` is set."""
    return meta(o).get("deletionTimestamp") is not None


def encode(value: Any) -> bytes:
    """JSON bytes for the host."""
    return json.dumps(value, separators=(",", ":")).encode()


def decode(data: bytes) -> Any:
    """A value from the host's JSON bytes."""
    return json.loads(data)
