"""Tests for tricks_lib.data.cache (page-cache eviction) and tricks_lib.data.prefetch."""

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tricks_lib.data.cache import evict_from_page_cache, page_cache_residency
from tricks_lib.data.prefetch import DevicePrefetcher, move_to_device


def _fs_type(path: Path) -> str:
    best, kind = "", "unknown"
    with open("/proc/mounts") as f:
        for line in f:
            _, mount, fs = line.split()[:3]
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fs
    return kind


def buffer_reusing_loader(n, pinned=False):
    """A loader that refills one buffer for every batch (as fast pipelines do): batch i is all i."""
    buffer = torch.empty(1024)
    if pinned:
        buffer = buffer.pin_memory()
    for i in range(n):
        buffer.fill_(i)
        yield buffer


def test_cpu_prefetcher_copies_what_a_buffer_reusing_loader_yields():
    got = [b.clone() for b in DevicePrefetcher(buffer_reusing_loader(6), "cpu", depth=3)]
    assert [int(b[0]) for b in got] == list(range(6)) and all(bool((b == b[0]).all()) for b in got)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_prefetcher_waits_for_its_copy_before_the_loader_refills_the_buffer():
    got = [b.cpu() for b in DevicePrefetcher(buffer_reusing_loader(6, pinned=True), "cuda")]
    assert [int(b[0]) for b in got] == list(range(6)) and all(bool((b == b[0]).all()) for b in got)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore/posix_fadvise are Linux")
def test_eviction_is_verified_cold_then_warm_again(tmp_path):
    if _fs_type(tmp_path) in ("tmpfs", "overlay", "unknown"):
        pytest.skip(f"page cache cannot be dropped on {_fs_type(tmp_path)}")
    (tmp_path / "a.bin").write_bytes(os.urandom(1 << 20))
    (tmp_path / "b.bin").write_bytes(os.urandom(5000))
    (tmp_path / "a.bin").read_bytes()
    report = evict_from_page_cache(tmp_path)
    assert report.after.method == "mincore" and report.after.files == 2
    assert report.after.total_bytes == (1 << 20) + 5000
    assert report.verified and report.after.fraction <= 0.01
    (tmp_path / "a.bin").read_bytes()
    assert page_cache_residency(tmp_path / "a.bin").fraction == 1.0


def test_residency_rejects_missing_paths(tmp_path):
    with pytest.raises(FileNotFoundError):
        page_cache_residency(tmp_path / "missing")


def test_move_to_device_keeps_structure():
    batch = {"x": torch.ones(2), "y": [torch.zeros(1), "label"], "z": (torch.arange(3),)}
    moved = move_to_device(batch, "cpu")
    assert moved["y"][1] == "label" and isinstance(moved["z"], tuple)
    assert torch.equal(moved["z"][0], torch.arange(3))


def test_cpu_prefetcher_loads_ahead_and_keeps_order():
    produced = [threading.Event() for _ in range(6)]

    def loader():
        for i in range(5):
            produced[i].set()
            yield torch.tensor([i])

    out = []
    for batch in DevicePrefetcher(loader(), "cpu", depth=2):
        i = int(batch)
        # While the consumer holds batch i, the thread has already loaded batch i+1.
        assert i == 4 or produced[i + 1].wait(timeout=5)
        out.append(i)
    assert out == [0, 1, 2, 3, 4]


def test_cpu_prefetcher_reraises_loader_errors_and_stops_early():
    def bad():
        yield torch.zeros(1)
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(DevicePrefetcher(bad(), "cpu"))
    it = iter(DevicePrefetcher((torch.tensor([i]) for i in range(1000)), "cpu"))
    assert int(next(it)) == 0
    it.close()  # the background thread must stop, not hang
    assert not any(t.name == "DevicePrefetcher" and t.is_alive() for t in threading.enumerate())


def test_prefetcher_validates_depth():
    with pytest.raises(ValueError, match="depth"):
        DevicePrefetcher([], "cpu", depth=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_prefetcher_matches_plain_copy():
    batches = [torch.randn(64, 3) for _ in range(4)]
    got = [b.cpu() for b in DevicePrefetcher(batches, "cuda")]
    assert all(torch.equal(a, b) for a, b in zip(got, batches))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore/posix_fadvise are Linux")
def test_cheap_drop_works_once_files_are_clean(tmp_path):
    if _fs_type(tmp_path) in ("tmpfs", "overlay", "unknown"):
        pytest.skip(f"page cache cannot be dropped on {_fs_type(tmp_path)}")
    from tricks_lib.data.cache import drop_from_page_cache

    path = tmp_path / "a.bin"
    path.write_bytes(os.urandom(1 << 18))
    assert evict_from_page_cache(path).verified  # flushes once
    path.read_bytes()
    assert page_cache_residency(path).fraction == 1.0
    assert drop_from_page_cache(path) == 1
    assert page_cache_residency(path).fraction <= 0.01


# --- process_memory / loader_worker_memory -------------------------------------------------------

from tricks_lib.data.cache import ProcessMemory, loader_worker_memory, process_memory  # noqa: E402

HAS_SMAPS_ROLLUP = Path("/proc/self/smaps_rollup").exists()
needs_smaps = pytest.mark.skipif(not HAS_SMAPS_ROLLUP, reason="needs /proc/<pid>/smaps_rollup (Linux 4.14+)")

_ROLLUP = """00400000-7fff0000 ---p 00000000 00:00 0  [rollup]
Rss:                1000 kB
Pss:                 600 kB
Shared_Clean:        300 kB
Shared_Dirty:        100 kB
Private_Clean:        50 kB
Private_Dirty:       550 kB
Swap:                  0 kB
"""


def _fake_proc(tmp_path, pid=123, text=_ROLLUP):
    for name in ("self", str(pid)):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "smaps_rollup").write_text(text)
    return tmp_path


