"""An admitting plugin for the host's admission tests (host/tests/admission.rs), the
Python twin of guests/test-plugins/admission: on ConfigMaps,

- ``validate`` warns ``validated by <stamp>``; refuses ``data.deny`` (403, its value as the
  message) and ``data.invalid`` (422); ``data.throw`` raises (the call traps);
  ``data.unique`` is refused when another cached ConfigMap of the namespace has the same
  value;
- ``mutate`` labels ``stamp=<stamp>`` and warns ``mutated by <stamp>``.

``stamp`` comes from ``[settings]``.
"""

from wasmctrl_guest import CONFIG_MAP, Action, cache, export_plugin, key, name
from wasmctrl_guest.admission import Denied, export_mutator, export_validator


class Admit:
    for_kind = CONFIG_MAP

    def __init__(self, settings):
        self.stamp = settings.get("stamp", "")

    def reconcile(self, target):
        return Action.DONE

    def validate(self, request):
        request.warn(f"validated by {self.stamp}")
        data = (request.object or {}).get("data") or {}
        if "deny" in data:
            raise Denied(data["deny"])
        if "invalid" in data:
            raise Denied.invalid("data.invalid is not allowed")
        if "throw" in data:
            raise KeyError("validate raised on purpose")
        if "unique" in data:
            for other in cache.list_objects(CONFIG_MAP, request.namespace):
                if (other.get("data") or {}).get("unique") == data["unique"] and name(other) != request.name:
                    raise Denied(f"unique value {data['unique']} is taken by {key(other)}")

    def mutate(self, request):
        cm = request.object
        cm.setdefault("metadata", {}).setdefault("labels", {})["stamp"] = self.stamp
        request.warn(f"mutated by {self.stamp}")
        return cm


Reconciler = export_plugin(Admit)
Validator = export_validator(Admit)
Mutator = export_mutator(Admit)
