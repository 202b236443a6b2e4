"""Tiny notebooks for the main command's tests, and one run of them that those tests share.

Starting kernels is what makes these tests slow, so the tests that only read what a run wrote share
one: ``shared_run`` runs the notebooks once per test session (two ``python -m tricks_lib run``
invocations into one output folder, the second merging into the first) and hands out what they wrote.
Each test module that uses it defines a session fixture returning ``shared_run_once(tmp_path_factory)``.
The folders are the session's: a test that changes them works on a copy (``SharedRun.copy_to``).
"""

import contextlib
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from tiny_notebooks import KERNEL_VARS, write_env, write_fails, write_ok


@dataclass(frozen=True)
class Invocation:
    """One ``python -m tricks_lib run``: its exit code, what it printed to stderr, the summary it left."""

    code: int
    err: str
    summary: dict


@dataclass(frozen=True)
class SharedRun:
    """The shared run: ``first`` ran 10 and 20 with --refresh; ``second`` ran 12 (unreadable) and 15, merging."""

    notebooks: Path
    out: Path
    first: Invocation
    second: Invocation
    environ_before: dict
    environ_after: dict
    environ_writes: tuple  # (function, variable) for every os.putenv/os.unsetenv while the runs lasted

    def copy_to(self, folder: Path) -> tuple[Path, Path]:
        """A copy of the notebooks and the output folder in ``folder``, for a test that runs more into them."""
        notebooks, out = (
            shutil.copytree(self.notebooks, folder / "notebooks"),
            shutil.copytree(self.out, folder / "out"),
        )
        return Path(notebooks), Path(out)


def _invoke(argv) -> Invocation:
    from tricks_lib.__main__ import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    out = Path(argv[argv.index("--out") + 1])
    return Invocation(code, err.getvalue(), json.loads((out / "summary.json").read_text()))


def _run_once(folder: Path) -> SharedRun:
    notebooks, out = folder / "notebooks", folder / "out"
    notebooks.mkdir()
    write_ok(notebooks, title="# 10 · OK")
    (notebooks / "12_broken.ipynb").write_text("{not json")
    write_env(notebooks)
    write_fails(notebooks)
    common = ["run", "--quick", "--notebooks", str(notebooks), "--out", str(out), "--no-progress"]
    writes = []
    with pytest.MonkeyPatch.context() as mp:
        # Nothing the kernels see may come from this process's environment: the runner passes it.
        for key in KERNEL_VARS:
            mp.delenv(key, raising=False)
        before = dict(os.environ)
        real_putenv, real_unsetenv = os.putenv, os.unsetenv
        mp.setattr(os, "putenv", lambda key, value: (writes.append(("putenv", key)), real_putenv(key, value))[1])
        mp.setattr(os, "unsetenv", lambda key: (writes.append(("unsetenv", key)), real_unsetenv(key))[1])
        first = _invoke([*common, "--refresh", "--only", "10", "20"])
        second = _invoke([*common, "--only", "12", "15"])
        after = dict(os.environ)
    return SharedRun(notebooks, out, first, second, before, after, tuple(writes))


_SHARED: list[SharedRun] = []


def shared_run_once(tmp_path_factory) -> SharedRun:
    """The one shared run of this test session, started by the first test (of any module) that asks."""
    if not _SHARED:
        _SHARED.append(_run_once(tmp_path_factory.mktemp("shared_run")))
    return _SHARED[0]
