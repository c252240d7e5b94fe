"""A plugin that misbehaves on request, for the host's isolation tests (for ConfigMaps).
``reconcile`` acts by the request's name:

- ``throw``: raises a KeyError (the SDK turns it into a retryable reconcile error);
- ``loop``: never returns (the call's deadline interrupts it);
- ``alloc``: allocates without bound (the instance's memory cap stops it);
- ``sandbox``: tries to read a file, list a directory, write a file and reach the network,
  and raises a RuntimeError telling how each attempt ended (the host grants none);
- anything else: returns ``done`` at once (the bare cost of a call).

``map`` raises, so a hook's exception traps its call.
"""

from wasmctrl_guest import CONFIG_MAP, Action, export_plugin


class Misbehave:
    for_kind = CONFIG_MAP

    def __init__(self, settings):
        pass

    def reconcile(self, target):
        request = target.request
        if request.name == "throw":
            return {}["missing"]
        if request.name == "loop":
            n = 0
            while True:
                n = (n + 1) % 7
        if request.name == "sandbox":
            raise RuntimeError("sandbox: " + "; ".join(_probe_sandbox()))
        if request.name == "alloc":
            hoard = []
            while True:
                hoard.append(bytearray(1 << 16))
        return Action.DONE

    def map(self, kind, obj):
        raise RuntimeError(f"map refuses {obj['metadata']['name']}")


def _probe_sandbox():
    import os

    def attempt(what, f):
        try:
            f()
            return f"{what} succeeded"
        except Exception as e:  # noqa: BLE001 - every failure is the answer
            return f"{what} failed: {type(e).__name__}: {e}"

    def write():
        with open("/tmp/wasmctrl-probe", "w") as f:
            f.write("x")

    def connect():
        # CPython for WASI may ship without the socket module; then this fails at import.
        import socket

        with socket.create_connection(("127.0.0.1", 9), timeout=1):
            pass

    return [
        attempt("open", lambda: open("/etc/hostname").read()),
        attempt("listdir", lambda: os.listdir("/")),
        attempt("write", write),
        attempt("connect", connect),
    ]


Reconciler = export_plugin(Misbehave)
