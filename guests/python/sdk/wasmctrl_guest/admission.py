"""Admission: a plugin class that also validates or mutates objects before the API server
stores them — the validating and mutating webhooks of a controller, in the same component
as its reconciler. The host serves them (the plugin TOML's ``[[admission]]`` sections say
which requests reach it)::

    from wasmctrl_guest.admission import Denied, export_mutator, export_validator

    class Policy:
        def __init__(self, settings): ...
        def reconcile(self, request): ...
        def validate(self, request):
            if not (request.object or {}).get("data"):
                raise Denied.invalid("data is required")
        def mutate(self, request):
            request.object.setdefault("metadata", {}).setdefault("labels", {})["tier"] = "web"
            return request.object

    Reconciler = export_plugin(Policy)
    Validator = export_validator(Policy)   # the names componentize-py looks for
    Mutator = export_mutator(Policy)

Defining ``Validator`` and/or ``Mutator`` in ``app.py`` builds the component of the
``validating-plugin``, ``mutating-plugin`` or ``admitting-plugin`` world (build.py picks it
from the module); the host reads from the component's exports which it has. Import this
module only in such a plugin: its bindings exist only in those worlds.

Invariants:
- Raising ``Denied`` refuses the request with its message and code; a ``HostError`` (a
  failed cache read, say) refuses it with the error's message, code 500. Any other
  exception is logged and re-raised: the call traps and the webhook's failure policy
  answers.
- A mutation is sent as the JSON patch from the object as received to the object
  ``mutate`` returned (or changed in place): objects key by key, lists whole.
- Warnings added with ``request.warn`` go to the client whatever the answer.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from wit_world import exports as _exports
from wit_world.exports import mutator as _mutator
from wit_world.imports import admission as _wit

from . import log
from .errors import HostError
from .objects import decode
from .plugin import current_plugin


class Denied(Exception):
    """Refuses a request: ``kubectl`` shows the message. ``code`` is the HTTP code (403 if None)."""

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    @staticmethod
    def invalid(message: str) -> "Denied":
        """Refused because the object is invalid (422)."""
        return Denied(message, 422)


@dataclass
class AdmissionRequest:
    """An admission request as the API server sent it (objects as dicts)."""

    uid: str
    kind: Any
    resource: str
    sub_resource: Optional[str]
    name: str
    namespace: Optional[str]
    operation: str  # CREATE, UPDATE, DELETE or CONNECT
    user_info: dict
    object: Optional[dict]
    old_object: Optional[dict]
    dry_run: bool
    options: Any
    warnings: List[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        """Adds a warning for the client, whatever the answer."""
        self.warnings.append(message)


_OPERATIONS = {
    _wit.Operation.CREATE: "CREATE",
    _wit.Operation.UPDATE: "UPDATE",
    _wit.Operation.DELETE: "DELETE",
    _wit.Operation.CONNECT: "CONNECT",
}


def _from_wit(r: Any) -> AdmissionRequest:
    u = r.user_info
    return AdmissionRequest(
        uid=r.uid,
        kind=r.kind,
        resource=r.resource,
        sub_resource=r.sub_resource,
        name=r.name,
        namespace=r.namespace,
        operation=_OPERATIONS[r.operation],
        user_info={"username": u.username, "uid": u.uid, "groups": list(u.groups), "extra": dict(u.extra)},
        object=None if r.object is None else decode(r.object),
        old_object=None if r.old_object is None else decode(r.old_object),
        dry_run=r.dry_run,
        options=None if r.options is None else decode(r.options),
    )


def _verdict(request: AdmissionRequest, what: str, f: Callable[[], None]) -> Any:
    try:
        f()
        denial = None
    except Denied as e:
        denial = _wit.Denial(message=e.message, code=e.code)
    except HostError as e:
        denial = _wit.Denial(message=str(e), code=500)
    except Exception as e:
        log.error(f"{what} raised", error=f"{type(e).__name__}: {e}", traceback="".join(traceback.format_exception(e)))
        raise
    return _wit.Verdict(denial=denial, warnings=list(request.warnings))


def _pointer(path: str, key: str) -> str:
    return path + "/" + key.replace("~", "~0").replace("/", "~1")


def diff(a: Any, b: Any, path: str = "") -> list:
    """The JSON patch from ``a`` to ``b``: dicts compared key by key, anything else (lists
    included) replaced whole when it differs. Written here rather than taken from a PyPI
    package: it is the one algorithm the SDK needs, and componentize-py bundles every import
    into each plugin."""
    if isinstance(a, dict) and isinstance(b, dict):
        ops = [{"op": "remove", "path": _pointer(path, k)} for k in a if k not in b]
        for k, v in b.items():
            if k not in a:
                ops.append({"op": "add", "path": _pointer(path, k), "value": v})
            else:
                ops.extend(diff(a[k], v, _pointer(path, k)))
        return ops
    return [] if a == b else [{"op": "replace", "path": path, "value": b}]


def export_validator(cls: type) -> type:
    """The ``Validator`` export class for ``cls`` (which must define ``validate(request)``)."""
    if not callable(getattr(cls, "validate", None)):
        raise TypeError(f"{cls.__name__} has no validate(request) method")

    class Validator(_exports.Validator):
        def validate(self, request: Any) -> Any:
            r = _from_wit(request)
            return _verdict(r, "validate", lambda: current_plugin().validate(r))

    return Validator


def export_mutator(cls: type) -> type:
    """The ``Mutator`` export class for ``cls`` (which must define ``mutate(request)``,
    returning the changed object or changing ``request.object`` in place)."""
    if not callable(getattr(cls, "mutate", None)):
        raise TypeError(f"{cls.__name__} has no mutate(request) method")

    class Mutator(_exports.Mutator):
        def mutate(self, request: Any) -> Any:
            r = _from_wit(request)
            before = None if request.object is None else decode(request.object)
            after: dict = {}

            def run() -> None:
                if r.operation in ("CREATE", "UPDATE"):
                    returned = current_plugin().mutate(r)
                    after["object"] = returned if returned is not None else r.object

            verdict = _verdict(r, "mutate", run)
            patch = None
            if verdict.denial is None and before is not None and after.get("object") is not None:
                ops = diff(before, after["object"])
                patch = json.dumps(ops).encode() if ops else None
            return _mutator.Mutation(verdict=verdict, patch=patch)

    return Mutator
