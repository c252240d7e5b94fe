"""The wasmctrl guest SDK for Python plugins (built with componentize-py).

::

    from wasmctrl_guest import Action, CONFIG_MAP, Target, client, export_plugin, log

    class Stamp:
        for_kind = CONFIG_MAP

        def __init__(self, settings):
            pass

        def reconcile(self, target: Target):
            request, cm = target.request, target.object
            if cm is None or "stamped" in cm.get("data", {}):
                return Action.DONE  # gone, or already stamped
            client.patch(CONFIG_MAP, request.namespace, request.name, {"data": {"stamped": "yes"}})
            log.info(f"stamped {request.name}")
            return Action.DONE

    Reconciler = export_plugin(Stamp)
"""

from . import cache, client, config, events, finalizers, log
from .errors import HostError, RetryableError, TerminalError, context, ignore_not_found
from .objects import (
    CONFIG_MAP,
    NAMESPACE,
    SECRET,
    ConfigMap,
    Kind,
    KubeObject,
    Namespace,
    ObjectMeta,
    Secret,
    annotation,
    is_being_deleted,
    key,
    label,
    meta,
    name,
    namespace,
)
from .plugin import Action, FilterInput, Gvk, Request, Target, export_plugin


def request_for(o: KubeObject) -> Request:
    """The reconcile request for ``o``."""
    return Request(namespace=namespace(o), name=name(o))


__all__ = [
    "Action",
    "CONFIG_MAP",
    "ConfigMap",
    "FilterInput",
    "Gvk",
    "HostError",
    "Kind",
    "KubeObject",
    "NAMESPACE",
    "Namespace",
    "ObjectMeta",
    "Request",
    "RetryableError",
    "SECRET",
    "Secret",
    "Target",
    "TerminalError",
    "annotation",
    "cache",
    "client",
    "config",
    "context",
    "events",
    "export_plugin",
    "finalizers",
    "ignore_not_found",
    "is_being_deleted",
    "key",
    "label",
    "log",
    "meta",
    "name",
    "namespace",
    "request_for",
]
