"""tricks_lib.data.jpeg_pipeline (with jpeg_batches and loader_efficiency): same samples as a plain decode,
each once per epoch; the ring's contract."""

import io
import resource

import cv2
import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from tricks_lib.comparing import Budget, compare
from tricks_lib.data.images import encode_image, render_photos
from tricks_lib.data.jpeg_batches import (
    BatchRequest,
    JpegBatchDataset,
    _shared_uint8,
    limit_worker_threads,
    prefault_pages,
)
from tricks_lib.data.jpeg_pipeline import JpegLoader
from tricks_lib.data.loader_efficiency import pipeline_efficiency

SIDE = 24


@pytest.fixture(scope="module")
def data():
    photos = render_photos(11, size=SIDE, seed=3)
    jpegs = [encode_image(im, "jpg") for im in photos.images]
    return jpegs, [int(x) for x in photos.labels]


@pytest.fixture(scope="module")
def plain(data):
    """The reference: every JPEG decoded by simplejpeg in this process, one at a time."""
    jpegs, _ = data
    return torch.stack([torch.from_numpy(simplejpeg.decode_jpeg(b, colorspace="RGB")) for b in jpegs])


def epoch_of(loader):
    """One epoch, copied (so the ring can reuse its slots): images, labels."""
    images, labels = zip(*[(x.clone(), y) for x, y in loader])
    return torch.cat(images), torch.cat(labels)


def test_items_and_batches_are_the_plain_decode(data, plain):
    jpegs, labels = data
    ds = JpegBatchDataset(jpegs, labels, shape=(SIDE, SIDE))
    image, label = ds[4]
    assert torch.equal(image, plain[4]) and label == labels[4]
    assert torch.equal(ds[-1][0], plain[-1])
    images, batch_labels = ds[[7, 2, 2, 9]]
    assert images.dtype == torch.uint8 and images.shape == (4, SIDE, SIDE, 3)
    assert torch.equal(images, plain[[7, 2, 2, 9]]) and batch_labels.tolist() == [labels[i] for i in (7, 2, 2, 9)]


def test_each_decoder_matches_its_library(data):
    jpegs, labels = data
    with Image.open(io.BytesIO(jpegs[5])) as im:
        pil = np.asarray(im.convert("RGB"))
    bgr = cv2.imdecode(np.frombuffer(jpegs[5], np.uint8), cv2.IMREAD_COLOR)
    for decoder, expected in (("pil", pil), ("opencv", bgr[..., ::-1])):
        got = JpegBatchDataset(jpegs, labels, shape=(SIDE, SIDE), decoder=decoder)[5][0].numpy()
        assert np.array_equal(got, expected), decoder


def test_wrong_size_and_bad_bytes_name_the_sample(data):
    jpegs, labels = data
    odd = encode_image(np.zeros((SIDE, SIDE + 8, 3), np.uint8), "jpg")
    ds = JpegBatchDataset([*jpegs[:3], odd], labels[:4], shape=(SIDE, SIDE))
    for decoder in ("simplejpeg", "opencv", "pil"):
        ds.decoder = decoder
        with pytest.raises(ValueError, match="sample 3"):
            ds[[0, 3]]
    ds = JpegBatchDataset([jpegs[0], b"not a jpeg"], labels[:2], shape=(SIDE, SIDE))
    with pytest.raises(ValueError, match="sample 1"):
        ds[1]
    with pytest.raises(IndexError):
        ds[2]


