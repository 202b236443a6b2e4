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
"""

from __future__ import annotations

import glob
import mmap
import os
import random
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import IterableDataset, get_worker_info

from tricks_lib._atomic import atomic_path
from tricks_lib._validate import check_non_negative_int, check_positive
from tricks_lib.data.samples import check_samples
from tricks_lib.data.tar_format import BLOCK, ShardError, iter_members

__all__ = ["ShardError", "ShardIndex", "TarShardDataset", "index_tar_shard", "read_tar_samples", "write_tar_shards"]


def write_tar_shards(
    samples: Iterable[dict], out_dir: str | os.PathLike, *, samples_per_shard: int, prefix: str = "shard"
) -> list[Path]:
    """Write samples into tar shards ``out_dir/<prefix>-000000.tar``, ... in the WebDataset layout.

    Each shard is written under a temporary name and renamed when complete, so an interrupted run
    leaves only complete shards under final names. Member metadata is fixed (mtime 0, uid 0, mode
    0444): the same samples give the same bytes.

    Rewriting a folder replaces its shards: after all new shards are written, shards of an earlier
    write named ``<prefix>-NNNNNN.tar`` with a higher number than the last new one are deleted, so
    ``glob("<prefix>-*.tar")`` finds exactly the new samples. (If a rewrite is interrupted, old
    shards beyond the new ones remain until a rewrite completes.) Other files are left alone.

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
    shards: list[Path] = []
    seen: set[str] = set()
    it = iter(check_samples(samples))
    while True:
        first = next(it, None)
        if first is None:
            _remove_stale_shards(out, prefix, len(shards))
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
        shards.append(path)


def _remove_stale_shards(out: Path, prefix: str, count: int) -> None:
    """Delete ``out/<prefix>-NNNNNN.tar`` numbered ``count`` or higher (left by an earlier write)."""
    pattern = re.compile(re.escape(prefix) + r"-(\d{6,})\.tar")
    for path in out.glob(f"{glob.escape(prefix)}-*.tar"):
        match = pattern.fullmatch(path.name)
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


# Members webdataset skips, so both readers see the same samples: hidden files (macOS's "._*"
# resource forks and ".DS_Store", added by tar on a Mac) and "__name__" metadata entries.
_SKIPPED_MEMBER = re.compile(r"(^|/)\.[^/]*$|__[^/]*__($|/)")
# Leading bytes of compressed files: a .tar.gz is not a tar, and "corrupt header" would mislead.
_COMPRESSION_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def _split_name(name: str, shard: Path, offset: int) -> tuple[str, str]:
    """``(key, ext)`` of a member: the key up to the first '.' of the base name, the extension
    lower-cased (webdataset's rule, so ``a.JPG`` and ``a.jpg`` are the same field in both readers)."""
    head, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem or not ext:
        raise ShardError(shard, offset, f"member {name!r} is not named <key>.<ext>")
    return (f"{head}/{stem}" if head else stem), ext.lower()


@dataclass(frozen=True, repr=False)
class ShardIndex:
    """Where each sample of one shard starts. ``offsets[i]`` is sample ``i``'s first byte;
    ``end`` is the offset of the end-of-archive marker; ``identity`` identifies the file: size,
    mtime, and device, inode and ctime, so a file rewritten in place with its mtime restored
    (``cp -p``, ``rsync -a``) or replaced by a rename is noticed."""

    path: Path
    keys: tuple[str, ...]
    offsets: tuple[int, ...]
    end: int
    size: int
    mtime_ns: int
    identity: tuple[int, ...] = ()
    # Per sample, its fields as (ext, data offset, size): a read slices the file by these, without
    # parsing the headers again (they were all checked here, and the identity says the file is unchanged).
    members: tuple[tuple[tuple[str, int, int], ...], ...] = ()

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        return f"ShardIndex({self.path.name!r}, {len(self.keys)} samples, {self.size} bytes)"


