"""The notebooks in JupyterLab, in a real (headless) browser, as a reader opens them.

JupyterLab runs on 127.0.0.1 with a random token and folders of its own; Debian's Chromium, driven by
Playwright, opens COPIES of notebooks 00 and 03 (JupyterLab autosaves: the stored notebooks must never
be touched), checks that a notebook does not show as modified on open (it does when its stored
kernelspec differs from the one JupyterLab writes), runs all cells in quick mode and checks the
rendered result: no error output, HTML tables and images present. A screenshot of each notebook goes
to ``$TRICKS_SCREENSHOTS`` (default ``results/browser/``). Two small made-up notebooks show that the
checks fail when they should: one with a cell that raises, one with a non-standard kernelspec.

Needs ``apt-get install chromium`` and the ``playwright`` package (never ``playwright install``).
"""

import json
import os
import platform
import shutil
from pathlib import Path

import pytest

pytest.importorskip(
    "playwright.sync_api",
    reason="needs the playwright package (pip install -e '.[test]'); it drives Debian's Chromium, "
    "so never run `playwright install`",
)
pytest.importorskip("jupyterlab", reason="needs JupyterLab (pip install -e '.[run]')")

from jupyterlab_browser import (  # noqa: E402
    _ERROR_TEXT,
    CHROMIUM_FLAGS,
    STANDARD_KERNELSPEC,
    lab_server,
    run_notebook,
)
from playwright.sync_api import sync_playwright  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# One real notebook: what the browser adds over nbval (metadata that JupyterLab rewrites on open, lazy
# rendering, tables and images in the DOM) is the same for every notebook, and nbval runs all of them.
# 03 has tables, plots and checked cells and runs in seconds (00 took 46 s here).
BROWSER_TESTED = ("03_memory",)
CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and Path(p).is_file()), None)
# A 1x1 PNG: the made-up notebook shows an image without importing matplotlib.
PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def _screenshot_folder() -> Path:
    return Path(os.environ.get("TRICKS_SCREENSHOTS") or ROOT / "results" / "browser")


