"""Which notebooks the main command runs, and whether their outputs may be stored.

``locate_notebooks``: ``--notebooks DIR`` when given; else the ``notebooks/`` folder of the checkout
this package was imported from (a clone, or an editable install); else the copies shipped inside an
installed package (``tricks_lib/notebooks/`` in the wheel), which a run only reads.
``hygiene_problems``: the reasons an executed notebook's outputs may not be stored (error outputs,
outputs without an execution count, local paths); ``write_notebook`` stores one (atomically, with the
standard kernelspec); ``cell_label`` names a cell as a reader counts it.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tricks_lib._atomic import write_bytes_atomic
from tricks_lib.report.run_times import LEDGER_NAME

__all__ = [
    "STANDARD_KERNELSPEC",
    "NotebookSource",
    "cell_label",
    "find_notebooks",
    "hygiene_problems",
    "last_run_seconds",
    "local_path_pattern",
    "locate_notebooks",
    "shipped_notebook_dir",
    "write_notebook",
]

# The kernelspec JupyterLab writes for this kernel: a stored notebook with another display name shows
# as "modified" the moment a reader opens it.
STANDARD_KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


@dataclass(frozen=True)
class NotebookSource:
    """Where the notebooks to run were found: the folder and how it was chosen."""

    folder: Path
    origin: str  # "--notebooks", "checkout" or "installed package"

    @property
    def shipped(self) -> bool:
        """True for the installed package's own copies, which a run only reads."""
        return self.origin == "installed package"

    def __str__(self) -> str:
        return f"{self.folder} ({self.origin})"


_PACKAGE = Path(__file__).resolve().parents[1]  # tricks_lib/ (this module is tricks_lib/report/notebook_source.py)


def shipped_notebook_dir() -> Path:
    """The notebooks an installed package ships (``tricks_lib/notebooks/``; absent in a checkout)."""
    return _PACKAGE / "notebooks"


def _checkout_notebook_dir() -> Path | None:
    root = _PACKAGE.parent
    folder = root / "notebooks"
    return folder if (root / "pyproject.toml").is_file() and any(folder.glob("*.ipynb")) else None


def locate_notebooks(explicit: Path | None = None) -> NotebookSource:
    """The folder of notebooks to run: ``explicit``, else the checkout's ``notebooks/``, else the shipped copies.

    Raises:
        ValueError: ``explicit`` is not a folder, or no notebooks are found at all; the message names ``--notebooks``.
    """
    if explicit is not None:
        if not Path(explicit).is_dir():
            raise ValueError(f"--notebooks {explicit} is not a folder; pass the folder that holds the .ipynb files")
        return NotebookSource(Path(explicit), "--notebooks")
    checkout = _checkout_notebook_dir()
    if checkout is not None:
        return NotebookSource(checkout, "checkout")
    shipped = shipped_notebook_dir()
    if any(shipped.glob("*.ipynb")):
        return NotebookSource(shipped, "installed package")
    raise ValueError(
        f"no notebooks found: this tricks_lib ({_PACKAGE}) is neither a checkout nor an "
        "install that ships them; pass --notebooks DIR (a folder of .ipynb files, e.g. a clone's notebooks/)"
    )


def is_shipped(folder: Path) -> bool:
    """Whether ``folder`` is the notebooks folder installed with the package (never refreshed in place)."""
    return Path(folder).resolve() == shipped_notebook_dir()


