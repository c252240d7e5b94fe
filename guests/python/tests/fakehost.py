"""An in-memory stand-in for the host's imports, so the SDK and the example plugins run
natively under unittest: objects live in one dict keyed by (apiVersion, kind, namespace,
name); the cache and the client both read and write it; events and log lines are recorded.

The bindings (``wit_world``) are the ones componentize-py generates for ``wit/``; their
import functions are replaced here, the rest (records, variants, ``Err``) is used as is.
"""

import copy
import json
from typing import Any, Dict, List, Optional, Tuple

from componentize_py_types import Err
from wit_world.imports import cache, client, events, log, types

Key = Tuple[str, str, Optional[str], str]


class FakeHost:
    def __init__(self, indexes: Optional[Dict[str, str]] = None) -> None:
        self.objects: Dict[Key, dict] = {}
        self.events: List[Any] = []
        self.logs: List[Tuple[Any, str, List[Tuple[str, str]]]] = []
        self.writes: List[str] = []
        self.indexes = indexes or {}  # index name -> annotation key
        self._rv = 100

    # -- fixtures ---------------------------------------------------------------------
    def put(self, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        m = obj.setdefault("metadata", {})
        m.setdefault("uid", f"uid-{m.get('namespace')}-{m['name']}")
        self._rv += 1
        m["resourceVersion"] = str(self._rv)
        self.objects[self._key(obj)] = obj
        return obj

    def get(self, api_version: str, kind: str, ns: Optional[str], name: str) -> Optional[dict]:
        return self.objects.get((api_version, kind, ns, name))

    @staticmethod
    def _key(obj: dict) -> Key:
        m = obj["metadata"]
        return (obj["apiVersion"], obj["kind"], m.get("namespace"), m["name"])

    # -- imports ----------------------------------------------------------------------
    def install(self) -> None:
        enc = lambda o: json.dumps(o).encode()  # noqa: E731

        def c_get(kind, ns, name):
            o = self.get(kind.api_version, kind.kind, ns, name)
            return None if o is None else enc(o)

        def c_list(kind, ns, selector):
            out = []
            for (av, k, ons, _), o in sorted(self.objects.items(), key=lambda kv: str(kv[0])):
                if (av, k) != (kind.api_version, kind.kind) or (ns is not None and ons != ns):
                    continue
                if selector:
                    want = dict(p.split("=", 1) for p in selector.split(","))
                    labels = o["metadata"].get("labels") or {}
                    if any(labels.get(lk) != lv for lk, lv in want.items()):
                        continue
                out.append(enc(o))
            return out

        def c_by_index(kind, index, value):
            if index not in self.indexes:
                raise Err(types.Error_Invalid(f"no index {index}"))
            ann = self.indexes[index]
            return [
                enc(o)
                for (av, k, _, _), o in sorted(self.objects.items(), key=lambda kv: str(kv[0]))
                if (av, k) == (kind.api_version, kind.kind) and (o["metadata"].get("annotations") or {}).get(ann) == value
            ]

        def w_create(data):
            o = json.loads(data)
            if self._key(o) in self.objects:
                raise Err(types.Error_AlreadyExists(f"{o['metadata']['name']} exists"))
            self.writes.append(f"create {o['metadata'].get('namespace')}/{o['metadata']['name']}")
            return enc(self.put(o))

        def w_replace(data):
            o = json.loads(data)
            cur = self.objects.get(self._key(o))
            if cur is None:
                raise Err(types.Error_NotFound(o["metadata"]["name"]))
            rv = o["metadata"].get("resourceVersion")
            if rv is not None and rv != cur["metadata"]["resourceVersion"]:
                raise Err(types.Error_Conflict("resourceVersion changed"))
            self.writes.append(f"replace {o['metadata'].get('namespace')}/{o['metadata']['name']}")
            return enc(self.put(o))

        def w_patch(kind, ns, name, body):
            cur = self.get(kind.api_version, kind.kind, ns, name)
            if cur is None:
                raise Err(types.Error_NotFound(name))
            if not isinstance(body, client.PatchBody_Merge):
                raise Err(types.Error_Invalid("only merge patches are faked"))
            patch = json.loads(body.value)
            rv = (patch.get("metadata") or {}).get("resourceVersion")
            if rv is not None and rv != cur["metadata"]["resourceVersion"]:
                raise Err(types.Error_Conflict("resourceVersion changed"))
            self.writes.append(f"patch {ns}/{name}")
            merged = _merge(copy.deepcopy(cur), patch)
            if merged["metadata"].get("deletionTimestamp") and not merged["metadata"].get("finalizers"):
                del self.objects[self._key(cur)]
                return enc(merged)
            return enc(self.put(merged))

        def w_delete(kind, ns, name, options):
            cur = self.get(kind.api_version, kind.kind, ns, name)
            if cur is None:
                raise Err(types.Error_NotFound(name))
            if options.uid is not None and options.uid != cur["metadata"]["uid"]:
                raise Err(types.Error_Conflict("uid precondition"))
            self.writes.append(f"delete {ns}/{name}")
            if cur["metadata"].get("finalizers"):
                cur["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            else:
                del self.objects[self._key(cur)]

        cache.get, cache.list, cache.by_index = c_get, c_list, c_by_index
        client.create, client.replace, client.patch, client.delete = w_create, w_replace, w_patch, w_delete
        events.publish = self.events.append
        log.log = lambda level, message, fields: self.logs.append((level, message, fields))
        log.enabled = lambda level: True


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 merge."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = _merge(target.get(k), v)
    return target
