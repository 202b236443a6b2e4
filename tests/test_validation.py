"""One rule for every public function: TypeError for a wrong type (bools refused where a count is
expected), ValueError for a value out of range; data/ included."""

import pytest
import torch

from tricks_lib.data import DecodeSample, DevicePrefetcher, TarShardDataset, render_photos, write_tar_shards
from tricks_lib.data.cache import loader_worker_memory, process_memory
from tricks_lib.training.batch_size import largest_batch
from tricks_lib.training.models import MLP


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    from tricks_lib.data import make_samples

    out = tmp_path_factory.mktemp("shards")
    return write_tar_shards(make_samples(render_photos(4, size=16)), out, samples_per_shard=4)[0]


CASES = [
    ("render_photos count=True", lambda s: render_photos(True), TypeError),
    ("render_photos count='3'", lambda s: render_photos("3"), TypeError),
    ("render_photos count=0", lambda s: render_photos(0), ValueError),
    ("render_photos size=(True, 16)", lambda s: render_photos(2, size=(True, 16)), ValueError),
    ("DecodeSample size=True", lambda s: DecodeSample(True), TypeError),
    ("DecodeSample size=0", lambda s: DecodeSample(0), ValueError),
    ("DecodeSample draft='yes'", lambda s: DecodeSample(16, draft="yes"), TypeError),
    ("DevicePrefetcher depth=True", lambda s: DevicePrefetcher([], "cpu", depth=True), TypeError),
    ("DevicePrefetcher depth=0", lambda s: DevicePrefetcher([], "cpu", depth=0), ValueError),
    (
        "write_tar_shards samples_per_shard=True",
        lambda s: write_tar_shards([], s.parent, samples_per_shard=True),
        TypeError,
    ),
    ("write_tar_shards samples_per_shard=0", lambda s: write_tar_shards([], s.parent, samples_per_shard=0), ValueError),
    ("TarShardDataset shuffle_buffer=1.5", lambda s: TarShardDataset([s], shuffle_buffer=1.5), TypeError),
    ("TarShardDataset shuffle_buffer=-1", lambda s: TarShardDataset([s], shuffle_buffer=-1), ValueError),
    ("TarShardDataset rank=True", lambda s: TarShardDataset([s], rank=True, world_size=2), TypeError),
    ("TarShardDataset world_size=0", lambda s: TarShardDataset([s], rank=0, world_size=0), ValueError),
    ("TarShardDataset rank=2 of 2", lambda s: TarShardDataset([s], rank=2, world_size=2), ValueError),
    ("set_epoch(True)", lambda s: TarShardDataset([s]).set_epoch(True), TypeError),
    ("set_epoch(-1)", lambda s: TarShardDataset([s]).set_epoch(-1), ValueError),
    ("process_memory pid=True", lambda s: process_memory(True), TypeError),
    ("process_memory pid=0", lambda s: process_memory(0), ValueError),
    (
        "loader_worker_memory timeout=True",
        lambda s: loader_worker_memory(torch.zeros(2), multiprocessing_context="spawn", timeout=True),
        TypeError,
    ),
    ("MLP depth=True", lambda s: MLP(4, 2, hidden=8, depth=True), TypeError),
    ("MLP hidden=0", lambda s: MLP(4, 2, hidden=0), ValueError),
    ("largest_batch budget_bytes=True", lambda s: largest_batch(lambda b: lambda: None, budget_bytes=True), TypeError),
]


@pytest.mark.parametrize("call, error", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_rule_for_bad_arguments(shard, call, error):
    with pytest.raises(error):
        call(shard)
