"""The smallest wasmctrl plugin in Python, built with this repository's others (a new plugin
outside it: ``wasmctrl new NAME --lang python``, see ../README.md). This one stamps every
ConfigMap it is given with ``data.stamped = "yes"``.
"""

from wasmctrl_guest import CONFIG_MAP, Action, Target, client, export_plugin, log


class Stamp:
    # The kind this plugin was written for; must equal the TOML's [for].
    for_kind = CONFIG_MAP

    def __init__(self, settings: dict) -> None:
        # Raising here rejects the plugin version with the message.
        self.value = settings.get("value", "yes")

    def reconcile(self, target: Target) -> Action:
        # target.object is the cached ConfigMap, or None once it is deleted.
        request, cm = target.request, target.object
        if cm is None or cm.get("data", {}).get("stamped") == self.value:
            return Action.DONE  # deleted since it was queued, or already stamped
        client.patch(CONFIG_MAP, request.namespace, request.name, {"data": {"stamped": self.value}})
        log.info(f"stamped {request.namespace}/{request.name}", value=self.value)
        return Action.DONE


# componentize-py exports the class named after the WIT interface.
Reconciler = export_plugin(Stamp)
