"""Turns a plugin class into the ``Reconciler`` export the host calls.

A plugin is a class whose constructor receives the ``[settings]`` table (a dict), whose
class attribute ``for_kind`` names the kind the plugin was written for (the host refuses a
TOML whose ``[for]`` differs), and whose ``reconcile(target)`` returns an ``Action`` (or
``None``, meaning done). The optional hooks ``on_add``, ``on_update``, ``on_delete``,
``map`` and ``filter`` are declared to the host exactly when the class defines them::

    class Stamp:
        for_kind = CONFIG_MAP
        def __init__(self, settings): ...
        def reconcile(self, target: Target): ...

    Reconciler = export_plugin(Stamp)   # the name componentize-py looks for

Invariants:
- ``init`` constructs one plugin object per instance; a constructor that raises, or a
  class without ``for_kind``, rejects this version of the plugin with the message.
- ``reconcile`` is handed a ``Target``: the SDK reads the queued key's ``for_kind`` object
  from the host's cache first (as the Rust SDK does), so ``target.object`` is the object as
  cached when the call started, or ``None`` when the cache has none (it was deleted). A
  failed cache read ends the call with the ``HostError``'s outcome before the plugin runs.
- ``reconcile`` never lets an exception reach the component boundary: ``RetryableError``
  and ``TerminalError`` map to their WIT cases, a ``HostError`` to retryable or terminal by
  its kind, anything else to retryable with the exception's message (logged with its
  traceback).
- Hooks are not ``result``s in the WIT: an exception there is logged, then re-raised, which
  traps the call; the host discards that instance.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

from componentize_py_types import Err
from wit_world import exports as _exports
from wit_world.exports import reconciler as _wit
from wit_world.imports import types as _types

from . import cache, log
from .errors import HostError, RetryableError, TerminalError
from .objects import Kind, decode

T = TypeVar("T")

Request = _types.Request
Gvk = _types.Gvk


@dataclass(frozen=True)
class Target:
    """What ``reconcile`` is handed, the Python form of the Rust SDK's ``Target``: the request
    being reconciled and its object as the host's cache has it -- ``None`` when the cache has
    no object under that key, because it was deleted (or never existed)."""

    #: The key being reconciled (``namespace``, ``name``).
    request: Request
    #: The cached object; ``None`` when it is gone: clean up whatever it left behind.
    object: Optional[Any]


@dataclass(frozen=True)
class Action:
    """How a reconcile ended well: ``Action.DONE``, ``Action.REQUEUE``, ``Action.after(ms)``."""

    outcome: str
    ms: int = 0

    @staticmethod
    def after(ms: float) -> "Action":
        """Reconcile again after ``ms`` milliseconds."""
        return Action("requeue-after", max(0, int(ms)))


Action.DONE = Action("done")  # type: ignore[attr-defined]
Action.REQUEUE = Action("requeue")  # type: ignore[attr-defined]


@dataclass(frozen=True)
class FilterInput:
    """A filter question: ``event`` is create, update or delete; ``old`` only for update."""

    event: str
    object: Any
    old: Any = None


def _result(action: Optional[Action]) -> Any:
    if action is None or action.outcome == "done":
        return _wit.ReconcileResult_Done()
    if action.outcome == "requeue":
        return _wit.ReconcileResult_Requeue()
    return _wit.ReconcileResult_RequeueAfterMs(action.ms)


def _reconcile_error(e: BaseException) -> Any:
    if isinstance(e, TerminalError):
        return _wit.ReconcileError_Terminal(str(e))
    if isinstance(e, RetryableError):
        return _wit.ReconcileError_Retryable(str(e))
    if isinstance(e, HostError):
        case = _wit.ReconcileError_Retryable if e.retryable else _wit.ReconcileError_Terminal
        return case(str(e))
    message = f"{type(e).__name__}: {e}"
    log.error("reconcile raised", error=message, traceback="".join(traceback.format_exception(e)))
    return _wit.ReconcileError_Retryable(message)


def _target(kind: Kind, request: Request) -> Target:
    """Reads the request's object of ``kind`` from the cache (a failure names the key)."""
    try:
        return Target(request=request, object=cache.get(kind, request.namespace, request.name))
    except HostError as e:
        key = request.name if request.namespace is None else f"{request.namespace}/{request.name}"
        message = f"reading {kind.kind} {key} from the cache: {e}"
        raise (RetryableError(message) if e.retryable else TerminalError(message)) from None


