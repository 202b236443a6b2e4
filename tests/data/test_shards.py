"""Tests for tricks_lib.data.shards: exactly-once splitting, atomic writes, corrupt shards, interop."""

import collections
import dataclasses
import errno
import glob
import io
import os
import re
import shutil
import tarfile
import time
import types
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from tricks_lib.data import shards as shards_mod
from tricks_lib.data.shard_index import index_tar_shard
from tricks_lib.data.shard_index_file import index_file_path, load_shard_index, write_index_file
from tricks_lib.data.shards import TarShardDataset, find_shards, write_tar_shards
from tricks_lib.data.tar_format import ShardError


def make(n, payload=b"x"):
    return [{"__key__": f"s{i:04d}", "bin": payload * (1 + i % 700), "cls": str(i % 3).encode()} for i in range(n)]


def iterate_as(ds, rank, world_size, worker, num_workers, monkeypatch):
    """Run ds.__iter__ as DataLoader worker `worker` of `num_workers` on `rank` (in-process)."""
    ds.rank, ds.world_size = rank, world_size
    info = types.SimpleNamespace(id=worker, num_workers=num_workers)
    monkeypatch.setattr(shards_mod, "get_worker_info", lambda: info)
    return [s["__key__"] for s in ds]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 40),
    per_shard=st.integers(1, 12),
    world_size=st.integers(1, 4),
    num_workers=st.integers(1, 5),
    shuffle=st.sampled_from([0, 1, 7]),
    epoch=st.integers(0, 3),
)
def test_exactly_once_for_any_split(
    tmp_path_factory, monkeypatch, n, per_shard, world_size, num_workers, shuffle, epoch
):
    paths = write_tar_shards(make(n), tmp_path_factory.mktemp("s"), samples_per_shard=per_shard)
    ds = TarShardDataset(paths, shuffle_buffer=shuffle, seed=5)
    ds.set_epoch(epoch)
    per_consumer = [
        iterate_as(ds, r, world_size, w, num_workers, monkeypatch)
        for r in range(world_size)
        for w in range(num_workers)
    ]
    keys = [k for c in per_consumer for k in c]
    assert sorted(keys) == [f"s{i:04d}" for i in range(n)]  # every sample once: no dup, no loss
    sizes = [len(c) for c in per_consumer]
    assert max(sizes) - min(sizes) <= 1  # balanced, also with fewer shards than consumers


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_exactly_once_with_real_dataloader_workers(tmp_path, num_workers, world_size):
    # 2 shards for up to 3 ranks x 3 workers = 9 consumers: shards must be split inside.
    paths = write_tar_shards(make(23), tmp_path, samples_per_shard=12)
    keys = []
    for rank in range(world_size):
        ds = TarShardDataset(paths, shuffle_buffer=4, seed=1, rank=rank, world_size=world_size)
        loader = DataLoader(ds, batch_size=None, num_workers=num_workers)
        keys += [s["__key__"] for s in loader]
    assert collections.Counter(keys) == collections.Counter(f"s{i:04d}" for i in range(23))


def test_rank_is_resolved_at_construction_not_in_the_worker(tmp_path, monkeypatch):
    """Spawned DataLoader workers have no process group: the rank must travel with the dataset."""
    paths = write_tar_shards(make(9), tmp_path, samples_per_shard=4)
    dist = shards_mod.torch.distributed
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    ds = TarShardDataset(paths)
    monkeypatch.undo()  # iterate as a spawned worker would: no process group any more
    assert not dist.is_initialized()
    assert (ds.rank, ds.world_size) == (1, 3)
    assert [s["__key__"] for s in ds] == ["s0003", "s0004", "s0005"]  # rank 1's third, not all 9
    assert TarShardDataset(paths).world_size == 1  # no process group at construction: one process


def test_rewrite_with_fewer_shards_removes_stale_shards(tmp_path):
    write_tar_shards(make(10), tmp_path, samples_per_shard=2)  # 5 shards
    (tmp_path / "notes.txt").write_text("keep me")
    (tmp_path / "other-000007.tar").write_bytes(b"")  # another prefix: not ours to delete
    paths = write_tar_shards(make(4), tmp_path, samples_per_shard=2)  # 2 shards
    assert sorted(p.name for p in tmp_path.glob("shard-*.tar")) == [p.name for p in paths]
    assert len(paths) == 2
    assert TarShardDataset(sorted(tmp_path.glob("shard-*.tar"))).num_samples == 4
    assert (tmp_path / "notes.txt").exists() and (tmp_path / "other-000007.tar").exists()


