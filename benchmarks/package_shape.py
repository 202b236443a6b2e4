"""The package's shape in numbers: files and lines per tier, names with more than one home, the largest
module and function, compare's parameters, and what ``import tricks_lib`` loads and costs.

    python benchmarks/package_shape.py

Tiers: the core (modules at the package root), ``report/`` (the main command and what it writes), and
the topic subpackages. The readings here (modules, ``__all__``, definitions, tiers, homes) are also what
``tests/project/test_layers.py`` pins, so the numbers and the test cannot disagree.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tricks_lib"


def module_name(path: Path) -> str:
    """``tricks_lib/data/shards.py`` -> ``tricks_lib.data.shards``; a package's ``__init__`` -> the package."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def packages(mods: dict[str, Path]) -> set[str]:
    return {m for m, p in mods.items() if p.name == "__init__.py"}


def tier(module: str, package_names: set[str]) -> str:
    """'root' (the package's face), 'core' (a module at the root), 'report', or 'topic'."""
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    if len(parts) == 2 and module not in package_names:
        return "core"
    return "report" if parts[1] == "report" else "topic"


def all_of(path: Path) -> list[str]:
    """The names a module's ``__all__`` lists (none without one)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(getattr(t, "id", None) == "__all__" for t in targets) and node.value is not None:
            return [ast.literal_eval(e) for e in node.value.elts]
    return []


def defined_in(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments)."""
    defined = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    return defined


def more_than_one_home(mods: dict[str, Path]) -> dict[str, list[str]]:
    """Public names with more than one home: listed by two modules' ``__all__``, or by a package's face that
    does not define them in one of its own modules (a face may re-export only its own modules)."""
    package_names = packages(mods)
    homes: dict[str, list[str]] = defaultdict(list)
    for module, path in mods.items():
        if module not in package_names:
            for name in all_of(path):
                homes[name].append(module)
    found = {name: mods_ for name, mods_ in homes.items() if len(mods_) > 1}
    for face in package_names:
        own = set().union(*(defined_in(p) for m, p in mods.items() if m.rsplit(".", 1)[0] == face and m != face))
        for name in set(all_of(mods[face])) - {"__version__"} - own:
            found.setdefault(name, sorted(homes.get(name, [])) + [face])
    return found


def _code_lines(node: ast.AST) -> int:
    """Lines of a function without its docstring."""
    lines = node.end_lineno - node.lineno + 1
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        lines -= body[0].end_lineno - body[0].lineno + 1
    return lines


def shape() -> dict:
    mods = modules()
    package_names = packages(mods)
    tiers: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    largest_module, largest_function = ("", 0), ("", 0)
    for module, path in mods.items():
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        kind = tier(module, package_names)
        label = (
            "core" if kind in ("root", "core") else "report" if kind == "report" else f"topic {module.split('.')[1]}"
        )
        tiers[label][0] += 1
        tiers[label][1] += lines
        if lines > largest_module[1]:
            largest_module = (str(path.relative_to(PACKAGE.parent)), lines)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(node) > largest_function[1]:
                largest_function = (f"{path.relative_to(PACKAGE.parent)}:{node.name}", _code_lines(node))
    return {
        "tiers": {k: {"files": v[0], "lines": v[1]} for k, v in sorted(tiers.items())},
        "root public modules": sum(
            1 for m in mods if tier(m, package_names) == "core" and not m.split(".")[1].startswith("_")
        ),
        "names with more than one home": more_than_one_home(mods),
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
    for name, v in s["tiers"].items():
        print(f"{name:24s} {v['files']:3d} files {v['lines']:6d} lines")
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
