"""Progress bars for long loops: a tqdm widget in Jupyter, text elsewhere, off for headless runs.

- ``progress_bar(iterable)`` wraps a notebook's own loop (the package root re-exports it).
- ``optional_progress_bar(enabled, total, desc)`` is for the package's loops (``measure``,
  ``compare``, the ladder, ...): a bar to update by hand, or None when there is none to draw.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tricks_lib._validate import check_positive

__all__ = ["PROGRESS_ENV_VAR", "optional_progress_bar", "progress_bar"]

# Set to "0" by the main command and the test run: a headless run has no one to watch a bar, and
# its text would end up in the stored notebook outputs.
PROGRESS_ENV_VAR = "TRICKS_PROGRESS"


def _tqdm_class():
    try:
        import ipywidgets  # noqa: F401  (tqdm.auto's widget needs it; without it, it warns and prints text)
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm.std import tqdm
    return tqdm


def optional_progress_bar(enabled: bool, total: int | None, desc: str):
    """A progress bar (a widget in Jupyter where ipywidgets is installed, text otherwise), or None.

    None when ``enabled`` is False or ``TRICKS_PROGRESS=0``.
    """
    if not enabled or os.environ.get(PROGRESS_ENV_VAR) == "0":
        return None
    return _tqdm_class()(total=total, desc=desc, leave=False)


def progress_bar(iterable: Iterable | None = None, *, desc: str | None = None, total: int | None = None):
    """``tqdm`` over ``iterable`` for a notebook's long loops: a widget where ipywidgets is installed,
    text otherwise (never tqdm.auto's "IProgress not found" warning), and off (a plain pass-through
    bar that draws nothing) under ``TRICKS_PROGRESS=0``, which the main command sets so that stored
    outputs hold no bars.

    Raises:
        TypeError: ``desc`` is not a string or ``total`` is not a whole number.
    """
    if desc is not None and not isinstance(desc, str):
        raise TypeError(f"desc must be a string, got {type(desc).__name__}")
    check_positive(total, "total", integer=True)
    off = os.environ.get(PROGRESS_ENV_VAR) == "0"
    return _tqdm_class()(iterable, desc=desc, total=total, leave=False, disable=off)
