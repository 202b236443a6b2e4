"""A folder of your own images in the ``ImageFolder`` layout, converted to tar shards in one call.

Layout (torchvision's ``ImageFolder``): ``root/<class>/<image>``, images in any depth of subfolders
of their class folder. Labels are the indices of the sorted class folder names, exactly as
``torchvision.datasets.ImageFolder(root).class_to_idx`` gives them, so a model trained on either
reader sees the same labels; files whose extension is not one of torchvision's ``IMG_EXTENSIONS``
(case-insensitive) are skipped, as ImageFolder skips them.

Each image goes into a shard as its original bytes (no decoding, no re-encoding: the shards hold
exactly the files), in a sample ``{"__key__": "00000000", <ext>: bytes, "cls": b"<label>", "path":
b"<class>/<file>"}`` whose image field is the file's extension lower-cased (``a.JPG`` -> ``"jpg"``,
``a.jpeg`` -> ``"jpeg"``), which is what ``DecodeSample(field=...)`` and webdataset's decoders key on.
"""

from __future__ import annotations

import glob
import json
import os
import random
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tricks_lib._atomic import write_bytes_atomic
from tricks_lib._validate import check_non_negative_int
from tricks_lib.data.shards import write_tar_shards
from tricks_lib.data.write_state import refuse_unfinished_write

__all__ = [
    "CLASSES_FILE",
    "IMG_EXTENSIONS",
    "image_folder_classes",
    "image_folder_files",
    "image_folder_to_shards",
    "read_shard_classes",
]

# torchvision.datasets.folder.IMG_EXTENSIONS (a test checks they agree), here so that converting a
# folder does not need torchvision.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
CLASSES_FILE = "classes.json"  # the label map written beside the shards


