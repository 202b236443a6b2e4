"""A set of files written as one: readers refuse a set that a write left half-replaced.

Each file of a set (tar shards, a folder of images) is written atomically, but a rewrite that stops
halfway (a crash, Ctrl-C, a full disk) leaves the new files beside the older version's: 700 new and
1,300 old samples that read as one dataset without a word. So a writer marks the folder before it
changes the first file (``.<name>.writing``, durable) and removes the mark after the last one; a
reader that finds the mark refuses the set and says why. A second file, the set's manifest, lists
what the last complete write wrote, so a reader can tell that set from files left by an older one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from tricks_lib._atomic import _pid_alive, fsync_path, write_bytes_atomic

__all__ = ["refuse_unfinished_write", "write_in_progress"]


def _marker(folder: Path, name: str) -> Path:
    return folder / f".{name}.writing"


@contextlib.contextmanager
def write_in_progress(folder: str | os.PathLike, name: str) -> Iterator[None]:
    """Mark ``folder`` as holding a set ``name`` being written, for the block's duration.

    The mark is on disk before the block changes any file, and it is removed only when the block
    completes: an exception or a killed process leaves it, and readers then refuse the set
    (:func:`refuse_unfinished_write`) until a write of it completes.
    """
    folder = Path(folder)
    marker = _marker(folder, name)
    write_bytes_atomic(marker, json.dumps({"pid": os.getpid()}).encode())
    yield
    marker.unlink()
    fsync_path(folder)


def refuse_unfinished_write(folder: str | os.PathLike, name: str, what: str) -> None:
    """Raise ValueError if a write of the set ``name`` in ``folder`` started and did not finish.

    Args:
        folder: the set's folder.
        name: the set's name, as the writer passed it to :func:`write_in_progress`.
        what: the set in words, for the message ("the shards train-*.tar").
    """
    marker = _marker(Path(folder), name)
    try:
        pid = json.loads(marker.read_text()).get("pid")
    except FileNotFoundError:
        return
    except (OSError, ValueError, AttributeError):
        pid = None
    running = isinstance(pid, int) and pid != os.getpid() and _pid_alive(pid)
    state = f"process {pid} is still writing it" if running else "the write stopped before its end"
    raise ValueError(
        f"{what} in {folder} are not one complete set: {state} ({marker.name} marks it), so the folder may "
        "hold new files beside an older version's. Rerun the write (it replaces the whole set), or delete "
        "the folder and write it again."
    )
