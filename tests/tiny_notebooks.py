"""Tiny notebooks that tests run for real: the main command's, the GPU script's dry run.

Importable from every test folder (``tests/`` is on ``sys.path`` because its ``conftest.py`` lives there).
"""

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

KERNELSPEC = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
# What the runner sets in a kernel's environment, and the variable it only sets when the caller has not.
KERNEL_VARS = ("TRICKS_QUICK", "TRICKS_RESULTS", "TRICKS_NOTEBOOK", "TRICKS_PROGRESS", "CUBLAS_WORKSPACE_CONFIG")


def write_nb(path, *sources, title="# test"):
    cells = [new_markdown_cell(title)] + [new_code_cell(s) for s in sources]
    nbformat.write(new_notebook(cells=cells, metadata=KERNELSPEC), path)


def write_ok(folder, title="# test"):
    """10_ok: records one measurement, then shows whether its kernel runs in quick mode."""
    write_nb(
        folder / "10_ok.ipynb",
        "from tricks_lib.env import quick_mode\nfrom tricks_lib import measure\nfrom tricks_lib.report.results import record",
        "record('noop', measure(lambda: None, min_run_time=0.01, device='cpu'))\nquick_mode()",
        title=title,
    )


def write_env(folder):
    """15_env: shows the variables of its kernel's environment that the runner sets."""
    write_nb(folder / "15_env.ipynb", f"import os\n{{k: os.environ.get(k) for k in {KERNEL_VARS!r}}}")


def write_fails(folder):
    """20_fails: its second code cell (cell 3 of 4) raises."""
    write_nb(folder / "20_fails.ipynb", "x = 1", "raise RuntimeError('boom')", "y = 2")
