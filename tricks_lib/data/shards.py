"""Tar shards in the WebDataset layout, and an exactly-once ``IterableDataset`` over them.

Layout: a shard is a plain tar file whose members are named ``<key>.<ext>``; consecutive members
with the same key form one sample ``{"__key__": key, ext: bytes, ...}``. The key is the member name
up to the first '.' of its base name (WebDataset's rule), so shards written here are read by
``webdataset`` and shards written by ``webdataset.TarWriter`` are read here.

Why not :mod:`tarfile` for reading: ``tarfile`` treats a corrupt or truncated header after the
first member as the end of the archive and silently drops the rest of the shard. The reader here
checks every header checksum, every member size, and the end-of-archive marker, and raises
:class:`ShardError` naming the shard and the byte offset.

Exactly-once split (see :meth:`TarShardDataset.plan`): all consumers (every DataLoader worker of
every rank) compute the same global sample order (shards in order, or shuffled by ``(seed, epoch)``),
then rank ``r`` of ``R`` takes the contiguous range ``[r*N//R, (r+1)*N//R)`` of the ``N`` samples and
worker ``w`` of ``W`` takes the same-formula sub-range of its rank's range. The ranges partition
``0..N-1``, so every sample is read exactly once for any number of shards, workers and ranks, even
with fewer shards than consumers (a shard is then split between consumers by byte offset), and
consumers differ by at most one sample. Each consumer reads contiguous byte ranges: sequential IO.

Index files (:mod:`tricks_lib.data.shard_index_file`): the writer keeps a small hidden index file beside
each shard (``.shard-000000.tar.idx``), so that constructing the dataset does not read every header
of every shard; it is used only after it is checked against the shard, and rebuilt when missing,
stale or damaged.
"""

from __future__ import annotations

import glob
import os
import random
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch
from torch.utils.data import IterableDataset, get_worker_info

from tricks_lib._atomic import atomic_path
from tricks_lib._validate import check_flag, check_non_negative_int, check_positive
from tricks_lib.data.samples import check_samples
from tricks_lib.data.shard_index import index_tar_shard, read_tar_samples, request_read_ahead
from tricks_lib.data.shard_index_file import load_shard_index, write_index_file
from tricks_lib.data.write_state import refuse_unfinished_write, write_in_progress

__all__ = ["TarShardDataset", "find_shards", "write_tar_shards"]


