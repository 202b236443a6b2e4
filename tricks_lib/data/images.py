"""A seeded, offline image dataset made from real photographs that ship inside installed packages.

Each image is a random crop (random scale and aspect ratio), optional horizontal flip and rescale of
one of a few photographs bundled with matplotlib, scikit-learn and scikit-image; its label is the
index of the photograph it came from. Nothing is downloaded. Image ``i`` depends only on
``(seed, i)``: the same seed gives the same pixels and, with the same Pillow/libjpeg build, the
same encoded bytes.

Samples use the WebDataset convention: a dict ``{"__key__": "000017", "jpg": b"...", "cls": b"3"}``.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tricks_lib._atomic import write_bytes_atomic
from tricks_lib._validate import check_flag, check_non_negative_int, check_positive
from tricks_lib.data.samples import check_samples
from tricks_lib.data.write_state import write_in_progress

__all__ = [
    "DecodeSample",
    "IMAGE_FORMATS",
    "PhotoSet",
    "decode_image",
    "encode_image",
    "find_source_photos",
    "make_samples",
    "render_photos",
    "write_image_folder",
]

# (top-level package, file inside it, class name). Any subset that is installed is used.
_SOURCE_PHOTOS = (
    ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg", "grace_hopper"),
    ("sklearn", "datasets/images/china.jpg", "china"),
    ("sklearn", "datasets/images/flower.jpg", "flower"),
    ("skimage", "data/astronaut.png", "astronaut"),
    ("skimage", "data/coffee.png", "coffee"),
    ("skimage", "data/chelsea.png", "chelsea"),
    ("skimage", "data/rocket.jpg", "rocket"),
    ("skimage", "data/motorcycle_left.png", "motorcycle"),
    ("skimage", "data/hubble_deep_field.jpg", "hubble"),
    ("skimage", "data/retina.jpg", "retina"),
)

IMAGE_FORMATS = ("jpg", "png", "bmp", "raw")
_PIL_FORMAT = {"jpg": "JPEG", "png": "PNG", "bmp": "BMP"}


def find_source_photos() -> dict[str, Path]:
    """Return ``{class_name: path}`` for the bundled photographs that are installed here.

    Raises:
        RuntimeError: if none is installed (install matplotlib, scikit-learn or scikit-image).
    """
    found: dict[str, Path] = {}
    for package, relative, name in _SOURCE_PHOTOS:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            continue
        path = Path(spec.origin).parent / relative
        if path.is_file():
            found[name] = path
    if not found:
        raise RuntimeError("no source photographs found: install matplotlib, scikit-learn or scikit-image")
    return found


@dataclass(frozen=True, repr=False)
class PhotoSet:
    """Decoded images and labels.

    Attributes:
        images: uint8 array of shape (N, H, W, 3), RGB.
        labels: int64 array of shape (N,); ``labels[i]`` indexes ``class_names``.
        class_names: the photograph each label stands for.
        seed: the seed the set was rendered with.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    seed: int

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        n, h, w, c = self.images.shape
        return f"PhotoSet({n} images of {h}x{w}x{c} uint8, {len(self.class_names)} classes, seed={self.seed})"


def _check_size(size: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(size, int):
        size = (size, size)
    if (
        not isinstance(size, tuple)
        or len(size) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 8 for s in size)
    ):
        raise ValueError(f"size must be an int >= 8 or a (height, width) pair of them, got {size!r}")
    return size


