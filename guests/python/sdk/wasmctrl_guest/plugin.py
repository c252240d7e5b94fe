"""Turns a plugin class into the ``Reconciler`` export the host calls.

A plugin is a class whose constructor receives the ``[settings]`` table (a dict) and whose
``reconcile(request)`` returns an ``Action`` (or ``None``, meaning done). The optional hooks
``on_add``, ``on_update``, ``on_delete``, ``map`` and ``filter`` are declared to the host
exactly when the class defines them, and the class attribute ``for_kind`` names the kind
the plugin was written for (the host refuses a TOML whose ``[for]`` differs)::

    class Stamp:
        for_kind = CONFIG_MAP
        def __init__(self, settings): ...
        def reconcile(self, request): ...

    Reconciler = export_plugin(Stamp)   # the name componentize-py looks for

Invariants:
- ``init`` constructs one plugin object per instance; a constructor that raises rejects
  this version of the plugin with the exception's message.
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

from . import log
from .errors import HostError, RetryableError, TerminalError
from .objects import Kind, decode

T = TypeVar("T")

Request = _types.Request
Gvk = _types.Gvk


@dataclass(frozen=True)
class Action:
    """How a reconcile ended well: ``Action.DONE``, ``Action.REQUEUE``, ``Action.after(ms)``."""

    type: str
    ms: int = 0

    @staticmethod
    def after(ms: float) -> "Action":
        """Reconcile again after ``ms`` milliseconds."""
        return Action("requeue-after", max(0, int(ms)))


Action.DONE = Action("done")  # type: ignore[attr-defined]
Action.REQUEUE = Action("requeue")  # type: ignore[attr-defined]


@dataclass(frozen=True)
class FilterInput:
    """A filter question: ``type`` is create, update or delete; ``old`` only for update."""

    type: str
    object: Any
    old: Any = None


def _result(action: Optional[Action]) -> Any:
    if action is None or action.type == "done":
        return _wit.ReconcileResult_Done()
    if action.type == "requeue":
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
            try:
                state["plugin"] = cls(decode(settings))
                _current["plugin"] = state["plugin"]
            except Exception as e:
                raise Err(str(e) or type(e).__name__) from None
            gvk = None if for_kind is None else _types.Gvk(api_version=for_kind.api_version, kind=for_kind.kind)
            return _wit.PluginInfo(hooks=hooks, for_kind=gvk)

        def reconcile(self, request: _types.Request) -> Any:
            try:
                action = plugin().reconcile(request)
            except Exception as e:
                raise Err(_reconcile_error(e)) from None
            return _result(action)

        def on_add(self, kind: _types.Gvk, object: bytes, in_initial_list: bool) -> None:
            _hook("on_add", lambda: plugin().on_add(kind, decode(object), in_initial_list))

        def on_update(self, kind: _types.Gvk, old: bytes, new: bytes) -> None:
            _hook("on_update", lambda: plugin().on_update(kind, decode(old), decode(new)))

        def on_delete(self, kind: _types.Gvk, object: bytes, final_state_unknown: bool) -> None:
            _hook("on_delete", lambda: plugin().on_delete(kind, decode(object), final_state_unknown))

        def map(self, kind: _types.Gvk, object: bytes) -> list:
            return _hook("map", lambda: plugin().map(kind, decode(object)) or [])

        def filter(self, kind: _types.Gvk, event: Any) -> bool:
            return _hook("filter", lambda: bool(plugin().filter(kind, _filter_input(event))))

    return Reconciler