def image_folder_classes(root: str | os.PathLike) -> dict[str, int]:
    """``{class name: label}`` of an ImageFolder root: its subfolders, sorted, numbered from 0.

    The same rule as torchvision's ``find_classes``: every subfolder is a class, hidden ones too
    (a ``.ipynb_checkpoints`` folder becomes class 0; a warning names it: delete it first).

    Raises:
        FileNotFoundError: if ``root`` is not a folder or holds no subfolder.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder: pass the folder that holds one subfolder per class")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"no class folder in {root}: the layout is root/<class>/<image>")
    hidden = [c for c in classes if c.startswith(".")]
    if hidden:
        warnings.warn(
            f"hidden folder(s) {hidden} in {root} count as classes (as in torchvision's ImageFolder); "
            "delete them if they are not classes",
            stacklevel=2,
        )
    return {name: i for i, name in enumerate(classes)}


def image_folder_files(root: str | os.PathLike) -> list[tuple[Path, int]]:
    """``(image path, label)`` of every image under ``root``, in ImageFolder's order (class by class,
    then ``os.walk`` sorted, following symbolic links), with ImageFolder's labels and extension filter.

    Raises:
        FileNotFoundError: as :func:`image_folder_classes`, or if a class folder holds no image
            (ImageFolder refuses such a folder too), naming the classes and the extensions looked for.
        ValueError: an image name that is not a regular file (a pipe, which would block the read forever, a
            device, a dangling link), naming it.
    """
    return _image_files(Path(root), image_folder_classes(root))


def _image_files(root: Path, class_to_idx: dict[str, int]) -> list[tuple[Path, int]]:
    files, empty = [], []
    for name, label in class_to_idx.items():
        before = len(files)
        for folder, _, names in sorted(os.walk(root / name, followlinks=True)):
            for file_name in sorted(names):
                if file_name.lower().endswith(IMG_EXTENSIONS):
                    path = Path(folder, file_name)
                    if not path.is_file():  # a FIFO or a device would block the read forever; a dangling link
                        raise ValueError(f"{path} is not a regular file (a pipe, a device or a dangling link)")
                    files.append((path, label))
        if len(files) == before:
            empty.append(name)
    if empty:
        raise FileNotFoundError(
            f"no image in the class folder(s) {empty} of {root}; images need one of the extensions "
            f"{', '.join(IMG_EXTENSIONS)} (any case)"
        )
    return files


def image_folder_to_shards(
    root: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    samples_per_shard: int,
    prefix: str = "shard",
    shuffle_seed: int | None = 0,
) -> list[Path]:
    """Convert a folder of images in the ImageFolder layout to tar shards, and write its label map.

    The shards are written by :func:`~tricks_lib.data.shards.write_tar_shards` (each atomically,
    with its index file; a rewrite replaces the folder's earlier shards of that prefix), streaming:
    one image in memory at a time. Then ``out_dir/classes.json`` is written atomically, last, so
    that its presence says the conversion completed: ``{"classes": [...], "class_to_idx": {...},
    "samples_per_class": {...}, "image_fields": [...], "prefix": ..., "shards": {name: bytes}}`` (read it
    with :func:`read_shard_classes`, which checks that the shards beside it are the ones it was written
    with). A rerun removes it before it changes the first shard.

    Args:
        root: the ImageFolder root (``root/<class>/<image>``).
        out_dir: folder for the shards, created if missing; not inside ``root`` (it would become a class).
        samples_per_shard: images per shard (>= 1); the last shard may hold fewer.
        prefix: shard file name prefix (``<prefix>-000000.tar``, ...).
        shuffle_seed: the images are written in an order shuffled by this seed (default 0), so that
            each shard mixes the classes: ImageFolder's order is class by class, and a shuffle buffer
            reading such shards would fill batches of one class. None keeps ImageFolder's order
            (keys then follow ``ImageFolder(root).samples``), e.g. for an evaluation set.
    Returns:
        The shard paths, in order. Each sample holds ``<ext>`` (the image's bytes), ``cls`` (the
        label as text, which ``DecodeSample`` reads) and ``path`` (the file's path relative to
        ``root``, as file-system bytes).
    Raises:
        FileNotFoundError: if ``root`` has no class folder, or a class folder no image.
        ValueError/TypeError: on bad arguments, ``out_dir`` inside ``root``, or an image name that is not a
            regular file (a pipe, a device, a dangling link).
    """
    root, out = Path(root), Path(out_dir)
    if shuffle_seed is not None:
        check_non_negative_int(shuffle_seed, "shuffle_seed")
    if out.resolve().is_relative_to(root.resolve()):
        raise ValueError(
            f"out_dir {out} is inside root {root}: its folder would become a class; write the shards elsewhere"
        )
    class_to_idx = image_folder_classes(root)
    files = _image_files(root, class_to_idx)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(files)
    fields = {_field(path) for path, _ in files}
    # Gone before the first shard changes, written after the last: a label map never sits beside other shards.
    (out / CLASSES_FILE).unlink(missing_ok=True)
    shards = write_tar_shards(_samples(root, files), out, samples_per_shard=samples_per_shard, prefix=prefix)
    counts = Counter(label for _, label in files)
    label_map = {
        "classes": list(class_to_idx),
        "class_to_idx": class_to_idx,
        "samples_per_class": {name: counts[label] for name, label in class_to_idx.items()},
        "image_fields": sorted(fields),
        "prefix": prefix,
        "shards": {path.name: path.stat().st_size for path in shards},  # read_shard_classes checks them
    }
    write_bytes_atomic(out / CLASSES_FILE, json.dumps(label_map, indent=1).encode() + b"\n")
    return shards


def _field(path: Path) -> str:
    """The sample field of an image: its extension, lower-cased (also for a file named ``.jpg``)."""
    return path.name.rpartition(".")[2].lower()


def _samples(root: Path, files: list[tuple[Path, int]]) -> Iterator[dict]:
    width = max(8, len(str(len(files) - 1)))
    for i, (path, label) in enumerate(files):
        yield {
            "__key__": f"{i:0{width}d}",
            _field(path): path.read_bytes(),
            "cls": str(label).encode(),
            "path": os.fsencode(path.relative_to(root)),
        }


def read_shard_classes(out_dir: str | os.PathLike) -> dict[str, int]:
    """The ``{class name: label}`` map that :func:`image_folder_to_shards` wrote beside its shards.

    Checks first that the shards beside it are the very ones the conversion wrote (names and sizes):
    a label map read with other shards would give their samples wrong labels without a word.

    Raises:
        FileNotFoundError: if ``out_dir`` has no ``classes.json`` (the conversion did not complete).
        ValueError: if the shards beside it differ from those it was written with (a rerun stopped
            halfway, or shards were added, removed or rewritten since).
    """
    out = Path(out_dir)
    label_map = json.loads((out / CLASSES_FILE).read_text())
    recorded = label_map.get("shards")
    if recorded is not None:  # written by this version; older label maps carry no shard list
        prefix = label_map["prefix"]
        refuse_unfinished_write(out, f"{prefix}-shards", f"the shards {prefix}-*.tar")
        present = {p.name: p.stat().st_size for p in out.glob(f"{glob.escape(prefix)}-*.tar")}
        if present != recorded:
            changed = sorted(set(present) ^ set(recorded)) or sorted(n for n in present if present[n] != recorded[n])
            raise ValueError(
                f"{CLASSES_FILE} in {out} does not describe the shards beside it ({len(recorded)} written with it, "
                f"{len(present)} there; first difference: {changed[0]}): rerun image_folder_to_shards"
            )
    return label_map["class_to_idx"]