def render_photos(count: int, *, size: int | tuple[int, int] = 96, seed: int = 0) -> PhotoSet:
    """Render ``count`` images by random crop, flip and rescale of the bundled photographs.

    Args:
        count: number of images (>= 1).
        size: output size, an int (square) or ``(height, width)``; at least 8 pixels.
        seed: image ``i`` depends only on ``(seed, i)``.
    Returns:
        A :class:`PhotoSet`.
    Raises:
        TypeError: ``seed`` is not a whole number (``True`` and ``None`` included: each run must name its images).
        ValueError: on a bad count or size, or a negative seed.
    """
    check_positive(count, "count", allow_none=False, integer=True)
    check_non_negative_int(seed, "seed")
    height, width = _check_size(size)
    sources = find_source_photos()
    names = tuple(sources)
    photos = []
    for name in names:
        with Image.open(sources[name]) as im:
            photos.append(im.convert("RGB"))
    images = np.empty((count, height, width, 3), dtype=np.uint8)
    labels = np.empty(count, dtype=np.int64)
    for i in range(count):
        rng = np.random.default_rng((seed, i))
        label = int(rng.integers(len(photos)))
        src = photos[label]
        short = min(src.size)
        # Crop side between a quarter of the short side and all of it; aspect ratio 3:4 to 4:3.
        side = rng.uniform(0.25, 1.0) * short
        aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
        crop_w = min(src.size[0], max(8, round(side * np.sqrt(aspect))))
        crop_h = min(src.size[1], max(8, round(side / np.sqrt(aspect))))
        left = int(rng.integers(src.size[0] - crop_w + 1))
        top = int(rng.integers(src.size[1] - crop_h + 1))
        flip = bool(rng.random() < 0.5)
        im = src.crop((left, top, left + crop_w, top + crop_h))
        im = im.resize((width, height), Image.BILINEAR)  # Pillow's resize is antialiased
        if flip:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        images[i] = np.asarray(im)
        labels[i] = label
    return PhotoSet(images=images, labels=labels, class_names=names, seed=seed)


def encode_image(image: np.ndarray, fmt: str, *, quality: int = 90) -> bytes:
    """Encode one (H, W, 3) uint8 image as ``fmt`` ("jpg", "png", "bmp" or "raw" pixel bytes).

    Raises:
        ValueError: on an unknown format or an image that is not (H, W, 3) uint8.
    """
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"fmt must be one of {IMAGE_FORMATS}, got {fmt!r}")
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError("image must be a (H, W, 3) uint8 numpy array")
    if fmt == "raw":
        return np.ascontiguousarray(image).tobytes()
    buf = io.BytesIO()
    options = {"quality": quality} if fmt == "jpg" else {}
    Image.fromarray(image).save(buf, format=_PIL_FORMAT[fmt], **options)
    return buf.getvalue()


def decode_image(data: bytes, fmt: str, *, shape: tuple[int, int, int] | None = None) -> np.ndarray:
    """Decode bytes made by :func:`encode_image` to an (H, W, 3) uint8 array (with Pillow).

    Args:
        data: encoded bytes.
        fmt: "jpg", "png", "bmp" or "raw".
        shape: required for "raw" (raw bytes carry no shape), ignored otherwise.
    Raises:
        ValueError: on an unknown format, or "raw" without a matching shape.
    """
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"fmt must be one of {IMAGE_FORMATS}, got {fmt!r}")
    if fmt == "raw":
        if shape is None or int(np.prod(shape)) != len(data):
            raise ValueError(f"raw data needs shape=(H, W, 3) with {len(data)} elements, got {shape}")
        return np.frombuffer(data, dtype=np.uint8).reshape(shape)
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def make_samples(photos: PhotoSet, *, fmt: str = "jpg", quality: int = 90) -> list[dict]:
    """Encode a :class:`PhotoSet` as WebDataset-style samples.

    Returns:
        ``[{"__key__": "000000", fmt: encoded_bytes, "cls": b"<label>"}, ...]`` in index order.
    """
    if not isinstance(photos, PhotoSet):
        raise TypeError(f"photos must be a PhotoSet (from render_photos), got {type(photos).__name__}")
    return [
        {"__key__": f"{i:06d}", fmt: encode_image(img, fmt, quality=quality), "cls": str(int(label)).encode()}
        for i, (img, label) in enumerate(zip(photos.images, photos.labels))
    ]


