"""The package's shape in numbers: files and lines per tier, names with more than one home, the largest
module and function, compare's parameters, and what ``import tricks_lib`` loads and costs.

    python benchmarks/package_shape.py

Tiers: the core (modules at the package root), ``report/`` (the main command and what it writes), and
the topic subpackages. A public name (one in a module's ``__all__``) has more than one home when two
modules list it, apart from a package's ``__init__`` listing its own modules' names.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tricks_lib"


def _tier(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    if len(parts) == 1:
        return "core"
    return "report" if parts[0] == "report" else f"topic {parts[0]}"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _all_of(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]
    return []


def _code_lines(node: ast.AST) -> int:
    """Lines of a function without its docstring."""
    lines = node.end_lineno - node.lineno + 1
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        doc = body[0]
        lines -= doc.end_lineno - doc.lineno + 1
    return lines


def shape() -> dict:
    files = sorted(p for p in PACKAGE.rglob("*.py"))
    tiers: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    homes: dict[str, set[str]] = defaultdict(set)
    largest_module, largest_function = ("", 0), ("", 0)
    for path in files:
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        tier = _tier(path)
        tiers[tier][0] += 1
        tiers[tier][1] += lines
        if lines > largest_module[1]:
            largest_module = (str(path.relative_to(PACKAGE.parent)), lines)
        tree = ast.parse(text)
        module = _module_name(path)
        for name in _all_of(tree):
            homes[name].add(module)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _code_lines(node)
                if n > largest_function[1]:
                    largest_function = (f"{path.relative_to(PACKAGE.parent)}:{node.name}", n)

    def own_reexport(package: str, module: str) -> bool:
        return module.startswith(package + ".")

    multi = {}
    for name, mods in homes.items():
        packages = {m for m in mods if (PACKAGE.parent / m.replace(".", "/") / "__init__.py").exists()}
        defining = {m for m in mods if m not in packages}
        # A package's __init__ re-exporting its own modules' names is allowed (one home and a face).
        extra = {p for p in packages if not all(own_reexport(p, d) for d in defining)} | (
            defining if len(defining) > 1 else set()
        )
        if extra:
            multi[name] = sorted(mods)
    return {
        "tiers": {k: {"files": v[0], "lines": v[1]} for k, v in sorted(tiers.items())},
        "root public modules": sum(1 for p in files if p.parent == PACKAGE and not p.name.startswith("_")),
        "names with more than one home": multi,
        "largest module": largest_module,
        "largest function (code lines)": largest_function,
    }


def import_cost() -> dict:
    code = (
        "import sys, time; t = time.perf_counter(); import tricks_lib; dt = time.perf_counter() - t; "
        "mods = sorted(m for m in sys.modules if m.startswith('tricks_lib')); print(dt); print(' '.join(mods))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    return {"seconds": float(out[0]), "modules": out[1].split()}


def main() -> None:
    s = shape()
    for tier, v in s["tiers"].items():
        print(f"{tier:24s} {v['files']:3d} files {v['lines']:6d} lines")
    print("root public modules:", s["root public modules"])
    print("names with more than one home:", len(s["names with more than one home"]))
    for name, mods in sorted(s["names with more than one home"].items()):
        print(f"  {name}: {', '.join(mods)}")
    print("largest module:", *s["largest module"])
    print("largest function:", *s["largest function (code lines)"])
    from tricks_lib.comparing import compare

    print("compare parameters:", len(inspect.signature(compare).parameters))
    cost = import_cost()
    print(f"import tricks_lib: {len(cost['modules'])} package modules, {cost['seconds']:.2f} s")
    print("  " + " ".join(cost["modules"]))


if __name__ == "__main__":
    main()