def test_arguments_are_checked(data):
    jpegs, labels = data
    with pytest.raises(ValueError, match="one label per JPEG"):
        JpegBatchDataset(jpegs, labels[:-1], shape=(SIDE, SIDE))
    with pytest.raises(TypeError, match="shape"):
        JpegBatchDataset(jpegs, labels, shape=SIDE)
    with pytest.raises(ValueError, match="decoder"):
        JpegBatchDataset(jpegs, labels, shape=(SIDE, SIDE), decoder="jpeg4py")
    ds = JpegBatchDataset(jpegs, labels, shape=(SIDE, SIDE))
    with pytest.raises(TypeError):
        JpegLoader(ds, batch_size=True)
    with pytest.raises(ValueError, match="persistent_workers"):
        JpegLoader(ds, batch_size=4, num_workers=0)
    with pytest.raises(TypeError, match="JpegBatchDataset"):
        JpegLoader(list(jpegs), batch_size=4)
    with pytest.raises(TypeError, match="ring"):
        ds[BatchRequest(0, (1, 2))]


@pytest.mark.parametrize("reuse", [True, False])
def test_every_sample_once_per_epoch_in_the_seeded_order(data, plain, reuse):
    jpegs, labels = data
    ds = JpegBatchDataset(jpegs, labels, shape=(SIDE, SIDE))
    loader = JpegLoader(ds, batch_size=4, shuffle=True, seed=5, num_workers=0, persistent_workers=False, reuse=reuse)
    orders = []
    for e in range(2):
        loader.set_epoch(e)
        order = [i for b in loader.epoch_batches(e) for i in b]
        assert sorted(order) == list(range(len(jpegs)))
        images, got_labels = epoch_of(loader)
        assert torch.equal(images, plain[order]) and got_labels.tolist() == [labels[i] for i in order]
        orders.append(order)
    assert orders[0] != orders[1], "set_epoch did not change the order"
    assert len(loader) == 3 and [len(b) for b in loader.epoch_batches(0)] == [4, 4, 3]
    dropped = JpegLoader(ds, batch_size=4, drop_last=True, num_workers=0, persistent_workers=False, reuse=reuse)
    assert len(dropped) == 2 and epoch_of(dropped)[1].tolist() == labels[:8]


def test_ring_never_overwrites_a_batch_someone_holds(data, plain):
    jpegs, labels = data
    ds = JpegBatchDataset(jpegs, labels, shape=(SIDE, SIDE))
    loader = JpegLoader(ds, batch_size=2, num_workers=0, persistent_workers=False, reuse=True, ring_slots=2)
    for batch in loader:  # the consumer drops each batch: every batch reuses a slot
        assert len(batch[1]) <= 2
    assert loader.counts().fresh == 0 and loader.counts().reused == 6
    del batch  # the loop variable still held the last batch (and so one slot)
    kept = [(x, y) for x, y in loader]  # the consumer keeps every batch: the ring must not reuse them
    assert torch.equal(torch.cat([x for x, _ in kept]), plain)
    assert torch.cat([y for _, y in kept]).tolist() == labels
    assert loader.counts().fresh == 4, loader.counts()  # 2 slots held, 4 batches decoded fresh
    del kept
    views = [x[:1] for x, _ in loader]  # a view holds its slot: later batches must not overwrite it
    assert torch.equal(torch.cat(views), plain[0::2])
    del views
    arrays = [x.numpy() for x, _ in loader]  # so does a numpy array of a batch
    assert np.array_equal(np.concatenate(arrays), plain.numpy())
    del arrays
    reused = loader.counts().reused
    assert torch.equal(epoch_of(loader)[0], plain) and loader.counts().reused == reused + 6


def test_a_new_epoch_after_a_break_is_complete(data, plain):
    jpegs, labels = data
    ds = JpegBatchDataset(jpegs, labels, shape=(SIDE, SIDE))
    loader = JpegLoader(ds, batch_size=3, num_workers=0, persistent_workers=False, reuse=True, ring_slots=2)
    first = next(iter(loader))[0].clone()
    assert torch.equal(first, plain[:3])
    assert torch.equal(epoch_of(loader)[0], plain)


