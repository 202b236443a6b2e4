"""Tests for tricks_lib.data.images: seeded generator, encoders, atomic folder writer."""

import hashlib
import os

import numpy as np
import pytest

from tricks_lib.data.images import (
    decode_image,
    encode_image,
    find_source_photos,
    make_samples,
    render_photos,
    write_image_folder,
)


def digest(samples):
    h = hashlib.sha256()
    for s in samples:
        for k, v in s.items():
            h.update(k.encode() + (v if isinstance(v, bytes) else v.encode()))
    return h.hexdigest()


def test_sources_are_installed_photographs():
    sources = find_source_photos()
    assert "grace_hopper" in sources and all(p.is_file() for p in sources.values())


@pytest.mark.parametrize("fmt", ["jpg", "png", "bmp", "raw"])
def test_same_seed_same_bytes(fmt):
    a = make_samples(render_photos(6, size=24, seed=7), fmt=fmt)
    b = make_samples(render_photos(6, size=24, seed=7), fmt=fmt)
    c = make_samples(render_photos(6, size=24, seed=8), fmt=fmt)
    assert digest(a) == digest(b) != digest(c)


def test_image_i_depends_only_on_seed_and_index():
    few, more = render_photos(3, size=16, seed=1), render_photos(5, size=16, seed=1)
    assert np.array_equal(few.images, more.images[:3]) and np.array_equal(few.labels, more.labels[:3])


def test_shapes_labels_and_variety():
    photos = render_photos(40, size=(20, 28), seed=0)
    assert photos.images.shape == (40, 20, 28, 3) and photos.images.dtype == np.uint8
    assert photos.labels.min() >= 0 and photos.labels.max() < len(photos.class_names)
    assert len(set(photos.labels.tolist())) > 3
    assert len({img.tobytes() for img in photos.images}) == 40  # no two crops alike


@pytest.mark.parametrize("fmt", ["png", "bmp", "raw"])
def test_lossless_formats_round_trip(fmt):
    img = render_photos(1, size=16).images[0]
    assert np.array_equal(decode_image(encode_image(img, fmt), fmt, shape=img.shape), img)


def test_jpeg_is_close():
    img = render_photos(1, size=32).images[0]
    err = np.abs(decode_image(encode_image(img, "jpg", quality=95), "jpg").astype(int) - img).mean()
    assert err < 6


def test_folder_writer_is_atomic(tmp_path, failing_bytes):
    samples = make_samples(render_photos(4, size=16))
    samples[2]["jpg"] = failing_bytes(b"x")
    with pytest.raises(RuntimeError):
        write_image_folder(samples, tmp_path)
    names = sorted(os.listdir(tmp_path))
    # no temp, no partial file; the mark of an unfinished write stays, so readers refuse the folder
    assert names == [".image-folder.writing", "000000.cls", "000000.jpg", "000001.cls", "000001.jpg"]
    assert (tmp_path / "000001.jpg").read_bytes() == make_samples(render_photos(2, size=16))[1]["jpg"]


def test_arguments_are_validated():
    with pytest.raises(ValueError, match="count"):
        render_photos(0)
    with pytest.raises(ValueError, match="size"):
        render_photos(1, size=4)
    with pytest.raises(ValueError, match="fmt"):
        encode_image(np.zeros((4, 4, 3), np.uint8), "gif")
    with pytest.raises(ValueError, match="shape"):
        decode_image(b"abc", "raw")
    with pytest.raises(TypeError, match="PhotoSet"):
        make_samples([1, 2])


def test_decode_sample_gives_chw_uint8_and_label():
    from tricks_lib.data.images import DecodeSample

    photos = render_photos(2, size=64)
    sample = make_samples(photos, fmt="png")[1]
    image, label = DecodeSample(field="png")(sample)
    assert image.shape == (3, 64, 64) and label == int(photos.labels[1])
    assert np.array_equal(image.permute(1, 2, 0).numpy(), photos.images[1])
    small, _ = DecodeSample(16, draft=True)(make_samples(photos)[1])
    assert small.shape == (3, 16, 16)
    with pytest.raises(ValueError, match="draft"):
        DecodeSample(draft=True)


def test_decode_names_the_missing_field_instead_of_a_bare_key_error():
    from tricks_lib.data.images import DecodeSample

    with pytest.raises(KeyError, match=r"sample 'a/0' has no 'jpg' field \(it has \['cls', 'png'\]\).*field='png'"):
        DecodeSample()({"__key__": "a/0", "png": b"", "cls": b"1"})
    with pytest.raises(KeyError, match="has no 'cls' field"):
        DecodeSample(field="png")({"__key__": "a/0", "png": b""})


def test_render_photos_refuses_a_seed_that_is_not_a_whole_number():
    for bad, error in ((None, TypeError), (True, TypeError), (1.5, TypeError), (-1, ValueError)):
        with pytest.raises(error, match="seed"):
            render_photos(2, size=16, seed=bad)
