"""The package's three tiers, pinned: core at the root, ``report/`` apart, one subpackage per topic.

Read from the source (``ast``), so a new import that breaks a rule fails here before anything runs:

- core modules (the root's own files) import no subpackage;
- no module outside ``report/`` (and ``__main__``) imports ``report/``;
- topic modules import core modules and topic modules, never the package root;
- there are no import circles between files;
- every public name has one home (a subpackage's ``__init__`` may re-export its own modules);
- ``import tricks_lib`` loads the core only.
"""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tricks_lib"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def imports_of(path: Path) -> set[str]:
    """The package modules a file imports (at any depth: a function's lazy import counts too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tricks_lib":
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "tricks_lib"}
    return found


IMPORTS = {m: imports_of(p) for m, p in MODULES.items()}


def tier(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    if len(parts) == 2 and module not in PACKAGES:
        return "core"
    return "report" if parts[1] == "report" else "topic"


def test_the_tree_has_the_three_tiers():
    tiers = {tier(m) for m in MODULES}
    assert tiers == {"root", "core", "report", "topic"}
    topics = {m.split(".")[1] for m in MODULES if tier(m) == "topic"}
    assert {"data", "repro", "training", "design", "inference", "profiling", "ladder"} <= topics
    # Named for what they do, never for a notebook number.
    assert not [m for m in MODULES if any(part[:1].isdigit() for part in m.split("."))]


def test_core_modules_import_no_subpackage():
    bad = {m: sorted(i for i in imps if tier(i) != "core") for m, imps in IMPORTS.items() if tier(m) == "core"}
    assert {m: v for m, v in bad.items() if v and m != "tricks_lib.__main__"} == {}


def test_only_the_report_and_the_main_command_import_the_report():
    bad = {
        m: sorted(i for i in imps if tier(i) == "report")
        for m, imps in IMPORTS.items()
        if tier(m) not in ("report",) and m != "tricks_lib.__main__"
    }
    assert {m: v for m, v in bad.items() if v} == {}


def test_topics_never_import_the_package_root():
    bad = [m for m, imps in IMPORTS.items() if tier(m) in ("topic", "report") and "tricks_lib" in imps]
    assert bad == []


def test_no_import_circles():
    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in IMPORTS.get(node, ()):
                if nxt == start:
                    return path + [start]
                if nxt not in seen and nxt in MODULES:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    # A package's __init__ importing its own modules is how a face works; its modules never import it back.
    cycles = [c for m in MODULES if (c := cycle_from(m)) is not None]
    assert cycles == []


def all_of(path: Path) -> list[str]:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]
    return []


def defined_in(path: Path) -> set[str]:
    defined = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    return defined


def test_every_module_lists_only_what_it_defines():
    re_exports = {
        m: sorted(set(all_of(p)) - defined_in(p)) for m, p in MODULES.items() if m not in PACKAGES and all_of(p)
    }
    assert {m: names for m, names in re_exports.items() if names} == {}


def test_every_public_name_has_one_home():
    homes: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if module not in PACKAGES:
            for name in all_of(path):
                homes.setdefault(name, []).append(module)
    assert {name: mods for name, mods in homes.items() if len(mods) > 1} == {}
    # A package's face lists only names that its own modules define (the root's face: the core's).
    for face in PACKAGES:
        own = set().union(
            *(defined_in(p) for m, p in MODULES.items() if m.rsplit(".", 1)[0] == face and m not in PACKAGES)
        )
        assert set(all_of(MODULES[face])) - {"__version__"} <= own, face


def test_import_tricks_lib_loads_the_core_only():
    code = "import sys, tricks_lib; print(' '.join(m for m in sys.modules if m.startswith('tricks_lib')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert {tier(m) for m in loaded} <= {"root", "core"}, loaded
    assert len(loaded) <= 16, loaded