def last_run_seconds(path: Path, *, quick: bool, ledger_dir: Path | None = None) -> float | None:
    """The seconds the last clean run of notebook ``path`` took in this mode, from its run-time ledger.

    ``ledger_dir``: a folder whose ledger is read first (a run of shipped notebooks records into its
    output folder); then the ledger beside the notebook. None when neither recorded one.
    """
    for folder in (ledger_dir, Path(path).parent):
        if folder is None:
            continue
        try:
            entry = json.loads((Path(folder) / LEDGER_NAME).read_text(encoding="utf-8"))[Path(path).stem]
            return float(entry["quick" if quick else "full"]["seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def find_notebooks(notebook_dir: Path, only: Sequence[str] | None = None) -> list[Path]:
    """The notebooks to run, in order; ``only`` selects each by its number ("3" or "03": exactly that notebook)
    or by a name prefix that matches one notebook ("03_mem").

    Raises:
        ValueError: the folder holds no notebooks, or a selector matches none, or a name prefix matches several.
    """
    paths = sorted(p for p in Path(notebook_dir).glob("*.ipynb") if not p.name.startswith("."))
    if not paths:
        raise ValueError(f"no notebooks found in {notebook_dir}; run from the repository root or pass --notebooks DIR")
    if not only:
        return paths
    chosen = []
    for selector in only:
        if selector.isdigit():  # a number names one notebook: "0" is 00, never every notebook starting with 0
            matches = [
                p for p in paths if re.match(r"\d+", p.stem) and int(re.match(r"\d+", p.stem)[0]) == int(selector)
            ]
        else:
            matches = [p for p in paths if p.stem == selector] or [p for p in paths if p.stem.startswith(selector)]
        if not matches:
            raise ValueError(f"--only {selector!r} matches no notebook; choose from {[p.stem for p in paths]}")
        if len(matches) > 1:
            raise ValueError(
                f"--only {selector!r} matches {len(matches)} notebooks ({[p.stem for p in matches]}); "
                "give a number or a longer name prefix"
            )
        chosen += [p for p in matches if p not in chosen]
    return sorted(chosen)


def local_path_pattern() -> re.Pattern:
    """Paths that must never appear in stored outputs: this checkout, home, temp, the interpreter."""
    roots = {
        str(Path.cwd().resolve().parent),
        str(Path.home()),
        tempfile.gettempdir(),
        "/tmp",
        sys.prefix,
        sys.base_prefix,
    }
    roots = {r.rstrip("/") for r in roots if r and r != "/"}
    alternatives = "|".join(re.escape(r) + "/" for r in sorted(roots, key=len, reverse=True))
    return re.compile(f"({alternatives}|/home/|/root/|/Users/)")


def _output_texts(output: dict) -> list[str]:
    texts = []
    if "text" in output:
        texts.append("".join(output["text"]) if isinstance(output["text"], list) else output["text"])
    for key, value in output.get("data", {}).items():
        if key.startswith("text/") or key == "application/json":
            texts.append(value if isinstance(value, str) else json.dumps(value))
    if output.get("output_type") == "error":
        texts.extend(output.get("traceback", []))
    return texts


def hygiene_problems(nb) -> list[str]:
    """Reasons a notebook's outputs may not be stored: error outputs, missing counts, local paths."""
    problems = []
    leak = local_path_pattern()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.outputs and cell.execution_count is None:
            problems.append(f"cell {index}: outputs without an execution count")
        for output in cell.outputs:
            if output.get("output_type") == "error":
                problems.append(f"cell {index}: an error output ({output.get('ename')})")
            for text in _output_texts(output):
                match = leak.search(text)
                if match:
                    problems.append(f"cell {index}: a local path in an output ({match.group(0)}...)")
                    break
    return problems


def write_notebook(nb, path: Path) -> None:
    """Write a notebook atomically: a full disk or a kill mid-write never leaves a truncated notebook.

    The kernelspec is the standard one, so JupyterLab does not mark the notebook modified on open.
    """
    nb.metadata["kernelspec"] = dict(STANDARD_KERNELSPEC)
    import nbformat  # the run extra's: only the main command writes notebooks

    text = nbformat.writes(nb)
    if not text.endswith("\n"):
        text += "\n"  # as nbformat.write does
    write_bytes_atomic(path, text.encode("utf-8"))


def cell_label(nb, index: int | None) -> str | None:
    """'cell 5 of 24 (code cell 3: `first line`)' for a 0-based cell index, as a reader counts."""
    if index is None:
        return None
    cell = nb.cells[index]
    code_number = sum(c.cell_type == "code" for c in nb.cells[: index + 1])
    first = next((ln.strip() for ln in cell.source.splitlines() if ln.strip()), "")
    return f"cell {index + 1} of {len(nb.cells)} (code cell {code_number}: `{first[:60]}`)"
