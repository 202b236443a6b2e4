"""Tests for tricks_lib.data.cache (page-cache eviction) and tricks_lib.data.prefetch."""

import os
import sys
import threading
from pathlib import Path

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
