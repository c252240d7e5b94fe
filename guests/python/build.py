"""Builds every Python guest into a WebAssembly component.

Usage: python3 guests/python/build.py --tools VENV --out DIR [--wit DIR]

  --tools  a virtualenv holding componentize-py from guests/python/requirements.txt
           (`cargo xtask build-guests` creates it outside the clone)
  --out    where <plugin>.wasm files go
  --wit    the WIT package (default: wit/ of the repository)

First the SDK and the example's logic are tested natively (``tests/``, unittest) against
the bindings componentize-py generates for ``wit/``, on the SDK's fake host
(``wasmctrl_guest.testing``). Then each
plugin directory (examples/*, test-plugins/*, template) holds an ``app.py`` whose
``Reconciler`` is the component's export (and ``Validator`` / ``Mutator``, when it admits);
componentize-py bundles it with the SDK (sdk/wasmctrl_guest) and CPython into a component
of the world those names ask for: ``plugin``, or ``validating-plugin``, ``mutating-plugin``,
``admitting-plugin`` (the host reads the component's exports to know which webhooks it can
answer). The native tests use the bindings of ``admitting-plugin``, which has every
interface. A plugin is
rebuilt only when its inputs (its sources, the SDK, wit/, requirements.txt) changed since
the stamp next to its .wasm was written.
"""

import argparse
import ast
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def files(d: Path) -> list:
    if not d.is_dir():
        return []
    return [p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts]


def digest(paths: list) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def world_of(app: Path) -> str:
    """The world ``app.py``'s top-level names ask for."""
    names = set()
    for node in ast.parse(app.read_text(), str(app)).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    validates, mutates = "Validator" in names, "Mutator" in names
    if validates and mutates:
        return "admitting-plugin"
    if validates:
        return "validating-plugin"
    if mutates:
        return "mutating-plugin"
    return "plugin"


def main() -> int:
    ap = argparse.ArgumentParser(description="Build the Python guests of wasmctrl.")
    ap.add_argument("--tools", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--wit", default=ROOT / "wit", type=Path)
    args = ap.parse_args()
    tool = args.tools / ("Scripts" if os.name == "nt" else "bin") / "componentize-py"
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    wit = args.wit.resolve()

    plugins = [(d, f"{d.name}-py") for d in sorted((HERE / "examples").iterdir())]
    plugins += [(d, f"test-plugin-py-{d.name}") for d in sorted((HERE / "test-plugins").iterdir())]
    plugins.append((HERE / "template", "template-py"))
    shared = files(HERE / "sdk" / "wasmctrl_guest") + files(wit) + [HERE / "requirements.txt", HERE / "build.py"]

    bindings = out / ".bindings"
    # componentize-py refuses to write into an existing directory: start from an empty one.
    shutil.rmtree(bindings, ignore_errors=True)
    if subprocess.run([str(tool), "--wit-path", str(wit), "--world", "admitting-plugin", "bindings", str(bindings)]).returncode != 0:
        print("py-guests: componentize-py could not generate the bindings", file=sys.stderr)
        return 1
    path = os.pathsep.join(str(p) for p in (bindings, HERE / "sdk", HERE / "examples" / "configmap-mirror"))
    print("py-guests: python -m unittest discover -s tests", file=sys.stderr)
    tests = subprocess.run(
        [sys.executable, "-m", "unittest", "discover", "-s", str(HERE / "tests")],
        env={**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    if tests.returncode != 0:
        print("py-guests: the SDK's native tests failed", file=sys.stderr)
        return 1

    for d, name in plugins:
        if not (d / "app.py").is_file():
            continue
        wasm = out / f"{name}.wasm"
        stamp_file = out / f"{name}.stamp"
        stamp = digest(shared + files(d))
        if wasm.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
            print(f"py-guests: {name} is up to date", file=sys.stderr)
            continue
        tmp = out / f".{name}.wasm.tmp"
        cmd = [
            str(tool),
            "--wit-path",
            str(wit),
            "--world",
            world_of(d / "app.py"),
            "componentize",
            "app",
            "--python-path",
            str(HERE / "sdk"),
            "--python-path",
            str(d),
            "--output",
            str(tmp),
        ]
        print("py-guests: " + " ".join(cmd), file=sys.stderr)
        done = subprocess.run(cmd, cwd=d)
        if done.returncode != 0:
            print(f"py-guests: componentize-py failed for {name} (exit {done.returncode})", file=sys.stderr)
            return 1
        tmp.replace(wasm)
        stamp_file.write_text(stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
