"""Tests for tricks_lib.data.image_folder: an ImageFolder of one's own images, converted to shards."""

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from tricks_lib.data import (
    DecodeSample,
    TarShardDataset,
    image_folder_classes,
    image_folder_files,
    image_folder_to_shards,
    read_shard_classes,
)
from tricks_lib.data.image_folder import CLASSES_FILE, IMG_EXTENSIONS


def image_bytes(fmt, seed, size=(12, 9)):
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.fixture
def image_root(tmp_path):
    """An ImageFolder with what users' folders hold: upper-case and .jpeg extensions, nested folders,
    names with dots, non-image files, a stray file at the top, and a class name that sorts first
    only by case ("Zebra" < "cat")."""
    root = tmp_path / "photos"
    files = {
        "cat/a.JPG": "JPEG",
        "cat/b.jpeg": "JPEG",
        "cat/c.png": "PNG",
        "dog/img.v2.png": "PNG",
        "dog/deeper/x.bmp": "BMP",
        "dog/deeper/y.jpg": "JPEG",
        "Zebra/z1.jpg": "JPEG",
    }
    for i, (name, fmt) in enumerate(files.items()):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image_bytes(fmt, i))
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "dog" / "README").write_text("no extension")
    (root / "dog" / "deeper" / "labels.csv").write_text("x,1")
    (root / "stray.jpg").write_bytes(image_bytes("JPEG", 99))  # not in a class folder: not a sample
    return root


def read_back(out):
    """{relative path: (image field, bytes, label)} of every sample, checking each file comes once."""
    got = {}
    for sample in TarShardDataset(out):
        (field,) = [k for k in sample if k not in ("__key__", "cls", "path")]
        path = os.fsdecode(bytes(sample["path"]))
        assert path not in got, f"{path} read twice"
        got[path] = (field, bytes(sample[field]), int(sample["cls"]))
    return got


def test_every_image_comes_back_once_with_its_bytes_and_imagefolders_label(image_root, tmp_path):
    datasets = pytest.importorskip("torchvision.datasets")
    out = tmp_path / "shards"
    shards = image_folder_to_shards(image_root, out, samples_per_shard=3)
    reference = datasets.ImageFolder(str(image_root))
    assert reference.class_to_idx == {"Zebra": 0, "cat": 1, "dog": 2}
    assert image_folder_classes(image_root) == reference.class_to_idx == read_shard_classes(out)
    assert [(str(p), label) for p, label in image_folder_files(image_root)] == reference.samples
    got = read_back(out)
    expected = {os.path.relpath(p, image_root): label for p, label in reference.samples}
    assert {path: label for path, (_, _, label) in got.items()} == expected  # each file once, its label
    for path, (field, data, _) in got.items():
        assert data == (image_root / path).read_bytes()  # the original bytes: no re-encoding
        assert field == path.rpartition(".")[2].lower()  # "a.JPG" -> "jpg", "b.jpeg" -> "jpeg"
    assert len(shards) == 3 and [p.name for p in shards] == sorted(p.name for p in out.glob("shard-*.tar"))
    label_map = json.loads((out / CLASSES_FILE).read_text())
    assert label_map["classes"] == ["Zebra", "cat", "dog"]
    assert label_map["samples_per_class"] == {"Zebra": 1, "cat": 3, "dog": 3}
    assert label_map["image_fields"] == ["bmp", "jpeg", "jpg", "png"]
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]  # atomic writes left no temporary file


def test_the_extensions_are_torchvisions():
    folder = pytest.importorskip("torchvision.datasets.folder")
    assert IMG_EXTENSIONS == tuple(folder.IMG_EXTENSIONS)


def test_decode_sample_reads_the_converted_images(image_root, tmp_path):
    image_folder_to_shards(image_root, tmp_path / "s", samples_per_shard=4)
    decoded = [DecodeSample(field="png")(s) for s in TarShardDataset(tmp_path / "s") if "png" in s]
    assert sorted(label for _, label in decoded) == [1, 2]  # cat/c.png, dog/img.v2.png
    assert all(image.shape == (3, 9, 12) for image, _ in decoded)


def test_the_order_is_shuffled_by_a_seed_or_kept(image_root, tmp_path):
    def order(out, **kwargs):
        image_folder_to_shards(image_root, out, samples_per_shard=2, **kwargs)
        return [os.fsdecode(bytes(s["path"])) for s in TarShardDataset(out)]

    folder_order = [os.path.relpath(p, image_root) for p, _ in image_folder_files(image_root)]
    assert order(tmp_path / "kept", shuffle_seed=None) == folder_order  # class by class
    shuffled = order(tmp_path / "a")
    assert shuffled != folder_order and sorted(shuffled) == sorted(folder_order)
    assert shuffled == order(tmp_path / "b", shuffle_seed=0)  # seeded: the same order again
    assert [p.read_bytes() for p in sorted((tmp_path / "a").glob("*.tar"))] == [
        p.read_bytes() for p in sorted((tmp_path / "b").glob("*.tar"))
    ]
    assert order(tmp_path / "c", shuffle_seed=1) != shuffled