def test_shuffle_is_seeded_and_epoch_dependent(tmp_path):
    paths = write_tar_shards(make(40), tmp_path, samples_per_shard=8)
    order = lambda ds: [s["__key__"] for s in ds]  # noqa: E731
    a, b = TarShardDataset(paths, shuffle_buffer=10, seed=3), TarShardDataset(paths, shuffle_buffer=10, seed=3)
    assert order(a) == order(b)
    first = order(a)
    a.set_epoch(1)
    assert order(a) != first and sorted(order(a)) == sorted(first)
    assert order(TarShardDataset(paths)) == sorted(first)  # no shuffle: shard order


def test_reads_back_exact_bytes_and_rank_from_arguments(tmp_path):
    samples = make(9)
    paths = write_tar_shards(samples, tmp_path, samples_per_shard=4)
    assert [p.name for p in paths] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert list(TarShardDataset(paths)) == samples
    ds = TarShardDataset(paths, rank=1, world_size=3)
    assert [s["__key__"] for s in ds] == ["s0003", "s0004", "s0005"]


def test_same_samples_same_bytes(tmp_path):
    a = write_tar_shards(make(10), tmp_path / "a", samples_per_shard=4)
    b = write_tar_shards(make(10), tmp_path / "b", samples_per_shard=4)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_interrupted_write_leaves_no_partial_shard(tmp_path, exc, failing_bytes):
    samples = make(10)
    samples[6]["bin"] = failing_bytes(b"boom", exc)
    with pytest.raises(exc):
        write_tar_shards(samples, tmp_path, samples_per_shard=4)
    # the complete shard and its index file, no temporary file; and the mark of an unfinished write
    assert sorted(os.listdir(tmp_path)) == [".shard-000000.tar.idx", ".shard-shards.writing", "shard-000000.tar"]
    assert len(index_tar_shard(tmp_path / "shard-000000.tar")) == 4
    with pytest.raises(ValueError, match="not one complete set"):
        TarShardDataset(tmp_path)  # 4 of the 10 samples: readers refuse it until a write completes