def index_tar_shard(path: str | os.PathLike) -> ShardIndex:
    """Read every header of a shard (not the data) and return its :class:`ShardIndex`.

    Raises:
        ShardError: on a truncated or corrupt shard, a misnamed member or a repeated key.
        FileNotFoundError: if the file does not exist.
    """
    path = Path(path)
    with open(path, "rb") as f:
        stat = os.fstat(f.fileno())
        magic = f.read(6)
        for prefix, kind in _COMPRESSION_MAGIC.items():
            if magic.startswith(prefix):
                raise ShardError(
                    path,
                    0,
                    f"{kind}-compressed shard: TarShardDataset reads uncompressed tar shards only "
                    "(random access by offset); decompress it, or read it with webdataset",
                )
        keys, offsets, members, seen, current, exts = [], [], [], set(), None, set()
        for start, name, data_offset, size in iter_members(f, path, stat.st_size):
            if _SKIPPED_MEMBER.search(name):
                continue
            key, ext = _split_name(name, path, start)
            if key != current:
                if key in seen:
                    raise ShardError(path, start, f"key {key!r} appears in two separate groups")
                seen.add(key)
                keys.append(key)
                offsets.append(start)
                members.append([])
                current, exts = key, set()
            if ext in exts:
                raise ShardError(path, start, f"member {name!r} appears twice")
            exts.add(ext)
            members[-1].append((ext, data_offset, size))
        end = f.tell() - BLOCK
    return ShardIndex(
        path,
        tuple(keys),
        tuple(offsets),
        end,
        stat.st_size,
        stat.st_mtime_ns,
        _identity(stat),
        tuple(tuple(m) for m in members),
    )


def _identity(stat: os.stat_result) -> tuple[int, ...]:
    return (stat.st_size, stat.st_mtime_ns, stat.st_dev, stat.st_ino, stat.st_ctime_ns)


def read_tar_samples(index: ShardIndex, start: int = 0, stop: int | None = None) -> Iterator[dict]:
    """Yield samples ``start..stop-1`` of an indexed shard as ``{"__key__": key, ext: bytes}``.

    Raises:
        ShardError: if the shard is corrupt or changed since it was indexed.
    """
    stop = len(index) if stop is None else stop
    if not 0 <= start <= stop <= len(index):
        raise ValueError(f"need 0 <= start <= stop <= {len(index)}, got {start}, {stop}")
    if start == stop:
        return
    with open(index.path, "rb") as f:
        stat = os.fstat(f.fileno())
        if _identity(stat) != index.identity:
            raise ShardError(index.path, 0, "shard changed since it was indexed; index it again")
        # Every header was checked when the index was built and the file is the same one (identity):
        # slice the data by the offsets the index holds, from one read-only mapping.
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            if hasattr(mapped, "madvise"):
                first = index.offsets[start] // mmap.PAGESIZE * mmap.PAGESIZE
                last = index.offsets[stop] if stop < len(index) else index.end
                mapped.madvise(mmap.MADV_SEQUENTIAL, first, max(last - first, 1))
            keys, members = index.keys, index.members
            for i in range(start, stop):
                sample = {"__key__": keys[i]}
                for ext, offset, size in members[i]:
                    sample[ext] = mapped[offset : offset + size]
                yield sample


# --------------------------------------------------------------------------------------- dataset
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
        shards: a path or a sequence of paths of tar shards (read in the given order).
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
    Raises:
        ValueError/TypeError: on bad arguments. ShardError: on a corrupt shard (at construction,
            when every header is checked, or while reading).
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
    ):
        super().__init__()
        if isinstance(shards, (str, os.PathLike)):
            shards = [shards]
        shards = [Path(s) for s in shards]
        if not shards:
            raise ValueError("shards is empty: pass at least one tar shard")
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
        if uneven not in ("exact", "pad", "drop"):
            raise ValueError(f"uneven must be 'exact', 'pad' or 'drop', got {uneven!r}")
        self.uneven = uneven
        resolved = [p.resolve() for p in shards]
        if len(set(resolved)) != len(resolved):
            twice = next(p for p in resolved if resolved.count(p) > 1)
            raise ValueError(f"shard {twice} is listed twice: every sample would be read twice per epoch")
        if world_size is None:
            rank, world_size = _distributed_rank_and_world()
        self.indexes = tuple(index_tar_shard(p) for p in shards)
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

    @property
    def samples_per_rank(self) -> tuple[int, ...]:
        """Samples each rank reads per epoch: all equal with ``uneven="pad"`` or ``"drop"``."""
        return tuple(hi - lo for lo, hi in (self._rank_range(r, self.world_size) for r in range(self.world_size)))

    def __iter__(self) -> Iterator[object]:
        rank, world_size = self.rank, self.world_size  # resolved at construction, not in the worker
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self.epoch  # once: a set_epoch during this iteration applies to the next one
        samples = (
            sample
            for shard, start, stop in self.plan(rank, world_size, worker, num_workers, epoch=epoch)
            for sample in read_tar_samples(self.indexes[shard], start, stop)
        )
        if self.shuffle_buffer:
            rng = random.Random(f"buffer:{self.seed}:{epoch}:{rank}:{worker}")
            samples = _buffer_shuffle(samples, self.shuffle_buffer, rng)
        for sample in samples:
            yield sample if self.transform is None else self.transform(sample)

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