def test_prefault_pages_keeps_contents_and_takes_the_faults_up_front():
    pages = 256
    fresh = _shared_uint8((pages * 4096,))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fresh.fill_(7)  # first write: one fault per page
    cold = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    again = _shared_uint8((pages * 4096,))
    again[:5] = torch.arange(5, dtype=torch.uint8)
    assert prefault_pages(again) is again and again[:5].tolist() == [0, 1, 2, 3, 4]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    again.fill_(7)
    warm = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert cold >= pages // 2 and warm < pages // 8, (cold, warm)
    with pytest.raises(TypeError):
        prefault_pages(np.zeros(3))


def test_pipeline_efficiency_reads_the_paired_rounds():
    work = list(range(20_000))
    cmp = compare(
        {"one core": lambda: sum(work), "half": lambda: sum(work[:10_000])},
        baseline="one core",
        items={"one core": 100, "half": 100},
        budget=Budget(min_rounds=8),
    )
    eff = pipeline_efficiency(cmp, "one core", cores=2)
    assert eff["one core"] == 0.5
    rate = cmp["half"].measurement.items_per_second
    assert eff["half"] == pytest.approx(rate / (2 * cmp["one core"].measurement.items_per_second))
    assert eff.single_core_rate == cmp["one core"].measurement.items_per_second
    assert "share of 2 x" in eff._repr_markdown_()
    with pytest.raises(KeyError):
        eff["other"]
    with pytest.raises(TypeError):
        pipeline_efficiency({"one core": 1}, "one core")


def test_limit_worker_threads():
    threads = torch.get_num_threads()
    try:
        limit_worker_threads(0)
        assert torch.get_num_threads() == 1 and cv2.getNumThreads() == 1
    finally:
        torch.set_num_threads(threads)
        cv2.setNumThreads(-1)


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [True, False])
def test_workers_yield_the_plain_decode_each_sample_once(data, plain, persistent):
    jpegs, labels = data
    ds = JpegBatchDataset(jpegs, labels, shape=(SIDE, SIDE))
    loader = JpegLoader(ds, batch_size=1, shuffle=True, num_workers=2, persistent_workers=persistent, reuse=True)
    next(iter(loader))  # an abandoned epoch: its in-flight batches must not leak into the next
    for e in range(2):
        loader.set_epoch(e)
        order = [i for b in loader.epoch_batches(e) for i in b]
        images, got_labels = epoch_of(loader)
        assert torch.equal(images, plain[order]) and got_labels.tolist() == [labels[i] for i in order]
    fresh = loader.counts().fresh
    assert fresh == 0, "the abandoned epoch's slots were never given back"
    kept = list(loader)  # kept batches come back fresh once the ring is held, never overwritten
    assert torch.equal(torch.cat([x for x, _ in kept]), plain[[i for b in loader.epoch_batches(1) for i in b]])
    assert loader.counts().fresh - fresh >= len(kept) - len(loader._ring) > 0


def _read_later(queue, results):
    import time

    batches = []
    for _ in range(3):
        batches.append(queue.get())
        time.sleep(0.05)  # a slow saver: the producer has moved on meanwhile
    results.put([b.numpy().copy() for b in batches])  # by value: this process may be gone when it is read


def test_by_default_a_batch_sent_to_another_process_is_never_overwritten(data, plain):
    jpegs, labels = data
    ds = JpegBatchDataset(jpegs, labels, shape=(SIDE, SIDE))
    loader = JpegLoader(ds, batch_size=2, num_workers=0, persistent_workers=False)  # the default: no ring
    ctx = torch.multiprocessing.get_context("fork")
    queue, results = ctx.Queue(), ctx.Queue()
    reader = ctx.Process(target=_read_later, args=(queue, results))
    reader.start()
    try:
        for i, (images, _) in enumerate(loader):
            if i < 3:
                queue.put(images)  # shared memory travels as a handle, not a copy
        received = results.get(timeout=60)
    finally:
        reader.join(timeout=30)
    assert torch.equal(torch.cat([torch.from_numpy(r) for r in received]), plain[:6])
    assert loader.counts().reused == 0