def test_python_tarfile_silently_drops_members_after_a_bad_header(tmp_path):
    """Why the reader is not tarfile: tarfile stops quietly at a corrupt header."""
    (path,) = write_tar_shards(make(3), tmp_path, samples_per_shard=3)
    data = bytearray(path.read_bytes())
    second = index_tar_shard(path).offsets[1]
    data[second + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with tarfile.open(path, "r|") as tar:
        assert len([m.name for m in tar]) == 2  # 6 members written, 2 returned, no error
    with pytest.raises(ShardError) as err:
        index_tar_shard(path)
    assert err.value.offset == second and "checksum" in err.value.reason


@pytest.mark.parametrize("cut", ["header", "data", "marker"])
def test_truncated_shard_raises_with_name_and_offset(tmp_path, cut):
    (path,) = write_tar_shards(make(5), tmp_path, samples_per_shard=5)
    index = index_tar_shard(path)
    where = {"header": index.offsets[3] + 100, "data": index.offsets[3] + 512 + 10, "marker": index.end}[cut]
    path.write_bytes(path.read_bytes()[:where])
    with pytest.raises(ShardError) as err:
        index_tar_shard(path)
    assert str(path) in str(err.value) and err.value.shard == path
    assert f"byte offset {err.value.offset}" in str(err.value)
    assert err.value.offset <= where and err.value.offset >= index.offsets[3] - 1


def test_shard_corrupted_after_indexing_raises_in_dataloader_worker(tmp_path):
    paths = write_tar_shards(make(8), tmp_path, samples_per_shard=4)
    ds = TarShardDataset(paths)
    data = bytearray(paths[1].read_bytes())
    data[ds.indexes[1].offsets[2] + 150] ^= 0xFF  # inside a header: checksum breaks
    paths[1].write_bytes(bytes(data))
    os.utime(paths[1], ns=(ds.indexes[1].mtime_ns, ds.indexes[1].mtime_ns))  # hide the change
    with pytest.raises(Exception, match=r"shard-000001\.tar.*byte offset"):
        list(DataLoader(ds, batch_size=None, num_workers=1))


def test_webdataset_reads_our_shards(tmp_path):
    wds = pytest.importorskip("webdataset")
    samples = make(11)
    paths = write_tar_shards(samples, tmp_path, samples_per_shard=4)
    got = list(wds.WebDataset([str(p) for p in paths], shardshuffle=False, empty_check=False))
    assert [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"} for s in got] == samples


def test_we_read_webdataset_shards(tmp_path):
    wds = pytest.importorskip("webdataset")
    samples = make(7)
    path = tmp_path / "wds-000000.tar"
    with wds.TarWriter(str(path), encoder=False) as sink:
        for s in samples:
            sink.write(s)
    assert list(TarShardDataset([path])) == samples


def test_long_keys_use_pax_headers(tmp_path):
    samples = [{"__key__": "d/" + "k" * 150 + str(i), "txt": b"v%d" % i} for i in range(3)]
    paths = write_tar_shards(samples, tmp_path, samples_per_shard=3)
    assert list(TarShardDataset(paths)) == samples


def test_arguments_are_validated(tmp_path):
    paths = write_tar_shards(make(2), tmp_path, samples_per_shard=2)
    with pytest.raises(ValueError, match="samples_per_shard"):
        write_tar_shards(make(2), tmp_path, samples_per_shard=0)
    with pytest.raises(ValueError, match="duplicate"):
        write_tar_shards(make(2) + make(1), tmp_path / "d", samples_per_shard=2)
    with pytest.raises(TypeError, match="bytes"):
        write_tar_shards([{"__key__": "a", "cls": 3}], tmp_path / "e", samples_per_shard=1)
    with pytest.raises(ValueError, match="without '.'"):
        write_tar_shards([{"__key__": "a.b", "cls": b"3"}], tmp_path / "f", samples_per_shard=1)
    for key in ["dir/", "a//b", "a/./b"]:  # the tar reader cannot split these into <key>.<ext>
        with pytest.raises(ValueError, match="empty or '.' path part"):
            write_tar_shards([{"__key__": key, "cls": b"3"}], tmp_path / "g", samples_per_shard=1)
    with pytest.raises(ValueError, match="control character"):
        write_tar_shards([{"__key__": "a\nb", "cls": b"3"}], tmp_path / "h", samples_per_shard=1)
    with pytest.raises(ValueError, match="rank"):
        TarShardDataset(paths, rank=2, world_size=2)
    with pytest.raises(ValueError, match="both"):
        TarShardDataset(paths, rank=0)
    with pytest.raises(ValueError, match="empty"):
        TarShardDataset([])
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        info = tarfile.TarInfo("noext")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ShardError, match="<key>.<ext>"):
        index_tar_shard(bad)


def test_a_shard_rewritten_with_its_old_mtime_is_noticed(tmp_path):
    # cp -p / rsync -a: new content, same size, mtime restored; or a rename over the indexed file.
    paths = write_tar_shards(make(8), tmp_path, samples_per_shard=8)
    ds = TarShardDataset(paths)
    index = ds.indexes[0]
    other = write_tar_shards(make(8, payload=b"y"), tmp_path / "other", samples_per_shard=8)[0]
    os.utime(other, ns=(index.mtime_ns, index.mtime_ns))
    os.replace(other, paths[0])  # same size and mtime; another inode
    assert paths[0].stat().st_size == index.size and paths[0].stat().st_mtime_ns == index.mtime_ns
    with pytest.raises(ShardError, match="changed since it was indexed"):
        list(ds)


@pytest.mark.slow
def test_set_epoch_reaches_persistent_workers(tmp_path):
    paths = write_tar_shards(make(24), tmp_path, samples_per_shard=4)
    ds = TarShardDataset(paths, shuffle_buffer=8, seed=3)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    orders = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        orders.append([s["__key__"] for s in loader])
    assert all(sorted(o) == sorted(s["__key__"] for s in make(24)) for o in orders)  # each sample once
    assert orders[0] != orders[1] != orders[2]  # a new order every epoch, not epoch 0's again
    fresh = []
    for epoch in range(3):  # the same orders as fresh workers started for each epoch
        ds.set_epoch(epoch)
        fresh.append([s["__key__"] for s in DataLoader(ds, batch_size=None, num_workers=2)])
    assert fresh == orders


def test_webdataset_compatible_names(tmp_path):
    def tar_of(path, members):
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path

    top = [
        ("a.JPG", b"1"),
        ("._a.JPG", b"resource fork"),
        ("a.cls", b"0"),
        (".DS_Store", b"x"),
        ("__index__", b"meta"),
        ("b.png", b"2"),
    ]
    path = tar_of(tmp_path / "mac.tar", top)
    got = list(TarShardDataset([path]))
    assert got == [{"__key__": "a", "jpg": b"1", "cls": b"0"}, {"__key__": "b", "png": b"2"}]
    wds = pytest.importorskip("webdataset")
    theirs = list(wds.WebDataset(str(path), shardshuffle=False, empty_check=False))
    assert [{k: v for k, v in s.items() if k == "__key__" or not k.startswith("__")} for s in theirs] == got
    # A macOS tar of a folder also holds dir/._name files; webdataset turns them into a sample keyed
    # "dir/" with the field "_b.png". Here they are skipped like the top-level ones.
    nested = tar_of(tmp_path / "nested.tar", [("dir/._b.png", b"fork"), ("dir/b.png", b"2")])
    assert list(TarShardDataset([nested])) == [{"__key__": "dir/b", "png": b"2"}]


def test_compressed_and_repeated_shards_get_clear_errors(tmp_path):
    import gzip

    paths = write_tar_shards(make(4), tmp_path, samples_per_shard=4)
    gz = tmp_path / "shard.tar.gz"
    gz.write_bytes(gzip.compress(paths[0].read_bytes()))
    with pytest.raises(ShardError, match="gzip-compressed shard"):
        TarShardDataset([gz])
    with pytest.raises(ValueError, match="listed twice"):
        TarShardDataset([paths[0], tmp_path / "." / paths[0].name])


@pytest.mark.parametrize("uneven", ["exact", "pad", "drop"])
@pytest.mark.parametrize("n, world_size", [(10, 3), (7, 4), (3, 5), (12, 4), (1, 2)])
def test_uneven_ranks_exact_pad_or_drop(tmp_path, monkeypatch, uneven, n, world_size):
    paths = write_tar_shards(make(n), tmp_path, samples_per_shard=3)
    ds = TarShardDataset(paths, rank=0, world_size=world_size, uneven=uneven)
    per_rank = [
        [key for w in range(2) for key in iterate_as(ds, r, world_size, w, 2, monkeypatch)] for r in range(world_size)
    ]
    counts = [len(keys) for keys in per_rank]
    assert tuple(counts) == ds.samples_per_rank
    everything = [k for keys in per_rank for k in keys]
    order = [s["__key__"] for s in make(n)]  # shard order, not shuffled
    if uneven == "exact":
        assert sorted(everything) == sorted(order) and max(counts) - min(counts) <= 1
    elif uneven == "pad":
        assert len(set(counts)) == 1 and counts[0] == -(-n // world_size)
        assert set(everything) == set(order)
        extra = collections.Counter(everything) - collections.Counter(order)
        assert sorted(extra.elements()) == sorted((order * world_size)[: sum(counts) - n])  # the first ones again
    else:
        assert len(set(counts)) == 1 and counts[0] == n // world_size
        assert everything == order[: n - n % world_size]  # the last n mod R samples skipped


def test_uneven_must_be_a_known_mode(tmp_path):
    paths = write_tar_shards(make(4), tmp_path, samples_per_shard=4)
    with pytest.raises(ValueError, match="uneven must be"):
        TarShardDataset(paths, uneven="repeat")


# ------------------------------------------------------------------------- index files (item 13)
def same_index(a, b):
    """Two ShardIndex objects describe the same samples at the same places."""
    arrays = ("member_first", "member_ext", "member_start", "data_offsets", "sizes", "header_fields")
    plain = ("keys", "offsets", "end", "size", "identity", "exts")
    return all(getattr(a, f) == getattr(b, f) for f in plain) and all(
        (getattr(a, f) == getattr(b, f)).all() for f in arrays
    )


def sources(ds):
    return [ix.source for ix in ds.indexes]


def test_the_writer_keeps_a_hidden_index_file_that_the_dataset_uses(tmp_path):
    samples = make(10)
    paths = write_tar_shards(samples, tmp_path, samples_per_shard=4)
    assert all(index_file_path(p).is_file() and index_file_path(p).name == f".{p.name}.idx" for p in paths)
    ds = TarShardDataset(paths)
    assert sources(ds) == ["index file"] * 3 and list(ds) == samples
    assert all(same_index(ix, index_tar_shard(p)) for ix, p in zip(ds.indexes, paths))
    # no listing of shards sees the index files: the writer's pattern, glob("*"), webdataset given it
    assert sorted(tmp_path.glob("shard-*.tar")) == paths == sorted(map(Path, glob.glob(f"{tmp_path}/*")))
    wds = pytest.importorskip("webdataset")
    got = list(wds.WebDataset(sorted(glob.glob(f"{tmp_path}/*")), shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in got] == [s["__key__"] for s in samples]


def test_a_missing_index_file_is_rebuilt(tmp_path):
    samples = make(10)
    paths = write_tar_shards(samples, tmp_path, samples_per_shard=4)
    index_file_path(paths[1]).unlink()
    ds = TarShardDataset(paths)
    assert sources(ds) == ["index file", "headers", "index file"] and list(ds) == samples
    assert index_file_path(paths[1]).is_file()  # written again: the next construction uses it
    assert sources(TarShardDataset(paths)) == ["index file"] * 3


def test_an_index_file_of_another_shard_is_not_used(tmp_path):
    samples = make(10)
    paths = write_tar_shards(samples, tmp_path, samples_per_shard=4)
    shutil.copy(index_file_path(paths[1]), index_file_path(paths[0]))
    ds = TarShardDataset(paths)
    assert sources(ds) == ["headers", "index file", "index file"] and list(ds) == samples
    assert same_index(load_shard_index(paths[0]), index_tar_shard(paths[0]))  # repaired on disk


@pytest.mark.parametrize("damage", ["empty", "head", "half", "last byte", "flipped bit"])
def test_a_damaged_index_file_is_rebuilt_never_trusted(tmp_path, damage):
    samples = make(10)
    paths = write_tar_shards(samples, tmp_path, samples_per_shard=10)
    sidecar = index_file_path(paths[0])
    data = bytearray(sidecar.read_bytes())
    if damage == "flipped bit":
        data[len(data) // 2] ^= 0x04
    else:
        data = data[: {"empty": 0, "head": 20, "half": len(data) // 2, "last byte": len(data) - 1}[damage]]
    sidecar.write_bytes(bytes(data))
    ds = TarShardDataset(paths)
    assert sources(ds) == ["headers"] and list(ds) == samples


def rewrite_with_sizes_swapped(path, samples, i, j):
    """Rewrite ``path`` in place with the sizes of samples i and j swapped (the same file size, other
    offsets) and its old mtime restored; returns the new samples."""
    stat = path.stat()
    new = [dict(s) for s in samples]
    new[i]["bin"], new[j]["bin"] = samples[j]["bin"][:1] * len(samples[j]["bin"]), samples[i]["bin"]
    scratch = write_tar_shards(new, path.parent / "scratch", samples_per_shard=len(new))[0]
    assert scratch.stat().st_size == stat.st_size
    with open(path, "r+b") as f:  # in place: same inode
        f.write(scratch.read_bytes())
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return new


def sized_samples():
    # 600 bytes take two blocks, 100 bytes one: swapping them moves the headers in between
    return [{"__key__": f"s{i:04d}", "bin": bytes([i]) * (600 if i == 2 else 100)} for i in range(6)]


def test_a_shard_rewritten_with_its_size_and_mtime_gets_a_new_index(tmp_path):
    samples = sized_samples()
    (path,) = write_tar_shards(samples, tmp_path, samples_per_shard=6)
    old = load_shard_index(path)
    new = rewrite_with_sizes_swapped(path, samples, 2, 4)
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (old.size, old.mtime_ns)
    ds = TarShardDataset([path])
    assert sources(ds) == ["headers"] and list(ds) == new  # the ctime (identity) changed: rebuilt


def test_a_stale_index_with_a_matching_identity_raises_instead_of_altering_samples(tmp_path):
    """The identity (size, mtime, device, inode, ctime) can collide: ctime ticks are coarse. Forge
    that collision: an index file of the old layout stamped with the rewritten file's identity."""
    samples = sized_samples()
    (path,) = write_tar_shards(samples, tmp_path, samples_per_shard=6)
    old = load_shard_index(path)
    rewrite_with_sizes_swapped(path, samples, 2, 4)  # first and last samples keep their headers
    stat = path.stat()
    identity = (stat.st_size, stat.st_mtime_ns, stat.st_dev, stat.st_ino, stat.st_ctime_ns)
    forged = dataclasses.replace(old, identity=identity)
    assert write_index_file(forged) is not None
    ds = TarShardDataset([path])
    assert sources(ds) == ["index file"]  # it passed the checks at construction ...
    with pytest.raises(ShardError, match="differs from the shard's index") as err:
        list(ds)  # ... but no read returns bytes from the old layout
    assert err.value.offset == old.offsets[2]  # sample 2, whose size changed
    # the same for an index built in memory and a file that changed afterwards
    ds.indexes = (dataclasses.replace(old, identity=identity, source="headers"),)
    with pytest.raises(ShardError, match="differs from the shard's index"):
        list(ds)


def test_headers_are_checked_just_ahead_of_the_reader_not_a_whole_shard_at_once(tmp_path):
    """Each block of header checks covers at most about 1 MiB: on a cold cache, gathering the headers
    of a whole shard of large samples before reading any waited for most of the shard's reads. The
    same forged index as above, with 300 KiB samples: the samples before the changed one are read."""
    samples = [{"__key__": f"s{i:04d}", "bin": bytes([i]) * ((600 if i == 6 else 300) << 10)} for i in range(9)]
    (path,) = write_tar_shards(samples, tmp_path, samples_per_shard=9)
    old = load_shard_index(path)
    rewrite_with_sizes_swapped(path, samples, 6, 7)  # sample 6's size changes; the last header stays
    stat = path.stat()
    identity = (stat.st_size, stat.st_mtime_ns, stat.st_dev, stat.st_ino, stat.st_ctime_ns)
    write_index_file(dataclasses.replace(old, identity=identity))
    read = []
    with pytest.raises(ShardError, match="differs from the shard's index") as err:
        read.extend(TarShardDataset([path]))
    assert err.value.offset == old.offsets[6]  # sample 6, whose size changed
    assert 3 <= len(read) <= 6 and read == samples[: len(read)]  # a block of 256 samples read none


def test_an_index_file_that_disagrees_with_the_last_header_is_rebuilt(tmp_path):
    samples = make(5)
    (path,) = write_tar_shards(samples, tmp_path, samples_per_shard=5)
    index = load_shard_index(path)
    sizes = index.sizes.copy()
    sizes[-1] += 1  # a consistent-looking layout that the shard's last header contradicts
    write_index_file(dataclasses.replace(index, sizes=sizes))
    ds = TarShardDataset([path])
    assert sources(ds) == ["headers"] and list(ds) == samples


def test_a_read_only_folder_indexes_in_memory(tmp_path, monkeypatch):
    samples = make(6)
    paths = write_tar_shards(samples, tmp_path, samples_per_shard=3)
    index_file_path(paths[0]).unlink()

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "replace", refuse)  # root ignores chmod: refuse the rename itself
    ds = TarShardDataset(paths)
    assert sources(ds) == ["headers", "index file"] and list(ds) == samples
    assert sorted(p.name for p in tmp_path.iterdir()) == [".shard-000001.tar.idx", *(p.name for p in paths)]
    monkeypatch.undo()
    if os.geteuid() != 0:  # a real read-only folder, where permissions apply
        tmp_path.chmod(0o555)
        try:
            assert list(TarShardDataset(paths)) == samples
        finally:
            tmp_path.chmod(0o755)


def test_index_files_false_reads_headers_and_writes_nothing(tmp_path):
    samples = make(6)
    paths = write_tar_shards(samples, tmp_path, samples_per_shard=3)
    for p in paths:
        index_file_path(p).unlink()
    ds = TarShardDataset(paths, index_files=False)
    assert sources(ds) == ["headers", "headers"] and list(ds) == samples
    assert not any(index_file_path(p).exists() for p in paths)
    with pytest.raises(TypeError, match="index_files"):
        TarShardDataset(paths, index_files=1)


def test_a_rewrite_with_fewer_shards_removes_their_index_files(tmp_path):
    write_tar_shards(make(10), tmp_path, samples_per_shard=2)  # 5 shards
    paths = write_tar_shards(make(4), tmp_path, samples_per_shard=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [p.name for p in paths] + [index_file_path(p).name for p in paths]
    )


def test_index_files_survive_dataloader_workers(tmp_path):
    samples = make(23)
    paths = write_tar_shards(samples, tmp_path, samples_per_shard=5)
    ds = TarShardDataset(paths)
    got = [s["__key__"] for s in DataLoader(ds, batch_size=None, num_workers=2)]
    assert sorted(got) == [s["__key__"] for s in samples]


# ------------------------------------------------------------- folders, globs and len (issue 16)
def test_a_folder_or_a_glob_pattern_names_the_shards_in_sorted_order(tmp_path):
    b = write_tar_shards(make(5), tmp_path, samples_per_shard=2, prefix="b")  # written first
    a = write_tar_shards(make(9)[5:], tmp_path, samples_per_shard=2, prefix="a")
    (tmp_path / "notes.txt").write_text("not a shard")
    (tmp_path / "._a-000000.tar").write_bytes(b"macOS resource fork: not a tar")  # hidden: skipped
    (tmp_path / "sub").mkdir()
    nested = write_tar_shards(make(11)[9:], tmp_path / "sub", samples_per_shard=2, prefix="c")
    expected = [s["__key__"] for s in make(9)[5:] + make(5)]  # a-* before b-*: sorted, not written order
    for where in (str(tmp_path / "*.tar"), tmp_path / "?-*.tar"):  # a pattern: both sets, because it asks for them
        assert [s["__key__"] for s in TarShardDataset(where)] == expected, where
    for where in (tmp_path, str(tmp_path)):  # a folder of two sets (a-*, b-*) would mix them silently: refused
        with pytest.raises(ValueError, match=r"2 sets \(a, b\).*-\*\.tar"):
            TarShardDataset(where)
    assert find_shards(tmp_path / "sub") == nested  # a folder of one set: every shard, not the hidden file
    assert find_shards(str(tmp_path / "**" / "*.tar")) == a + b + nested  # recursive glob
    assert find_shards(b[1]) == [b[1]] and find_shards([b[1], a[0]]) == [b[1], a[0]]  # a list keeps its order


def test_a_shard_that_is_a_dangling_link_is_an_error_never_skipped(tmp_path):
    shards = write_tar_shards(make(6), tmp_path / "data", samples_per_shard=2)
    (tmp_path / "data" / "shard-000003.tar").symlink_to(tmp_path / "unmounted" / "shard-000003.tar")
    for where in (tmp_path / "data", str(tmp_path / "data" / "shard-*.tar")):
        with pytest.raises(FileNotFoundError, match="dangling link.*shard-000003"):
            find_shards(where)
    assert find_shards(shards) == shards


def test_a_folder_or_a_pattern_that_finds_nothing_says_what_was_looked_for(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no tar shards \(\*\.tar\) in the folder .*empty$"):
        TarShardDataset(tmp_path / "empty")
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "shard-000000.tar.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(ValueError, match=r"compressed ones, e\.g\. shard-000000\.tar\.gz"):
        TarShardDataset(tmp_path / "gz")
    pattern = str(tmp_path / "train-*.tar")
    with pytest.raises(ValueError, match=re.escape(f"no files match the pattern '{pattern}'") + "$"):
        TarShardDataset(pattern)
    with pytest.raises(ValueError, match="brace expansion"):
        TarShardDataset(str(tmp_path / "shard-{000000..000003}.tar"))
    with pytest.raises(FileNotFoundError):
        TarShardDataset(tmp_path / "missing.tar")  # a plain missing path: the OS's error, naming it
    with pytest.raises(TypeError, match="folder, a glob pattern or paths"):
        TarShardDataset(3)
    paths = write_tar_shards(make(4), tmp_path / "s", samples_per_shard=2)
    with pytest.raises(ValueError, match="listed twice"):
        TarShardDataset([*paths, tmp_path / "s" / "." / paths[0].name])


def keys_of(batch):
    """collate_fn keeping only the keys (module level: picklable for DataLoader workers)."""
    return [s["__key__"] for s in batch]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "n, world_size, uneven, drop_last",
    [
        (10, 3, "exact", False),
        (10, 3, "pad", False),
        (10, 3, "drop", True),
        (7, 2, "pad", True),
        (8, 1, "exact", False),
    ],
)
def test_len_is_the_number_of_samples_each_rank_yields(tmp_path, n, world_size, uneven, drop_last, num_workers):
    paths = write_tar_shards(make(n), tmp_path, samples_per_shard=3)
    for rank in range(world_size):
        ds = TarShardDataset(tmp_path, rank=rank, world_size=world_size, uneven=uneven, shuffle_buffer=4)
        assert len(ds) == ds.samples_per_rank[rank] == len(list(ds))  # in-process: all of the rank's share
        loader = DataLoader(ds, batch_size=3, num_workers=num_workers, drop_last=drop_last, collate_fn=keys_of)
        assert len(loader) == (len(ds) // 3 if drop_last else -(-len(ds) // 3))  # PyTorch's formula on len(ds)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="Length of IterableDataset")  # PyTorch's len check
            batches = list(loader)
        assert len(batches) == ds.batches_per_epoch(3, num_workers=num_workers, drop_last=drop_last)
        if not drop_last:
            assert sum(map(len, batches)) == len(ds)  # every sample the rank reads, in its workers
    assert len(paths) == -(-n // 3)


def test_batches_per_epoch_counts_each_workers_partial_batch(tmp_path):
    write_tar_shards(make(8), tmp_path, samples_per_shard=8)
    ds = TarShardDataset(tmp_path)
    # 2 workers of 4 samples each, batches of 3: 2 + 2 batches, where len(loader) says ceil(8 / 3) = 3
    assert len(DataLoader(ds, batch_size=3, num_workers=2)) == 3
    assert ds.batches_per_epoch(3, num_workers=2) == 4 and ds.batches_per_epoch(3, num_workers=2, drop_last=True) == 2
    assert ds.batches_per_epoch(3) == 3 and ds.batches_per_epoch(None, num_workers=2) == 8 == len(ds)
    with pytest.raises(TypeError, match="batch_size"):
        ds.batches_per_epoch(True)
    with pytest.raises(ValueError, match="batch_size"):
        ds.batches_per_epoch(0)
    with pytest.raises(TypeError, match="drop_last"):
        ds.batches_per_epoch(3, drop_last=1)


def test_the_next_shard_is_read_ahead_while_one_is_read(tmp_path):
    """On a cold cache, every shard used to start with a wait for its first read; the dataset now asks
    for the next shard of its plan (posix_fadvise WILLNEED) when it starts one."""
    from tricks_lib.data import evict_from_page_cache, page_cache_residency

    samples = [{"__key__": f"s{i:04d}", "bin": bytes([i % 251]) * (64 << 10)} for i in range(32)]
    first, second = write_tar_shards(samples, tmp_path, samples_per_shard=16)
    if not evict_from_page_cache([first, second]).verified:
        pytest.skip("cannot evict files from the page cache here (no mincore or no fadvise)")
    ds = TarShardDataset([first, second])
    it = iter(ds)
    assert next(it) == samples[0]  # the first shard is being read ...
    deadline = time.monotonic() + 5
    while page_cache_residency([second]).fraction < 0.5 and time.monotonic() < deadline:
        time.sleep(0.01)  # ... and the second one arrives without being touched
    assert page_cache_residency([second]).fraction >= 0.5
    assert [next(it) for _ in range(31)] == samples[1:]


def test_a_zero_filled_tail_is_lost_samples_not_a_shorter_shard_and_the_index_file_is_kept(tmp_path):
    (path,) = write_tar_shards(make(100), tmp_path, samples_per_shard=100)
    recorded = index_file_path(path).read_bytes()
    start = index_tar_shard(path).offsets[10]
    size = path.stat().st_size
    with open(path, "r+b") as f:  # lost writes after a crash: the length stays, zeros from sample 10 on
        f.seek(start)
        f.write(bytes(size - start))
    with pytest.raises(ShardError, match="bytes of zeros"):
        list(TarShardDataset([path]))
    with pytest.raises(ShardError, match="bytes of zeros"):
        load_shard_index(path)
    assert index_file_path(path).read_bytes() == recorded  # never replaced by a 10-sample index


def test_padding_up_to_one_record_is_tar_and_reads(tmp_path):
    (path,) = write_tar_shards(make(3), tmp_path, samples_per_shard=3)
    index_file_path(path).unlink()
    end = index_tar_shard(path).end
    with open(path, "r+b") as f:  # a writer with another record size: up to one 10 KiB record of padding
        f.truncate(end + 1024 + 10240)
    assert [s["__key__"] for s in TarShardDataset([path])] == ["s0000", "s0001", "s0002"]


def test_a_shard_cut_short_behind_its_index_file_is_reported(tmp_path):
    samples = make(20)
    (path,) = write_tar_shards(samples, tmp_path, samples_per_shard=20)
    recorded = index_file_path(path).read_bytes()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:  # the same name, only its first 8 samples
        for s in samples[:8]:
            for ext in ("bin", "cls"):
                info = tarfile.TarInfo(f"{s['__key__']}.{ext}")
                info.size = len(s[ext])
                tar.addfile(info, io.BytesIO(s[ext]))
    with pytest.raises(ShardError, match="holds 8 samples where its index file .* recorded 20"):
        load_shard_index(path)
    assert index_file_path(path).read_bytes() == recorded
    index_file_path(path).unlink()  # meant to be shorter: the message's way out
    assert len(load_shard_index(path)) == 8


def test_an_interrupted_rewrite_is_refused_not_read_as_a_mix(tmp_path):
    write_tar_shards(make(20), tmp_path, samples_per_shard=5)  # 4 shards, the old version

    def new_version():
        for i, s in enumerate(make(20, payload=b"y")):
            if i == 7:
                raise RuntimeError("the machine went down")
            yield s

    with pytest.raises(RuntimeError):
        write_tar_shards(new_version(), tmp_path, samples_per_shard=5)  # 1 new shard over the old ones
    for shards in (tmp_path, str(tmp_path / "shard-*.tar"), sorted(tmp_path.glob("shard-*.tar"))):
        with pytest.raises(ValueError, match="not one complete set: the write stopped"):
            TarShardDataset(shards)
    write_tar_shards(make(20, payload=b"y"), tmp_path, samples_per_shard=5)  # the rewrite completes
    assert {bytes(s["bin"])[:1] for s in TarShardDataset(tmp_path)} == {b"y"}


_CUT_WHILE_READ = """
import os, sys
from tricks_lib.data.shard_index_file import load_shard_index
from tricks_lib.data.shard_index import read_tar_samples
from tricks_lib.data.tar_format import ShardError
path = sys.argv[1]
samples = read_tar_samples(load_shard_index(path))
next(samples)
os.truncate(path, os.path.getsize(path) // 3)  # cut (or copied over in place) while it is read
try:
    for _ in samples:
        pass
except ShardError as err:
    print("ShardError:", err)
"""


def test_a_shard_cut_while_it_is_read_is_a_shard_error_not_a_sigbus(tmp_path):
    import subprocess
    import sys

    (path,) = write_tar_shards(make(300, payload=b"z" * 50), tmp_path, samples_per_shard=300)
    # In a child: a SIGBUS would kill this process too.
    done = subprocess.run(
        [sys.executable, "-c", _CUT_WHILE_READ, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -7: killed by SIGBUS
    assert "ShardError:" in done.stdout and "cut to" in done.stdout and path.name in done.stdout