def write_tar_shards(
    samples: Iterable[dict], out_dir: str | os.PathLike, *, samples_per_shard: int, prefix: str = "shard"
) -> list[Path]:
    """Write samples into tar shards ``out_dir/<prefix>-000000.tar``, ... in the WebDataset layout.

    Each shard is written under a temporary name and renamed when complete, so an interrupted run
    leaves only complete shards under final names. Member metadata is fixed (mtime 0, uid 0, mode
    0444): the same samples give the same bytes.

    Rewriting a folder replaces its shards: after all new shards are written, shards of an earlier
    write named ``<prefix>-NNNNNN.tar`` with a higher number than the last new one are deleted, so
    ``glob("<prefix>-*.tar")`` finds exactly the new samples. While the write runs the folder holds
    ``.<prefix>-shards.writing``; a write that stops halfway leaves it, and :func:`find_shards` (so
    :class:`TarShardDataset`) then refuses these shards, which may mix new and old samples, until a
    write completes. Other files are left alone.

    Args:
        samples: iterable of dicts ``{"__key__": str, ext: bytes, ...}``; keys unique, without '.'.
        out_dir: directory, created if missing.
        samples_per_shard: samples per shard (>= 1); the last shard may hold fewer.
        prefix: shard file name prefix.
    Returns:
        The shard paths, in order.
    Raises:
        TypeError/ValueError: on malformed samples, duplicate keys or a bad ``samples_per_shard``.
    """
    check_positive(samples_per_shard, "samples_per_shard", allow_none=False, integer=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    it = iter(check_samples(samples))
    with write_in_progress(out, _set_name(prefix)):  # readers refuse the folder's shards until the write ends
        shards = _write_shards(it, out, samples_per_shard, prefix)
        _remove_stale_shards(out, prefix, len(shards))
    return shards


def _set_name(prefix: str) -> str:
    return f"{prefix}-shards"


def _write_shards(it: Iterator[dict], out: Path, samples_per_shard: int, prefix: str) -> list[Path]:
    shards: list[Path] = []
    seen: set[str] = set()
    while True:
        first = next(it, None)
        if first is None:
            return shards
        path = out / f"{prefix}-{len(shards):06d}.tar"
        with atomic_path(path) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            sample, n = first, 0
            while sample is not None:
                key = sample["__key__"]
                if key in seen:
                    raise ValueError(f"duplicate sample key {key!r}: keys must be unique")
                seen.add(key)
                for ext, value in sample.items():
                    if ext.startswith("__"):
                        continue
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime, info.mode = len(value), 0, 0o444
                    tar.addfile(info, _BytesReader(bytes(value)))
                n += 1
                sample = next(it, None) if n < samples_per_shard else None
        # After the rename (which changes the ctime, part of the identity the index file records).
        write_index_file(index_tar_shard(path), durable=True)
        shards.append(path)


def _remove_stale_shards(out: Path, prefix: str, count: int) -> None:
    """Delete ``out/<prefix>-NNNNNN.tar`` numbered ``count`` or higher (left by an earlier write), and
    their index files."""
    pattern = re.compile(re.escape(prefix) + r"-(\d{6,})\.tar")
    for path in out.glob(f"{glob.escape(prefix)}-*.tar"):
        match = pattern.fullmatch(path.name)
        if match and int(match.group(1)) >= count:
            path.unlink(missing_ok=True)
    for path in out.glob(f".{glob.escape(prefix)}-*.tar.idx"):  # also those whose shard is gone
        match = pattern.fullmatch(path.name[1:-4])
        if match and int(match.group(1)) >= count:
            path.unlink(missing_ok=True)


class _BytesReader:
    """Minimal file object for tarfile.addfile (avoids an io.BytesIO copy per member)."""

    def __init__(self, data: bytes):
        self._data, self._pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._pos + n
        chunk, self._pos = self._data[self._pos : end], min(end, len(self._data))
        return chunk


# --------------------------------------------------------------------------------------- dataset
def find_shards(shards: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The shard paths that ``shards`` names, as :class:`TarShardDataset` reads them, refusing shards whose
    folder shows an unfinished :func:`write_tar_shards` of their set.

    Args:
        shards: one of
            - a folder: every ``*.tar`` file in it (not in subfolders; hidden files such as macOS's
              ``._shard-000000.tar`` skipped), sorted by name;
            - a glob pattern (``"data/train-*.tar"``, ``"data/**/*.tar"``), sorted by path; brace
              expansion (webdataset's ``shard-{000000..000009}.tar``) is not supported;
            - the path of one shard, or a sequence of paths (kept in the given order).
        Names sort as text, so number shards with leading zeros (``write_tar_shards`` does).
    Returns:
        The paths, in reading order.
    Raises:
        ValueError: if a folder holds no ``*.tar`` file, or shards of more than one set (``train-*`` beside
            ``val-*``: pass a pattern), a pattern matches no file, or the sequence is empty (each names what
            was looked for); if a write of the shards' set started and did not finish (new and old shards
            may be mixed). FileNotFoundError: a shard in the folder or the pattern is a dangling link.
            TypeError: on something that is not a path.
    """
    found = _find_shards(shards)
    for folder, prefix in sorted({(p.parent, _SHARD_NAME.sub("", p.name)) for p in found}):
        refuse_unfinished_write(folder, _set_name(prefix), f"the shards {prefix}-*.tar")
    return found


def _find_shards(shards: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    if isinstance(shards, (str, os.PathLike)):
        where = Path(shards)
        if where.is_dir():
            listed = sorted(p for p in where.glob("*.tar") if not p.name.startswith("."))
            _refuse_missing_shards(listed)
            found = [p for p in listed if p.is_file()]
            prefixes = sorted({_SHARD_NAME.sub("", p.name) for p in found})
            if len(prefixes) > 1:  # train-* beside val-*: reading both would mix two sets silently
                raise ValueError(
                    f"the folder {where} holds shards of {len(prefixes)} sets ({', '.join(prefixes[:5])}); pass a "
                    f"pattern for the one you want, e.g. '{where / prefixes[0]}-*.tar'"
                )
            if not found:
                compressed = sorted(p.name for p in where.glob("*.tar.*") if not p.name.startswith("."))
                hint = f" (it holds compressed ones, e.g. {compressed[0]}: decompress them)" if compressed else ""
                raise ValueError(f"no tar shards (*.tar) in the folder {where}{hint}")
            return found
        text = os.fspath(shards)
        braces = re.search(r"\{.*\}", text) is not None
        if where.exists() or not (glob.has_magic(text) or braces):
            return [where]  # one shard (a missing one raises FileNotFoundError when it is indexed)
        matched = sorted(Path(p) for p in glob.glob(text, recursive=True))
        _refuse_missing_shards(matched)
        found = [p for p in matched if p.is_file()]
        if not found:
            hint = (
                ": brace expansion ({000000..000009}) is not supported; pass a glob such as "
                "'shard-*.tar', a folder, or a list of paths"
                if braces
                else ""
            )
            raise ValueError(f"no files match the pattern {text!r}{hint}")
        return found
    if isinstance(shards, (bytes, bytearray)) or not isinstance(shards, Iterable):
        raise TypeError(f"shards must be a folder, a glob pattern or paths, got {type(shards).__name__}")
    found = [Path(s) for s in shards]
    if not found:
        raise ValueError("shards is empty: pass at least one tar shard, a folder of them or a glob pattern")
    return found


_SHARD_NAME = re.compile(r"(-\d+)?\.tar$")  # "train-000003.tar" -> prefix "train"


def _refuse_missing_shards(paths: Sequence[Path]) -> None:
    """A listed shard that is a dangling link (its disk unmounted, its target moved) is an error, never skipped."""
    dangling = [p for p in paths if p.is_symlink() and not p.exists()]
    if dangling:
        raise FileNotFoundError(
            f"{len(dangling)} shard(s) point to nothing (a dangling link: is their disk mounted?): "
            + ", ".join(str(p) for p in dangling[:3])
        )


def _distributed_rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialized default process group, else ``(0, 1)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _even_range(n: int, part: int, parts: int) -> tuple[int, int]:
    """The ``part``-th of ``parts`` contiguous, near-equal ranges of ``range(n)``."""
    return part * n // parts, (part + 1) * n // parts


class TarShardDataset(IterableDataset):
    """Iterate tar shards so that each sample is yielded exactly once per epoch across all
    DataLoader workers and all ranks (see the module docstring for the split).

    Args:
        shards: a folder of tar shards (every ``*.tar`` in it, sorted by name), a glob pattern
            (``"data/train-*.tar"``, sorted), one shard's path, or a sequence of paths (read in the
            given order); see :func:`find_shards`.
        shuffle_buffer: 0 for the fixed order; > 0 shuffles the shard order by ``(seed, epoch)``
            and the samples of each consumer through a buffer of this many samples.
        seed: shuffling seed; must be the same on every rank.
        rank, world_size: this process's place; both None means ``torch.distributed``'s values
            when it is initialized at construction, else a single process. They are resolved here,
            in the main process, and stored: DataLoader workers started with spawn/forkserver have
            no process group, so resolving them in ``__iter__`` would make every rank read rank 0's
            share (duplicated samples). Construct the dataset after ``init_process_group``.
        transform: optional callable applied to each sample dict (e.g. decoding), in the worker.
        uneven: what to do when the samples do not divide evenly between ranks. "exact" (default):
            every sample exactly once, ranks differ by at most one sample; under DDP a rank with one
            step more than the others then waits forever in that step's all-reduce (a hang), unless
            the loop stops every rank at the same step (e.g. ``min`` of ``samples_per_rank``) or uses
            ``DDP.join()``. "pad": every rank gets ``ceil(N / R)`` samples, the last ranks repeating
            the first samples of the epoch's order (``DistributedSampler``'s default). "drop": every
            rank gets ``floor(N / R)``, the last ``N mod R`` samples of the epoch's order are skipped
            (``drop_last=True``). ``samples_per_rank`` says what each rank gets.
        index_files: True (default) to take each shard's index from the small index file beside it
            (``.<shard name>.idx``, written by ``write_tar_shards``), checked against the shard and
            rebuilt (written again) when missing, stale or damaged; where the folder is read-only the
            index is built in memory. Construction then costs about a microsecond per sample instead
            of reading every header. False: read every header and write nothing.
    Raises:
        ValueError/TypeError: on bad arguments. ShardError: on a corrupt shard (at construction,
            when its headers are checked, or while reading).
    Length: ``len(ds)`` is the number of samples this rank yields per epoch, all its DataLoader
        workers together (``samples_per_rank[rank]``: with ``uneven="pad"`` the repeated samples
        count, with ``"drop"`` the skipped ones do not), so ``len(DataLoader(ds, batch_size=B))``
        works. For an ``IterableDataset`` PyTorch documents ``len(loader)`` as ``len(dataset) / B``
        rounded by ``drop_last`` "regardless of multi-process loading configurations"; it divides
        nothing by the workers, which is right here because the dataset splits itself. But each
        worker batches its own share, so with ``num_workers`` > 1 a loader can yield up to
        ``num_workers - 1`` batches more than ``len(loader)`` (each worker's last one partial), or
        fewer with ``drop_last=True``; :meth:`batches_per_epoch` gives the exact count (e.g. for a
        learning-rate schedule's total steps). Nothing warns: ``len(ds)`` is exact, and PyTorch's
        own warning (more items fetched than ``len(dataset)``) does not fire since
        ``batch_size=None`` yields exactly ``len(ds)`` samples and batches never outnumber samples.
    Note:
        ``set_epoch`` reaches DataLoader workers that persist (``persistent_workers=True``): the
        epoch lives in shared memory and each worker reads it when the next epoch's iteration starts.
        Call it before iterating the loader for that epoch, as with ``DistributedSampler``.
    """

    def __init__(
        self,
        shards: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        shuffle_buffer: int = 0,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        transform: Callable[[dict], object] | None = None,
        uneven: str = "exact",
        index_files: bool = True,
    ):
        super().__init__()
        shards = find_shards(shards)
        check_non_negative_int(shuffle_buffer, "shuffle_buffer")
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank and world_size, or neither")
        if world_size is not None:
            check_positive(world_size, "world_size", allow_none=False, integer=True)
            check_non_negative_int(rank, "rank")
            if rank >= world_size:
                raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if transform is not None and not callable(transform):
            raise TypeError("transform must be callable or None")
        if not isinstance(index_files, bool):
            raise TypeError(f"index_files must be True or False, got {type(index_files).__name__}")
        if uneven not in ("exact", "pad", "drop"):
            raise ValueError(f"uneven must be 'exact', 'pad' or 'drop', got {uneven!r}")
        self.uneven = uneven
        resolved = [p.resolve() for p in shards]
        if len(set(resolved)) != len(resolved):
            twice = next(p for p in resolved if resolved.count(p) > 1)
            raise ValueError(f"shard {twice} is listed twice: every sample would be read twice per epoch")
        if world_size is None:
            rank, world_size = _distributed_rank_and_world()
        self.indexes = tuple(load_shard_index(p, index_file=index_files) for p in shards)
        self.shuffle_buffer, self.seed, self.transform = shuffle_buffer, seed, transform
        self.rank, self.world_size = rank, world_size
        # In shared memory, so that set_epoch reaches DataLoader workers that persist across epochs
        # (persistent_workers=True): each worker reads it when its __iter__ starts the next epoch.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration uses (set with ``set_epoch``)."""
        return int(self._epoch)

    @property
    def num_samples(self) -> int:
        """Samples in all shards together (one epoch over all ranks and workers)."""
        return sum(len(ix) for ix in self.indexes)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` to seed the shuffle of the next iteration (same value on every rank)."""
        check_non_negative_int(epoch, "epoch")
        self._epoch.fill_(epoch)

    def plan(
        self, rank: int, world_size: int, worker: int = 0, num_workers: int = 1, *, epoch: int | None = None
    ) -> list[tuple[int, int, int]]:
        """The pieces ``(shard number, first sample, end sample)`` one consumer reads in ``epoch``
        (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        order = list(range(len(self.indexes)))
        if self.shuffle_buffer:
            random.Random(f"shards:{self.seed}:{epoch}").shuffle(order)
        total = self.num_samples
        lo, hi = self._rank_range(rank, world_size)
        wlo, whi = _even_range(hi - lo, worker, num_workers)
        lo, hi = lo + wlo, lo + whi
        pieces = []
        if total == 0:
            return pieces
        # Positions past the end (uneven="pad") wrap around to the start of the epoch's order.
        while lo < hi:
            turn_lo, turn_hi = lo % total, min(hi - lo, total - lo % total) + lo % total
            base = 0
            for shard in order:
                n = len(self.indexes[shard])
                start, stop = max(turn_lo, base), min(turn_hi, base + n)
                if start < stop:
                    pieces.append((shard, start - base, stop - base))
                base += n
            lo += turn_hi - turn_lo
        return pieces

    def _rank_range(self, rank: int, world_size: int) -> tuple[int, int]:
        """Positions ``[lo, hi)`` of the epoch's order that ``rank`` reads (past N: padding)."""
        total = self.num_samples
        if self.uneven == "exact":
            return _even_range(total, rank, world_size)
        per_rank = -(-total // world_size) if self.uneven == "pad" else total // world_size
        return rank * per_rank, (rank + 1) * per_rank

    def __len__(self) -> int:
        """Samples this rank yields per epoch, all its DataLoader workers together (see the class)."""
        lo, hi = self._rank_range(self.rank, self.world_size)
        return hi - lo

    def batches_per_epoch(self, batch_size: int | None, *, num_workers: int = 0, drop_last: bool = False) -> int:
        """The exact number of batches ``DataLoader(ds, batch_size=..., num_workers=..., drop_last=...)``
        yields on this rank per epoch: each worker batches its own share, so this can differ from
        ``len(loader)`` by up to ``num_workers - 1`` (see the class docstring). ``batch_size=None``
        (no batching): ``len(ds)``.

        Raises:
            TypeError/ValueError: on a bad ``batch_size``, ``num_workers`` or ``drop_last``.
        """
        check_positive(batch_size, "batch_size", integer=True)
        check_non_negative_int(num_workers, "num_workers")
        check_flag(drop_last, "drop_last")
        if batch_size is None:
            return len(self)
        consumers = max(num_workers, 1)
        shares = (hi - lo for lo, hi in (_even_range(len(self), w, consumers) for w in range(consumers)))
        return sum(n // batch_size if drop_last else -(-n // batch_size) for n in shares)

    @property
    def samples_per_rank(self) -> tuple[int, ...]:
        """Samples each rank reads per epoch: all equal with ``uneven="pad"`` or ``"drop"``."""
        return tuple(hi - lo for lo, hi in (self._rank_range(r, self.world_size) for r in range(self.world_size)))

    def __iter__(self) -> Iterator[object]:
        rank, world_size = self.rank, self.world_size  # resolved at construction, not in the worker
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self.epoch  # once: a set_epoch during this iteration applies to the next one
        samples = self._read_plan(list(self.plan(rank, world_size, worker, num_workers, epoch=epoch)))
        if self.shuffle_buffer:
            rng = random.Random(f"buffer:{self.seed}:{epoch}:{rank}:{worker}")
            samples = _buffer_shuffle(samples, self.shuffle_buffer, rng)
        for sample in samples:
            yield sample if self.transform is None else self.transform(sample)

    def _read_plan(self, plan: list[tuple[int, int, int]]) -> Iterator[dict]:
        for k, (shard, start, stop) in enumerate(plan):
            if k + 1 < len(plan):  # the next shard's first reads start while this one is read
                following = plan[k + 1]
                request_read_ahead(self.indexes[following[0]], following[1], following[2])
            yield from read_tar_samples(self.indexes[shard], start, stop)

    def __repr__(self) -> str:
        return (
            f"TarShardDataset({len(self.indexes)} shards, {self.num_samples} samples, "
            f"rank={self.rank}/{self.world_size}, shuffle_buffer={self.shuffle_buffer}, "
            f"seed={self.seed}, epoch={self.epoch}, uneven={self.uneven!r})"
        )


def _buffer_shuffle(items: Iterator, size: int, rng: random.Random) -> Iterator:
    """Shuffle a stream through a buffer of ``size`` items (the WebDataset/TF approach)."""
    buffer = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        buffer[j], item = item, buffer[j]
        yield item
    rng.shuffle(buffer)
    yield from buffer