def test_a_rewrite_replaces_the_earlier_shards_and_label_map(image_root, tmp_path):
    out = tmp_path / "s"
    image_folder_to_shards(image_root, out, samples_per_shard=1)  # 7 shards
    (image_root / "dog").rename(image_root / "wolf")
    for extra in (image_root / "cat").glob("[ab].*"):
        extra.unlink()
    shards = image_folder_to_shards(image_root, out, samples_per_shard=1)
    assert len(shards) == 5 and sorted(out.glob("*.tar")) == shards
    assert read_shard_classes(out) == {"Zebra": 0, "cat": 1, "wolf": 2}
    assert sorted(read_back(out)) == [
        "Zebra/z1.jpg",
        "cat/c.png",
        *sorted(f"wolf/{p}" for p in ("img.v2.png", "deeper/x.bmp", "deeper/y.jpg")),
    ]


def test_what_imagefolder_refuses_is_refused_with_a_reason(image_root, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        image_folder_to_shards(tmp_path / "missing", tmp_path / "s", samples_per_shard=2)
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(image_bytes("JPEG", 0))
    with pytest.raises(FileNotFoundError, match="no class folder"):
        image_folder_to_shards(tmp_path / "flat", tmp_path / "s", samples_per_shard=2)
    (image_root / "empty").mkdir()
    (image_root / "empty" / "notes.txt").write_text("no image")
    with pytest.raises(FileNotFoundError, match=r"no image in the class folder\(s\) \['empty'\].*\.jpg, \.jpeg"):
        image_folder_to_shards(image_root, tmp_path / "s", samples_per_shard=2)
    (image_root / "empty" / "notes.txt").unlink()
    (image_root / "empty").rmdir()
    with pytest.raises(ValueError, match="inside root"):
        image_folder_to_shards(image_root, image_root / "shards", samples_per_shard=2)
    with pytest.raises(ValueError, match="samples_per_shard"):
        image_folder_to_shards(image_root, tmp_path / "s", samples_per_shard=0)
    with pytest.raises(TypeError, match="shuffle_seed"):
        image_folder_to_shards(image_root, tmp_path / "s", samples_per_shard=2, shuffle_seed=True)
    assert not (tmp_path / "s" / CLASSES_FILE).exists()  # no refused call wrote a label map
    with pytest.raises(FileNotFoundError):
        read_shard_classes(tmp_path / "s")


def test_a_hidden_folder_is_a_class_as_in_torchvision_and_warned_about(image_root, tmp_path):
    datasets = pytest.importorskip("torchvision.datasets")
    checkpoints = image_root / ".ipynb_checkpoints"
    checkpoints.mkdir()
    (checkpoints / "a-checkpoint.jpg").write_bytes(image_bytes("JPEG", 5))
    with pytest.warns(UserWarning, match=r"\.ipynb_checkpoints"):
        image_folder_to_shards(image_root, tmp_path / "s", samples_per_shard=4)
    assert read_shard_classes(tmp_path / "s") == datasets.ImageFolder(str(image_root)).class_to_idx
    assert read_shard_classes(tmp_path / "s")[".ipynb_checkpoints"] == 0


def test_a_pipe_among_the_images_is_refused_not_read_forever(tmp_path):
    (tmp_path / "cat").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "cat" / "a.png")
    os.mkfifo(tmp_path / "cat" / "b.png")
    with pytest.raises(ValueError, match=r"b\.png is not a regular file"):
        image_folder_files(tmp_path)


def test_an_interrupted_rerun_leaves_no_label_map_that_disagrees_with_its_shards(image_root, tmp_path, monkeypatch):
    out = tmp_path / "s"
    image_folder_to_shards(image_root, out, samples_per_shard=2)
    (image_root / "bird").mkdir()  # a class added: every label after "Zebra" moves
    (image_root / "bird" / "b.jpg").write_bytes(image_bytes("JPEG", 7))
    import tricks_lib.data.shards as shards_mod

    real = shards_mod._write_shards

    def stop_after_two(it, out_dir, per_shard, prefix):
        def two():
            for i, sample in enumerate(it):
                if i == 4:
                    raise KeyboardInterrupt  # Ctrl-C after two shards of the rerun
                yield sample

        return real(two(), out_dir, per_shard, prefix)

    monkeypatch.setattr(shards_mod, "_write_shards", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        image_folder_to_shards(image_root, out, samples_per_shard=2)
    with pytest.raises(FileNotFoundError):
        read_shard_classes(out)  # the old label map is gone: it would mislabel the new shards
    with pytest.raises(ValueError, match="not one complete set"):
        TarShardDataset(out)  # two new shards beside two old ones


def test_the_label_map_refuses_shards_it_was_not_written_with(image_root, tmp_path):
    out = tmp_path / "s"
    shards = image_folder_to_shards(image_root, out, samples_per_shard=3)
    assert read_shard_classes(out) == {"Zebra": 0, "cat": 1, "dog": 2}
    shards[-1].unlink()
    with pytest.raises(ValueError, match="does not describe the shards beside it"):
        read_shard_classes(out)
