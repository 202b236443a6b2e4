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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

# One reading of the package for this test and for benchmarks/package_shape.py's numbers.
from package_shape import all_of, defined_in, modules, more_than_one_home, packages  # noqa: E402
from package_shape import tier as tier_of  # noqa: E402

MODULES = modules()
PACKAGES = packages(MODULES)


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
    return tier_of(module, PACKAGES)


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


def test_every_module_lists_only_what_it_defines():
    re_exports = {
        m: sorted(set(all_of(p)) - defined_in(p)) for m, p in MODULES.items() if m not in PACKAGES and all_of(p)
    }
    assert {m: names for m, names in re_exports.items() if names} == {}


def test_every_public_name_has_one_home():
    # Listed by one module's __all__ only; a package's face lists only what its own modules define.
    assert more_than_one_home(MODULES) == {}


def test_import_tricks_lib_loads_the_core_only():
    code = "import sys, tricks_lib; print(' '.join(m for m in sys.modules if m.startswith('tricks_lib')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert {tier(m) for m in loaded} <= {"root", "core"}, loaded
    assert len(loaded) <= 16, loaded
