"""A fake host for testing a plugin natively: an in-memory stand-in for the host's imports
(cache, client, events, log, config), the Python twin of the TypeScript SDK's
``@wasmctrl/guest/testing``::

    import unittest
    from wit_world.imports import types
    from wasmctrl_guest.testing import FakeHost
    import app

    class StampTest(unittest.TestCase):
        def test_stamps(self):
            host = FakeHost().install()
            host.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "default"}})
            r = app.Reconciler()
            r.init(host.settings_json({"value": "yes"}))
            r.reconcile(types.Request(namespace="default", name="a"))
            self.assertEqual(host.writes, ["patch default/a"])

The SDK imports the bindings componentize-py generates for ``wit/`` (``wit_world``,
``componentize_py_types``); a native test puts them on ``sys.path`` first
(``componentize-py --wit-path wit --world plugin bindings DIR``). ``install`` replaces
their import functions; the rest (records, variants, ``Err``) is used as is.

Invariants:
- One store: objects live in one dict keyed by (apiVersion, kind, namespace, name); the
  cache reads it and the client writes it, so a write is visible to the next read (the real
  host's cache catches up with a watch; a test that needs the lag edits the store).
- Every successful write is recorded in ``writes`` as ``"<verb> <namespace>/<name>"``
  (create, replace, patch, patch-status, update-status, apply, delete), every Event in
  ``events``, every log line in ``logs``; a refused write records nothing.
- Writes follow the API server where the SDK relies on it: a resourceVersion or uid that no
  longer matches is a ``conflict``, a missing object ``not-found``, an existing one on create
  ``already-exists``; deleting an object with finalizers marks it (``deletionTimestamp``),
  and removing the last finalizer of a marked object deletes it. Only merge patches are
  modelled (a JSON or strategic patch is ``invalid``), and apply is approximated as a merge
  patch (or a create).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from componentize_py_types import Err
from wit_world.imports import cache, client, config, events, log, types

Key = Tuple[str, str, Optional[str], str]
#: An index: the annotation key whose value an object is indexed under, or a function
#: returning the values.
Index = Union[str, Callable[[dict], List[str]]]


class FakeHost:
    """The in-memory host. See the module's documentation."""

    def __init__(
        self,
        indexes: Optional[Dict[str, Index]] = None,
        plugin_name: str = "test-plugin",
        settings: Any = None,
    ) -> None:
        self.objects: Dict[Key, dict] = {}
        self.events: List[Any] = []
        self.logs: List[Tuple[Any, str, List[Tuple[str, str]]]] = []
        self.writes: List[str] = []
        self.indexes: Dict[str, Index] = indexes or {}
        self.plugin_name = plugin_name
        self.settings = {} if settings is None else settings
        self._failures: List[Tuple[str, Any]] = []
        self._rv = 100
        self._uids = 0

    # -- the store ----------------------------------------------------------------------
    def put(self, obj: dict) -> dict:
        """Stores a copy of ``obj`` (a new resourceVersion; a uid when it has none); returns it."""
        obj = copy.deepcopy(obj)
        m = obj.setdefault("metadata", {})
        if "uid" not in m:
            self._uids += 1
            m["uid"] = f"uid-{self._uids}"
        self._rv += 1
        m["resourceVersion"] = str(self._rv)
        self.objects[_key(obj)] = obj
        return copy.deepcopy(obj)

    def get(self, api_version: str, kind: str, ns: Optional[str], name: str) -> Optional[dict]:
        """A copy of the stored object, or ``None``."""
        o = self.objects.get((api_version, kind, ns, name))
        return None if o is None else copy.deepcopy(o)

    def remove(self, api_version: str, kind: str, ns: Optional[str], name: str) -> bool:
        """Removes the object from the store at once (as if the API server had deleted it)."""
        return self.objects.pop((api_version, kind, ns, name), None) is not None

    def fail_next(self, op: str, error: Any) -> None:
        """Makes the next call of ``op`` (``"cache.get"``, ``"cache.list"``, ``"cache.by-index"``,
        ``"get"``, ``"create"``, ``"replace"``, ``"patch"``, ``"patch-status"``, ``"update-status"``,
        ``"apply"``, ``"delete"``, ``"publish"``) fail with ``error``, e.g.
        ``types.Error_Conflict("changed")``."""
        self._failures.append((op, error))

    def settings_json(self, settings: Any = None) -> bytes:
        """The JSON bytes of ``settings``, as the host hands them to ``Reconciler.init``."""
        if settings is not None:
            self.settings = settings
        return json.dumps(self.settings).encode()

    def _check(self, op: str) -> None:
        for i, (failing, error) in enumerate(self._failures):
            if failing == op:
                del self._failures[i]
                raise Err(error)

    def _of(self, kind: Any, ns: Optional[str] = None) -> List[dict]:
        return [
            copy.deepcopy(o)
            for (av, k, ons, _), o in sorted(self.objects.items(), key=lambda kv: str(kv[0]))
            if (av, k) == (kind.api_version, kind.kind) and (ns is None or ons == ns)
        ]

    def _existing(self, kind: Any, ns: Optional[str], name: str) -> dict:
        o = self.get(kind.api_version, kind.kind, ns, name)
        if o is None:
            raise Err(types.Error_NotFound(f"{kind.kind} {ns or ''}/{name}"))
        return o

    def _store(self, o: dict) -> dict:
        m = o["metadata"]
        if m.get("deletionTimestamp") and not m.get("finalizers"):
            self.objects.pop(_key(o), None)
            return o
        return self.put(o)

    def _write(self, verb: str, ns: Optional[str], name: str) -> None:
        self.writes.append(f"{verb} {ns or ''}/{name}")

    # -- the imports ----------------------------------------------------------------------
    def install(self) -> "FakeHost":
        """Replaces the bindings' import functions with this host's; returns the host."""
        enc = lambda o: json.dumps(o).encode()  # noqa: E731

        def c_get(kind, ns, name):
            self._check("cache.get")
            o = self.get(kind.api_version, kind.kind, ns, name)
            return None if o is None else enc(o)

        def c_list(kind, ns, selector):
            self._check("cache.list")
            return [enc(o) for o in self._of(kind, ns) if _selects(selector, o["metadata"].get("labels") or {})]

        def c_by_index(kind, index, value):
            self._check("cache.by-index")
            if index == "namespace":
                values: Callable[[dict], List[str]] = lambda o: [o["metadata"]["namespace"]] if o["metadata"].get("namespace") else []  # noqa: E731
            elif index in self.indexes:
                ix = self.indexes[index]
                values = ix if callable(ix) else (lambda o, ann=ix: [v] if (v := (o["metadata"].get("annotations") or {}).get(ann)) else [])
            else:
                raise Err(types.Error_Invalid(f"no index {index} (pass it to FakeHost's `indexes`)"))
            return [enc(o) for o in self._of(kind) if value in values(o)]

        def w_get(kind, ns, name):
            self._check("get")
            return enc(self._existing(kind, ns, name))

        def w_create(data):
            self._check("create")
            o = json.loads(data)
            if _key(o) in self.objects:
                raise Err(types.Error_AlreadyExists(f"{o['kind']} {o['metadata'].get('namespace') or ''}/{o['metadata']['name']} already exists"))
            o["metadata"].pop("resourceVersion", None)
            stored = self.put(o)
            self._write("create", o["metadata"].get("namespace"), o["metadata"]["name"])
            return enc(stored)

        def replace_with(verb, data, status):
            self._check(verb)
            o = json.loads(data)
            m = o["metadata"]
            cur = self._existing(types.Gvk(o["apiVersion"], o["kind"]), m.get("namespace"), m["name"])
            _check_version(cur, m.get("resourceVersion"))
            if status:
                nxt = {**cur, "status": o.get("status")}
            else:
                nxt = {**o, "metadata": {**m, "uid": cur["metadata"]["uid"]}}
                nxt.pop("status", None)
                if "status" in cur:
                    nxt["status"] = cur["status"]
            stored = self._store(nxt)
            self._write(verb, m.get("namespace"), m["name"])
            return enc(stored)

        def patch_with(verb, kind, ns, name, body):
            self._check(verb)
            cur = self._existing(kind, ns, name)
            if not isinstance(body, client.PatchBody_Merge):
                raise Err(types.Error_Invalid(f"the fake host models merge patches only, not {type(body).__name__}"))
            patch = json.loads(body.value)
            _check_version(cur, (patch.get("metadata") or {}).get("resourceVersion"))
            if verb == "patch":
                nxt = _merge(copy.deepcopy(cur), {k: v for k, v in patch.items() if k != "status"})
            else:
                nxt = {**cur, "status": _merge(copy.deepcopy(cur.get("status")), patch.get("status") or {})}
            stored = self._store(nxt)
            self._write(verb, ns, name)
            return enc(stored)

        def w_apply(data, options):
            self._check("apply")
            o = json.loads(data)
            m = o["metadata"]
            cur = self.get(o["apiVersion"], o["kind"], m.get("namespace"), m["name"])
            stored = self.put(o) if cur is None else self._store(_merge(cur, o))
            self._write("apply", m.get("namespace"), m["name"])
            return enc(stored)

        def w_delete(kind, ns, name, options):
            self._check("delete")
            cur = self._existing(kind, ns, name)
            if options.uid is not None and options.uid != cur["metadata"]["uid"]:
                raise Err(types.Error_Conflict(f"{name}: uid {options.uid} is not the object's"))
            _check_version(cur, options.resource_version)
            if cur["metadata"].get("finalizers"):
                if not cur["metadata"].get("deletionTimestamp"):
                    cur["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                    self.put(cur)
            else:
                self.objects.pop(_key(cur), None)
            self._write("delete", ns, name)

        def publish(event):
            self._check("publish")
            self.events.append(event)

        cache.get, cache.list, cache.by_index = c_get, c_list, c_by_index
        client.get, client.create, client.apply, client.delete = w_get, w_create, w_apply, w_delete
        client.replace = lambda data: replace_with("replace", data, False)
        client.update_status = lambda data: replace_with("update-status", data, True)
        client.patch = lambda kind, ns, name, body: patch_with("patch", kind, ns, name, body)
        client.patch_status = lambda kind, ns, name, body: patch_with("patch-status", kind, ns, name, body)
        events.publish = publish
        log.log = lambda level, message, fields: self.logs.append((level, message, fields))
        log.enabled = lambda level: True
        config.plugin_name = lambda: self.plugin_name
        config.settings = lambda: enc(self.settings)
        return self


def _key(obj: dict) -> Key:
    m = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], m.get("namespace"), m["name"])


def _check_version(cur: dict, resource_version: Optional[str]) -> None:
    if resource_version is not None and resource_version != cur["metadata"]["resourceVersion"]:
        raise Err(types.Error_Conflict(f"{cur['metadata']['name']}: resourceVersion {resource_version} is not the latest"))


def _selects(selector: Optional[str], labels: Dict[str, str]) -> bool:
    """Whether ``labels`` match ``selector``: the equality-based requirements (``k=v``,
    ``k==v``, ``k!=v``, ``k``, ``!k``, comma-joined). Set-based ones (``in``, ``notin``) are not
    modelled and fail as ``invalid``, so a test never passes on a selector the fake misread."""
    if not selector or not selector.strip():
        return True
    for raw in selector.split(","):
        part = raw.strip()
        if " in " in part or " notin " in part or part.endswith(")"):
            raise Err(types.Error_Invalid(f"the fake host does not model set-based selectors: {part}"))
        if "!=" in part:
            k, v = part.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in part:
            k, v = part.split("=", 1)
            if labels.get(k.strip()) != v.lstrip("=").strip():
                return False
        elif part.startswith("!"):
            if part[1:].strip() in labels:
                return False
        elif part not in labels:
            return False
    return True


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