def _hook(name: str, f: Callable[[], T]) -> T:
    try:
        return f()
    except Exception as e:
        log.error(f"{name} raised", error=f"{type(e).__name__}: {e}", traceback="".join(traceback.format_exception(e)))
        raise


def _filter_input(event: Any) -> FilterInput:
    if isinstance(event, _wit.FilterEvent_Create):
        return FilterInput("create", decode(event.value))
    if isinstance(event, _wit.FilterEvent_Update):
        return FilterInput("update", decode(event.value[1]), decode(event.value[0]))
    return FilterInput("delete", decode(event.value))


#: The plugin object ``init`` built in this instance (the admission exports use it too).
_current: dict = {}


def current_plugin() -> Any:
    """The plugin object of this instance; raises before ``init`` built it."""
    if "plugin" not in _current:
        raise RuntimeError("the host called the plugin before init")
    return _current["plugin"]


def export_plugin(cls: type) -> type:
    """The ``Reconciler`` export class for the plugin class ``cls``."""
    hooks = _wit.Hooks(0)
    for method, flag in (
        ("on_add", _wit.Hooks.ON_ADD),
        ("on_update", _wit.Hooks.ON_UPDATE),
        ("on_delete", _wit.Hooks.ON_DELETE),
        ("map", _wit.Hooks.MAP),
        ("filter", _wit.Hooks.FILTER),
    ):
        if callable(getattr(cls, method, None)):
            hooks |= flag
    for_kind: Optional[Kind] = getattr(cls, "for_kind", None)
    state: dict = {}

    def plugin() -> Any:
        if "plugin" not in state:
            raise RuntimeError("the host called the plugin before init")
        return state["plugin"]

    class Reconciler(_exports.Reconciler):
        def init(self, settings: bytes) -> _wit.PluginInfo:
            if for_kind is None:
                raise Err(f"{cls.__name__} has no `for_kind` (the kind it reconciles, e.g. CONFIG_MAP)")
            try:
                state["plugin"] = cls(decode(settings))
                _current["plugin"] = state["plugin"]
            except Exception as e:
                raise Err(str(e) or type(e).__name__) from None
            gvk = _types.Gvk(api_version=for_kind.api_version, kind=for_kind.kind)
            return _wit.PluginInfo(hooks=hooks, for_kind=gvk)

        def reconcile(self, request: _types.Request) -> Any:
            try:
                action = plugin().reconcile(_target(for_kind, request))
            except Exception as e:
                raise Err(_reconcile_error(e)) from None
            return _result(action)

        def on_add(self, kind: _types.Gvk, obj: bytes, in_initial_list: bool) -> None:
            _hook("on_add", lambda: plugin().on_add(kind, decode(obj), in_initial_list))

        def on_update(self, kind: _types.Gvk, old: bytes, new: bytes) -> None:
            _hook("on_update", lambda: plugin().on_update(kind, decode(old), decode(new)))

        def on_delete(self, kind: _types.Gvk, obj: bytes, final_state_unknown: bool) -> None:
            _hook("on_delete", lambda: plugin().on_delete(kind, decode(obj), final_state_unknown))

        def map(self, kind: _types.Gvk, obj: bytes) -> list:
            return _hook("map", lambda: plugin().map(kind, decode(obj)) or [])

        def filter(self, kind: _types.Gvk, event: Any) -> bool:
            return _hook("filter", lambda: bool(plugin().filter(kind, _filter_input(event))))

    return Reconciler
