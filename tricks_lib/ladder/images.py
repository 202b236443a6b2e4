"""Image datasets held whole as tensors, with batched augmentation on the device.

The capstone's data path: a fixed train/test split as (N, 3, H, W) uint8 tensors (the project's
photographs, or CIFAR-10 where it is on disk or may be downloaded), and flip/translate applied to a
whole batch at once on the device, as airbench does, instead of per image in DataLoader workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tricks_lib._validate import check_positive

__all__ = ["HostAugmentedDataset", "ImageData", "augment_batch", "cifar10_data", "photo_data"]


@dataclass(frozen=True, repr=False)
class ImageData:
    """A fixed train/test split of (N, 3, H, W) uint8 images with int64 labels, on the CPU."""

    name: str
    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    class_names: tuple[str, ...]

    @property
    def mean(self) -> torch.Tensor:
        """Per-channel mean of the training images in [0, 1], shape (3,)."""
        return self.train_images.float().mean(dim=(0, 2, 3)) / 255

    @property
    def std(self) -> torch.Tensor:
        """Per-channel standard deviation of the training images in [0, 1], shape (3,)."""
        return self.train_images.float().std(dim=(0, 2, 3)) / 255

    def class_counts(self, split: str = "train") -> dict[str, int]:
        """Images per class in ``split`` ("train" or "test"), every class listed (0 where absent).

        Raises:
            ValueError: ``split`` is neither "train" nor "test".
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        labels = self.train_labels if split == "train" else self.test_labels
        counts = torch.bincount(labels, minlength=len(self.class_names)).tolist()
        return dict(zip(self.class_names, counts))

    @property
    def majority_share(self) -> float:
        """Test accuracy of always guessing the test set's largest class: the floor any target must clear."""
        return max(self.class_counts("test").values()) / len(self.test_labels)

    def __repr__(self) -> str:
        _, c, h, w = self.train_images.shape
        counts = self.class_counts("train").values()
        return (
            f"ImageData({self.name}: {len(self.train_labels)} train / {len(self.test_labels)} test images of "
            f"{c}x{h}x{w}, {len(self.class_names)} classes of {min(counts)}-{max(counts)} training images; "
            f"always guessing the largest class scores {self.majority_share:.1%} on test)"
        )

    def plot_examples(self, per_class: int = 2):
        """A grid of the first ``per_class`` training images of every class (a column each). Returns the figure."""
        import matplotlib.pyplot as plt

        check_positive(per_class, "per_class", allow_none=False, integer=True)
        n = len(self.class_names)
        fig, axes = plt.subplots(per_class, n, figsize=(1.1 * n, 1.3 * per_class), squeeze=False)
        for c, name in enumerate(self.class_names):
            for row, i in enumerate((self.train_labels == c).nonzero().flatten()[:per_class].tolist()):
                axes[row, c].imshow(self.train_images[i].permute(1, 2, 0).numpy())  # (H, W, 3) uint8
            axes[0, c].set_title(name, fontsize=7)
        for ax in axes.flat:
            ax.axis("off")
        _, _, h, w = self.train_images.shape
        fig.suptitle(f"{per_class} training images per class ({h}x{w})", fontsize=9)
        return fig


def photo_data(train: int, test: int, *, size: int = 32, seed: int = 0) -> ImageData:
    """The project's offline photo dataset (``render_photos``): images ``0..train-1`` train, the next ``test`` test.

    Classes are the source photographs found here (10 with matplotlib, scikit-learn and scikit-image).
    """
    from tricks_lib.data.images import render_photos

    check_positive(train, "train", allow_none=False, integer=True)
    check_positive(test, "test", allow_none=False, integer=True)
    photos = render_photos(train + test, size=size, seed=seed)
    images = torch.from_numpy(photos.images).permute(0, 3, 1, 2).contiguous()  # (N, 3, H, W) uint8
    labels = torch.from_numpy(photos.labels)
    return ImageData(
        f"photos (seed {seed})", images[:train], labels[:train], images[train:], labels[train:], photos.class_names
    )


def cifar10_data(root: str, *, download: bool = False) -> ImageData:
    """CIFAR-10 from ``root`` via ``torchvision.datasets.CIFAR10`` (50,000 train / 10,000 test).

    Raises:
        RuntimeError: not found under ``root`` and ``download`` is False (torchvision's message).
    """
    import torchvision

    def load(train: bool):
        dset = torchvision.datasets.CIFAR10(root, train=train, download=download)
        images = torch.from_numpy(dset.data).permute(0, 3, 1, 2).contiguous()  # (N, 3, 32, 32) uint8
        return images, torch.tensor(dset.targets), tuple(dset.classes)

    (xtr, ytr, names), (xte, yte, _) = load(True), load(False)
    return ImageData("CIFAR-10", xtr, ytr, xte, yte, names)


def augment_batch(images: torch.Tensor, *, translate: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random horizontal flip and random translation by up to ``translate`` pixels, for a whole batch at once.

    Batched, on whatever device ``images`` (N, C, H, W) float is on: one reflect padding, then one
    masked copy per shift, instead of a Python call per image. Returns a new (N, C, H, W) tensor.
    """
    n, _, h, w = images.shape
    flip = torch.rand(n, device=images.device, generator=generator) < 0.5
    images = torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)
    if translate == 0:
        return images
    r = translate
    padded = F.pad(images, (r, r, r, r), mode="reflect")  # (N, C, H+2r, W+2r)
    shifts = torch.randint(0, 2 * r + 1, (n, 2), device=images.device, generator=generator)
    out = torch.empty_like(images)
    for dy in range(2 * r + 1):
        for dx in range(2 * r + 1):
            mask = (shifts[:, 0] == dy) & (shifts[:, 1] == dx)
            out[mask] = padded[mask, :, dy : dy + h, dx : dx + w]
    return out


class HostAugmentedDataset(torch.utils.data.Dataset):
    """The baseline's input pipeline: one image at a time on the host, as a torchvision transform stack does."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean, std, translate: int, seed: int) -> None:
        self.images, self.labels, self.translate = images, labels, translate
        self.mean, self.std = mean.view(3, 1, 1), std.view(3, 1, 1)
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = (self.images[i].float() / 255 - self.mean) / self.std  # (3, H, W)
        r, (_, h, w) = self.translate, x.shape
        if torch.rand((), generator=self.generator) < 0.5:
            x = x.flip(-1)
        if r > 0:  # one random crop of the reflect-padded image: a shift by up to r pixels each way
            dy, dx = torch.randint(0, 2 * r + 1, (2,), generator=self.generator).tolist()
            x = F.pad(x[None], (r, r, r, r), mode="reflect")[0, :, dy : dy + h, dx : dx + w]
        return x, self.labels[i]
