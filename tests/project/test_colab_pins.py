"""Colab's real pins: what a notebook's setup cell installs on Colab must accept what Colab already has.

Colab's kernel runs on its preinstalled IPython, traitlets, ipykernel and jupyter_client, pinned to each
other; pip upgrading one of them under the running kernel prints a red ERROR and can break the runtime.
``test_colab_setup.py`` runs the setup cells in a simulated Colab made of this machine's packages; this
test holds the versions Colab itself ships (``COLAB``, from its runtime's ``pip list``) against the
requirements each setup cell installs: the core dependencies, the notebook's own extra, and what those
packages require in turn (from the installed packages' metadata), for protobuf.
"""

import importlib.metadata as md
import json
import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# Colab's runtime (Python 3.12, December 2025): the kernel's stack, and the libraries every notebook imports.
COLAB = {
    "ipython": "7.34.0",
    "traitlets": "5.7.1",
    "ipykernel": "6.17.1",
    "jupyter-client": "7.4.9",
    "protobuf": "5.29.5",
    "numpy": "2.0.2",
    "torch": "2.9.0",
    "torchvision": "0.24.0",
    "matplotlib": "3.10.0",
    "pillow": "11.3.0",
    "opencv-python": "4.12.0.88",
    "scikit-learn": "1.6.1",
    "scipy": "1.16.3",
    "tqdm": "4.67.1",
}
COLAB_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.12",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
}
# notebook -> why it may raise a Colab package (the setup cell of that notebook only).
MAY_UPGRADE = {
    "05_inference": {"protobuf": "ONNX (the infer extra) needs protobuf >= 6.31; 05 alone installs it"},
}
INSTALL = re.compile(r'%pip install -q "tricks_lib(?:\[([a-z0-9,]+)\])? @ git\+\{REPOSITORY\}"')


def project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def setup_cell_extras(path):
    """The extras the notebook's setup cell installs on Colab."""
    setup = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][1]["source"])
    match = INSTALL.search(setup)
    assert match, f"{path.stem}: its setup cell installs tricks_lib with no recognised pip line"
    return match[1].split(",") if match[1] else []


def requirements_of(extras):
    """The requirements pip resolves for tricks_lib[extras]: the core, each extra's, and (for installed packages)
    what they require in turn, one level down."""
    spec = project()
    direct = [Requirement(r) for r in spec["dependencies"]]
    for extra in extras:
        direct += [Requirement(r) for r in spec["optional-dependencies"][extra]]
    found = list(direct)
    for req in direct:
        if canonicalize_name(req.name) in COLAB:
            continue  # Colab's own copy is what gets used, with its own requirements already met
        try:
            deps = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        found += [Requirement(d) for d in deps if "extra ==" not in d]
    return [r for r in found if r.marker is None or r.marker.evaluate(COLAB_MARKERS)]


def conflicts(requirements):
    """{Colab package: the requirement that excludes its version}."""
    out = {}
    for req in requirements:
        name = canonicalize_name(req.name)
        if name in COLAB and not req.specifier.contains(Version(COLAB[name]), prereleases=True):
            out[name] = f"{req} (Colab has {COLAB[name]})"
    return out


def test_every_notebook_installs_only_what_it_uses():
    extras = {path.stem: setup_cell_extras(path) for path in NOTEBOOKS}
    assert len(extras) >= 9
    assert extras["05_inference"] == ["infer"] and all(
        "infer" not in e for s, e in extras.items() if s != "05_inference"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_setup_cell_accepts_what_colab_has_installed(path):
    found = conflicts(requirements_of(setup_cell_extras(path)))
    allowed = MAY_UPGRADE.get(path.stem, {})
    assert not {name: why for name, why in found.items() if name not in allowed}, (
        f"{path.stem}'s setup cell would make pip replace Colab's own packages under its running kernel: "
        f"{found}. Lower the bound, or install that extra only where it is needed."
    )


def test_the_check_catches_a_bound_above_colabs():
    assert conflicts([Requirement("ipython>=8.0")]) == {"ipython": "ipython>=8.0 (Colab has 7.34.0)"}
    assert conflicts([Requirement("protobuf>=6.31.1")])
    assert not conflicts([Requirement("ipython>=7.34"), Requirement("numpy>=1.24")])