def _made_up_notebook(path: Path, sources: list[str], display_name: str) -> None:
    """A notebook with the stored notebooks' metadata, the kernelspec's display name replaced."""
    metadata = json.loads((ROOT / "notebooks" / f"{BROWSER_TESTED[0]}.ipynb").read_text())["metadata"]
    metadata["kernelspec"] = {**metadata["kernelspec"], "display_name": display_name}
    cells = [
        {"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
        for i, s in enumerate(sources)
    ]
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": metadata, "cells": cells}))


def served_copy(stored: Path, copy: Path) -> None:
    """Copy a stored notebook to where the lab serves it, its Python version set to this interpreter's.

    JupyterLab rewrites ``language_info`` from the kernel, so a notebook stored by another Python (3.11.7
    here, 3.12 on a reader's laptop) shows as modified on open wherever the versions differ: a property of
    the machine, not of the repository, so the copy takes the kernel's version (the kernel runs this
    interpreter). Everything else, the kernelspec included, is copied unchanged.
    """
    notebook = json.loads(stored.read_text(encoding="utf-8"))
    language = notebook["metadata"].get("language_info")
    if language and language.get("version") != platform.python_version():
        language["version"] = platform.python_version()
        copy.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    else:
        shutil.copy2(stored, copy)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A running JupyterLab serving copies of the browser-tested notebooks and two made-up ones."""
    if CHROMIUM is None:
        pytest.skip("needs Chromium at /usr/bin/chromium or on PATH (Debian: apt-get install chromium)")
    served = tmp_path_factory.mktemp("served")
    for stem in BROWSER_TESTED:
        served_copy(ROOT / "notebooks" / f"{stem}.ipynb", served / f"{stem}.ipynb")
    shows = (
        "from IPython.display import HTML, Image, display\n"
        "display(HTML('<table><tr><th>a</th></tr><tr><td>1</td></tr></table>'))\n"
        f"display(Image(data=__import__('base64').b64decode('{PIXEL_PNG}')))"
    )
    _made_up_notebook(served / "raises.ipynb", [shows, "1 / 0", "'never reached'"], STANDARD_KERNELSPEC["display_name"])
    _made_up_notebook(served / "renamed_kernel.ipynb", ["1 + 1"], "Python 3")
    env = {
        "TRICKS_QUICK": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",  # inline plots even where MPLBACKEND=Agg
    }
    with lab_server(served, tmp_path_factory.mktemp("lab-home"), env=env) as server:
        yield server


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    """A headless Chromium with a fresh profile; closed after the module's tests."""
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


def _run(browser, lab, name, screenshot=None):
    page = browser.new_page()
    try:
        return run_notebook(page, lab, name, screenshot)
    finally:
        page.close()


@pytest.mark.slow
@pytest.mark.parametrize("stem", BROWSER_TESTED)
def test_notebook_runs_cleanly_in_jupyterlab(stem, lab, browser, record_property):
    stored = ROOT / "notebooks" / f"{stem}.ipynb"
    stored_bytes = stored.read_bytes()
    shot = _screenshot_folder() / f"{stem}.png"
    report = _run(browser, lab, f"{stem}.ipynb", shot)
    record_property("screenshot", str(report.screenshot))
    record_property("browser_seconds", round(report.seconds, 1))
    kernelspec = json.loads(stored_bytes)["metadata"].get("kernelspec")
    assert not report.dirty_on_open, (
        f"{stem} shows as modified as soon as it opens: JupyterLab rewrote the metadata it gets from the "
        f"kernel (kernelspec, language_info); the stored kernelspec is {kernelspec}, the standard one is "
        f"{STANDARD_KERNELSPEC}"
    )
    assert not report.errors, (
        f"{stem} shows error output in JupyterLab (screenshot: {shot}):\n" + "\n\n".join(report.errors)[-4000:]
    )
    assert not report.not_run, f"{stem}: code cells {report.not_run} did not run (prompts {report.prompts})"
    assert report.tables > 0, f"{stem}: no rendered HTML table"
    assert report.images > 0, f"{stem}: no rendered image"
    assert shot.is_file() and shot.stat().st_size > 10_000, f"{stem}: no screenshot at {shot}"
    assert stored.read_bytes() == stored_bytes, f"the browser session modified the stored {stored}"


@pytest.mark.slow
def test_browser_check_sees_an_error_output(lab, browser):
    report = _run(browser, lab, "raises.ipynb")
    assert not report.dirty_on_open  # standard kernelspec: the tab is clean (the contrast to the next test)
    assert report.tables == 1 and report.images == 1, report
    assert len(report.errors) == 1 and "ZeroDivisionError" in report.errors[0], report.errors
    assert report.not_run == (2,), report.prompts  # Run All stops at the error


@pytest.mark.slow
def test_browser_check_sees_a_nonstandard_kernelspec(lab, browser):
    report = _run(browser, lab, "renamed_kernel.ipynb")
    assert report.dirty_on_open, "a kernelspec display name JupyterLab rewrites must show the notebook as modified"
    assert not report.errors and not report.not_run, report


@pytest.mark.parametrize(
    ("text", "is_error"),
    [
        ("ZeroDivisionError  Traceback (most recent call last)\nCell In[2], line 1\n----> 1 1 / 0\n", True),
        ("  Cell In[4], line 1\n    x = \n        ^\nSyntaxError: invalid syntax\n", True),
        ("RuntimeError: CUDA not available\n", True),
        ("/x/y.py:3: UserWarning: TypedStorage is deprecated\n  return f(x)\n", False),
        ("100%|##########| 3/3 [00:01<00:00,  2.0it/s]\n", False),
    ],
)
def test_error_text_is_told_from_warnings_and_progress(text, is_error):
    assert bool(_ERROR_TEXT.search(text)) is is_error