def write_image_folder(samples: Iterable[dict], out_dir: str | os.PathLike) -> list[Path]:
    """Write each field of each sample as its own file ``out_dir/<key>.<ext>``, atomically.

    The folder's files are one set: ``.image-folder.json`` lists the files of the last complete write,
    and a rewrite deletes the files of the previous write that it did not write again. While it runs
    the folder holds ``.image-folder.writing``; a write that stops halfway leaves it, and
    :class:`~tricks_lib.data.FolderDataset` then refuses the folder (new files beside old ones) until
    a write completes.

    Returns:
        The written paths, in sample order. Each file appears only once completely written.
    Raises:
        TypeError/ValueError: on malformed samples (see :func:`make_samples`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    previous = folder_manifest(out) or []
    written = []
    with write_in_progress(out, FOLDER_SET):  # the manifest stays the last complete write's until the end
        for sample in check_samples(samples):
            for ext, value in sample.items():
                if not ext.startswith("__"):
                    path = out / f"{sample['__key__']}.{ext}"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    written.append(write_bytes_atomic(path, bytes(value)))
        names = sorted(p.relative_to(out).as_posix() for p in written)
        for stale in set(previous) - set(names):  # the older version's files this write did not replace
            (out / stale).unlink(missing_ok=True)
        write_bytes_atomic(out / FOLDER_MANIFEST, json.dumps(names).encode())
    return written


FOLDER_SET = "image-folder"  # the set's name for write_in_progress
FOLDER_MANIFEST = ".image-folder.json"  # the files of the last complete write_image_folder, a JSON list


def folder_manifest(folder: Path) -> list[str] | None:
    """The files (relative POSIX paths) the last complete :func:`write_image_folder` wrote, None if none did."""
    try:
        names = json.loads((folder / FOLDER_MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except ValueError as err:
        raise ValueError(f"{folder / FOLDER_MANIFEST} is damaged ({err}); write the folder again") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{folder / FOLDER_MANIFEST} is not a list of file names; write the folder again")
    return names


class DecodeSample:
    """Transform a sample dict into ``(image, label)``: a (3, H, W) uint8 tensor and an int.

    Decodes ``sample[field]`` with Pillow, optionally resized to ``size`` (bilinear, antialiased).
    With ``draft=True`` a JPEG is decoded at a reduced scale first (libjpeg DCT scaling: 1/2, 1/4,
    1/8) when that still covers ``size``: less work for the same output size, slightly different
    pixels. A class (not a lambda) so DataLoader workers can pickle it under any start method.
    """

    def __init__(self, size: int | None = None, *, field: str = "jpg", draft: bool = False):
        check_positive(size, "size", integer=True)
        check_flag(draft, "draft")
        if draft and size is None:
            raise ValueError("draft=True needs a target size")
        self.size, self.field, self.draft = size, field, draft

    def __call__(self, sample: dict) -> tuple[torch.Tensor, int]:
        """Decode one sample. Raises KeyError naming the missing field and the fields the sample has."""
        missing = [key for key in (self.field, "cls") if key not in sample]
        if missing:
            fields = sorted(k for k in sample if not k.startswith("__"))
            images = [k for k in fields if k != "cls"]
            hint = f"; pass field= the image's extension, e.g. DecodeSample(field={images[0]!r})" if images else ""
            raise KeyError(
                f"sample {sample.get('__key__', '?')!r} has no {missing[0]!r} field (it has {fields}) {hint}"
            )
        with Image.open(io.BytesIO(sample[self.field])) as im:
            if self.draft:
                im.draft("RGB", (self.size, self.size))
            im = im.convert("RGB")
            if self.size is not None and im.size != (self.size, self.size):
                im = im.resize((self.size, self.size), Image.BILINEAR)
            image = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1)  # (3, H, W) uint8
        return image, int(sample["cls"])

    def __repr__(self) -> str:
        return f"DecodeSample(size={self.size}, field={self.field!r}, draft={self.draft})"
