"""A plugin that misbehaves on request, for the host's isolation tests. ``reconcile`` acts
by the request's name:

- ``throw``: raises a KeyError (the SDK turns it into a retryable reconcile error);
- ``loop``: never returns (the call's deadline interrupts it);
- ``alloc``: allocates without bound (the instance's memory cap stops it);
- anything else: returns ``done`` at once (the bare cost of a call).

``map`` raises, so a hook's exception traps its call.
"""

from wasmctrl_guest import Action, export_plugin


class Misbehave:
    def __init__(self, settings):
        pass

    def reconcile(self, request):
        if request.name == "throw":
            return {}["missing"]
        if request.name == "loop":
            n = 0
            while True:
                n = (n + 1) % 7
        if request.name == "alloc":
            hoard = []
            while True:
                hoard.append(bytearray(1 << 16))
        return Action.DONE

    def map(self, kind, obj):
        raise RuntimeError(f"map refuses {obj['metadata']['name']}")


Reconciler = export_plugin(Misbehave)
