"""Tests for tricks_lib.data.shards: exactly-once splitting, atomic writes, corrupt shards, interop."""

import collections
import io
import os
import tarfile
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from tricks_lib.data import shards as shards_mod
from tricks_lib.data.shards import ShardError, TarShardDataset, index_tar_shard, write_tar_shards


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
    assert sorted(os.listdir(tmp_path)) == ["shard-000000.tar"]  # complete shard only, no temp file
    assert len(index_tar_shard(tmp_path / "shard-000000.tar")) == 4


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
