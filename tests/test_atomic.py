"""Atomic writes: a failure at any point leaves the old file intact and no temporary behind."""

import errno
import os

import nbformat
import pytest

import tricks_lib._atomic as atomic
from tricks_lib._atomic import temporary_path_for, write_bytes_atomic


def test_a_full_disk_during_a_notebook_refresh_keeps_the_stored_notebook(tmp_path, monkeypatch):
    from tricks_lib.report.runner import _write_notebook

    stored = tmp_path / "00_x.ipynb"
    old = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    _write_notebook(old, stored)
    before = stored.read_bytes()

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", no_space)
    new = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("2 + 2") for _ in range(100)])
    with pytest.raises(OSError, match="No space"):
        _write_notebook(new, stored)
    assert stored.read_bytes() == before and nbformat.reads(before.decode(), as_version=4).cells[0].source == "1 + 1"
    assert sorted(os.listdir(tmp_path)) == ["00_x.ipynb"]


def test_the_file_and_its_folder_are_fsynced_around_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        atomic.os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))
    )
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append(("replace", str(b))), real_replace(a, b)))
    target = tmp_path / "data.bin"
    write_bytes_atomic(target, b"abc")
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    assert events[0][1] == str(temporary_path_for(target)) and events[2][1] == str(tmp_path)


def test_a_killed_earlier_write_leaves_nothing_after_the_next_write(tmp_path):
    target = tmp_path / "nb.ipynb"
    dead = tmp_path / ".nb.ipynb.tmp-999999999"  # no such process
    dead.write_bytes(b"half a notebook")
    live = tmp_path / f".nb.ipynb.tmp-{os.getppid()}"  # a running process's write in progress: kept
    live.write_bytes(b"in progress")
    write_bytes_atomic(target, b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "nb.ipynb"]