def test_process_memory_parses_smaps_rollup(tmp_path):
    m = process_memory(123, proc=_fake_proc(tmp_path))
    assert m == ProcessMemory(123, 1000 * 1024, 600 * 1024, 600 * 1024, 400 * 1024, "smaps_rollup")
    assert m.available and "private 0.6 MiB" in repr(m)


def test_process_memory_without_smaps_rollup_says_why(tmp_path):
    m = process_memory(1, proc=tmp_path)  # an empty folder: no procfs
    assert not m.available and m.private_bytes is None and m.rss_bytes is None
    assert m.method.startswith("unavailable:") and "smaps_rollup" in m.method
    incomplete = process_memory(123, proc=_fake_proc(tmp_path, text="Rss: 4 kB\n"))
    assert not incomplete.available and "Pss" in incomplete.method


def test_process_memory_validates_pid(tmp_path):
    with pytest.raises(TypeError):
        process_memory(True)
    with pytest.raises(TypeError):
        process_memory("123")
    with pytest.raises(ValueError):
        process_memory(0)
    with pytest.raises(ProcessLookupError):
        process_memory(456, proc=_fake_proc(tmp_path))


@needs_smaps
def test_process_memory_sees_private_pages_of_this_process():
    before = process_memory()
    assert before.pid == os.getpid() and before.rss_bytes == before.private_bytes + before.shared_bytes
    block = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, every page written
    after = process_memory()
    assert after.private_bytes - before.private_bytes >= 56 << 20
    del block


def test_loader_worker_memory_validates_arguments():
    with pytest.raises(TypeError):
        loader_worker_memory(42, multiprocessing_context="fork")
    with pytest.raises(TypeError):
        loader_worker_memory([], multiprocessing_context=None)
    with pytest.raises(ValueError, match="one of"):
        loader_worker_memory([], multiprocessing_context="thread")
    with pytest.raises(ValueError, match="timeout"):
        loader_worker_memory([], multiprocessing_context="fork", timeout=0)


def _cache(mib):
    """A RAM cache of decoded samples: `mib` MiB of (64, 64, 3) uint8 arrays with labels, every page written."""
    return [(np.full((64, 64, 3), i % 251, dtype=np.uint8), i) for i in range((mib << 20) // (64 * 64 * 3))]


@needs_smaps
@pytest.mark.skipif("fork" not in __import__("multiprocessing").get_all_start_methods(), reason="no fork here")
def test_forked_worker_shares_the_cache_copy_on_write():
    cache = _cache(32)
    empty = loader_worker_memory([(np.zeros(1, np.uint8), 0)], multiprocessing_context="fork")
    full = loader_worker_memory(cache, multiprocessing_context="fork")
    assert full.pid != os.getpid() and full.available
    assert full.private_bytes - empty.private_bytes < 8 << 20  # far less than the 32 MiB it read
    assert full.shared_bytes >= 32 << 20  # the cache's pages, shared with this process


@needs_smaps
@pytest.mark.slow
def test_spawned_worker_holds_its_own_copy_of_a_numpy_cache():
    tiny = [(np.zeros(1, np.uint8), 0)]
    empty = loader_worker_memory(tiny, multiprocessing_context="spawn")
    full = loader_worker_memory(_cache(32), multiprocessing_context="spawn")
    assert full.private_bytes - empty.private_bytes >= 24 << 20  # pickled into the worker: a private copy


def test_prefetcher_refuses_a_device_this_machine_lacks_in_one_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="no usable CUDA device; use 'cpu'"):
        DevicePrefetcher([torch.zeros(2)], "cuda")
    with pytest.raises(ValueError, match="not a device name"):
        DevicePrefetcher([torch.zeros(2)], "gpu")
    for wrong in (0, None):
        with pytest.raises(TypeError, match="device"):
            DevicePrefetcher([torch.zeros(2)], wrong)
