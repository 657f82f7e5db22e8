"""Image data sources: one in-memory pool (train + test splits joined) per data set.

The partitioner splits every client's share into train/test itself, so the official
train/test split of a data set is not kept.  Arrays are returned read-only because a
source is cached and shared by all clients that run in one process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# `hf:<name or folder>`: an image classification set from Flower Datasets / the Hugging Face Hub
# (by name, e.g. `hf:ylecun/mnist`, from the Hub's cache) or a folder written by `save_to_disk`
HUGGING_FACE_PREFIX = "hf:"

# synthetic-digits: enough images for 10,000 clients of 12 (cross-device scale), drawn with a
# fixed seed so every process and every run sees the same pool
SYNTHETIC_DIGITS_SIZE = 120_000
SYNTHETIC_DIGITS_NOISE = 0.3


class DatasetNotFoundError(RuntimeError):
    """The files of a data set are missing; the message says where they were expected."""


@dataclass(frozen=True, eq=False)  # eq=False: arrays have no scalar ==, hash stays by identity
class DataSource:
    name: str
    x: np.ndarray  # float32 (N, C, H, W), scaled to [0, 1] then normalised per channel
    y: np.ndarray  # int64 (N,)
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, int, int]:
        c, h, w = self.x.shape[1:]
        return int(c), int(h), int(w)

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True)
class Dataset:
    """One built-in data set, declared once: what the server needs without the data (input
    shape, class count, the model ``model = "auto"`` picks), how a device normalises its own
    raw images (``channel_stats``), and how the pool is read (``read(root)`` -> images in
    [0, 1] as float32 (N, C, H, W), int64 labels, class count). ``files``: for a set read
    from ``data-dir``, what torchvision expects there and the command that downloads it
    (``{d}``: the folder), quoted when they are missing; None for a set built in memory."""

    name: str
    input_shape: tuple[int, int, int]
    num_classes: int
    default_model: str
    # per-channel mean and std of images scaled to [0, 1]. digits / synthetic-digits: their
    # pools' (scikit-learn's 1797 images; the generated pool); the others: the usual published
    # training-split statistics, which differ from the simulation's train+test pool only in
    # the third decimal
    channel_stats: tuple[tuple[float, ...], tuple[float, ...]]
    read: Callable[[str | None], tuple[np.ndarray, np.ndarray, int]] = field(repr=False)
    files: tuple[str, str] | None = None


BUILT_IN: dict[str, Dataset] = {d.name: d for d in (
    Dataset("digits", (1, 8, 8), 10, "digits-cnn", ((0.30526,), (0.37605,)), lambda root: _load_digits()),
    Dataset("synthetic-digits", (1, 8, 8), 10, "digits-cnn", ((0.30519,), (0.48079,)),
            lambda root: _generate_synthetic_digits()),
    Dataset("mnist", (1, 28, 28), 10, "mnist-cnn", ((0.1307,), (0.3081,)),
            lambda root: _load_torchvision("mnist", root),
            ("{d}/MNIST/raw/train-images-idx3-ubyte, train-labels-idx1-ubyte, "
             "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte",
             "torchvision.datasets.MNIST(\"{d}\", download=True)")),
    Dataset("fmnist", (1, 28, 28), 10, "fmnist-cnn", ((0.2860,), (0.3530,)),
            lambda root: _load_torchvision("fmnist", root),
            ("{d}/FashionMNIST/raw/train-images-idx3-ubyte, train-labels-idx1-ubyte, "
             "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte",
             "torchvision.datasets.FashionMNIST(\"{d}\", download=True)")),
    Dataset("emnist-letters", (1, 28, 28), 26, "mnist-cnn", ((0.1722,), (0.3309,)),
            lambda root: _load_torchvision("emnist-letters", root),
            ("{d}/EMNIST/raw/emnist-letters-train-images-idx3-ubyte, "
             "emnist-letters-train-labels-idx1-ubyte, emnist-letters-test-images-idx3-ubyte, "
             "emnist-letters-test-labels-idx1-ubyte",
             "torchvision.datasets.EMNIST(\"{d}\", split=\"letters\", download=True)")),
    Dataset("cifar10", (3, 32, 32), 10, "cifar-cnn", ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
            lambda root: _load_torchvision("cifar10", root),
            ("{d}/cifar-10-batches-py/data_batch_1 ... data_batch_5, test_batch, batches.meta",
             "torchvision.datasets.CIFAR10(\"{d}\", download=True)")),
    Dataset("svhn", (3, 32, 32), 10, "cifar-cnn", ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
            lambda root: _load_torchvision("svhn", root),
            ("{d}/train_32x32.mat and {d}/test_32x32.mat",
             "torchvision.datasets.SVHN(\"{d}\", split=\"train\", download=True); "
             "torchvision.datasets.SVHN(\"{d}\", split=\"test\", download=True)")),
)}
DATASETS = tuple(BUILT_IN)
# the data sets built in memory, with no files to read (no `data-dir`)
EMBEDDED = tuple(name for name, dataset in BUILT_IN.items() if dataset.files is None)

_CACHE: dict[tuple[str, str | None], DataSource] = {}


def load_source(name: str, data_dir: str | None = None) -> DataSource:
    """Load (once per process) the pool of data set `name`.

    `digits` ships with scikit-learn and `synthetic-digits` is generated from it, so neither
    needs a `data_dir`; every other set is read with torchvision (download=False) from
    `data_dir` in torchvision's folder layout. `hf:<name or folder>` is read with Hugging
    Face `datasets` (the `datasets` extra): every split joined, the first image column and
    the first class-label (or `label`) column; `data_dir` is then not used.
    """
    if not is_known_dataset(name):
        raise ValueError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}, "
                         f"or {HUGGING_FACE_PREFIX}<name or folder> for a Hugging Face data set")
    root = None if name in EMBEDDED or is_hugging_face(name) else _require_dir(name, data_dir)
    key = (name, root)
    if key not in _CACHE:
        if is_hugging_face(name):
            images, labels, num_classes = _load_hugging_face(name[len(HUGGING_FACE_PREFIX):])
        else:
            images, labels, num_classes = BUILT_IN[name].read(root)
        _CACHE[key] = _make_source(name, images, labels, num_classes)
    return _CACHE[key]


def is_hugging_face(name: str) -> bool:
    return name.startswith(HUGGING_FACE_PREFIX)


def is_known_dataset(name: str) -> bool:
    """A built-in data set or a well-formed `hf:` reference (whether it exists is checked on load)."""
    return name in DATASETS or (is_hugging_face(name) and bool(name[len(HUGGING_FACE_PREFIX):].strip()))


def _require_dir(name: str, data_dir: str | None) -> str:
    if data_dir is None or str(data_dir) == "":
        layout, _ = BUILT_IN[name].files
        raise DatasetNotFoundError(
            f"dataset {name!r} is read from disk but `data-dir` is not set: set `data-dir` "
            f"to a folder holding {layout.format(d='<data-dir>')} (torchvision layout), "
            "or use the built-in dataset 'digits'"
        )
    return os.path.abspath(os.path.expanduser(str(data_dir)))


def _not_found(name: str, root: str, cause: Exception) -> DatasetNotFoundError:
    layout, download = BUILT_IN[name].files
    return DatasetNotFoundError(
        f"dataset {name!r} not found under {root!r}: expected {layout.format(d=root)} "
        f"(torchvision layout). Download it on a machine with network with "
        f"`python -c 'import torchvision; {download.format(d=root)}'` and copy the folder "
        f"to {root!r}. (torchvision said: {cause})"
    )


def _load_digits() -> tuple[np.ndarray, np.ndarray, int]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = bunch.images.astype(np.float32)[:, None, :, :] / 16.0  # pixel values 0..16
    return images, bunch.target.astype(np.int64), 10


def _generate_synthetic_digits(size: int = SYNTHETIC_DIGITS_SIZE, noise: float = SYNTHETIC_DIGITS_NOISE,
                               seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """`size` 8×8 images for simulations of many clients (the 1,797 digits hold too few):
    each a uniformly drawn label, one of scikit-learn's digits of that label, plus Gaussian
    pixel noise of std `noise` (pixels scaled to [0, 1]). Seeded: the same pool everywhere."""
    digits, targets, num_classes = _load_digits()
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size).astype(np.int64)
    images = np.empty((size, *digits.shape[1:]), dtype=np.float32)
    for label in range(num_classes):
        where = np.flatnonzero(labels == label)
        members = np.flatnonzero(targets == label)
        images[where] = digits[members[rng.integers(0, len(members), len(where))]]
    images += rng.normal(0.0, noise, images.shape).astype(np.float32)
    return images, labels, num_classes


def _to_numpy(a) -> np.ndarray:
    return a.numpy() if hasattr(a, "numpy") else np.asarray(a)


def _load_torchvision(name: str, root: str) -> tuple[np.ndarray, np.ndarray, int]:
    from torchvision import datasets as tvd

    def both_splits(make):
        try:
            return make(True), make(False)
        except (RuntimeError, FileNotFoundError, OSError) as exc:
            raise _not_found(name, root, exc) from None

    if name in ("mnist", "fmnist", "emnist-letters"):
        if name == "mnist":
            parts = both_splits(lambda train: tvd.MNIST(root, train=train, download=False))
        elif name == "fmnist":
            parts = both_splits(lambda train: tvd.FashionMNIST(root, train=train, download=False))
        else:
            parts = both_splits(
                lambda train: tvd.EMNIST(root, split="letters", train=train, download=False)
            )
        images = np.concatenate([_to_numpy(p.data) for p in parts])  # uint8 (N, 28, 28)
        labels = np.concatenate([_to_numpy(p.targets) for p in parts]).astype(np.int64)
        num_classes = 10
        if name == "emnist-letters":
            # EMNIST files store images transposed relative to MNIST; labels are 1..26.
            images = images.transpose(0, 2, 1)
            labels = labels - 1
            num_classes = 26
        images = images[:, None, :, :]
    elif name == "cifar10":
        parts = both_splits(lambda train: tvd.CIFAR10(root, train=train, download=False))
        images = np.concatenate([p.data for p in parts]).transpose(0, 3, 1, 2)  # NHWC -> NCHW
        labels = np.concatenate([np.asarray(p.targets) for p in parts]).astype(np.int64)
        num_classes = 10
    else:  # svhn; torchvision already maps the label 10 to digit 0
        parts = both_splits(
            lambda train: tvd.SVHN(root, split="train" if train else "test", download=False)
        )
        images = np.concatenate([p.data for p in parts])  # already NCHW
        labels = np.concatenate([np.asarray(p.labels) for p in parts]).astype(np.int64)
        num_classes = 10
    return images.astype(np.float32) / 255.0, labels, num_classes


def _load_hugging_face(target: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Images (N, C, H, W) in [0, 1] for uint8 pixels, labels and class count of a Hugging
    Face data set: a folder from `save_to_disk`, else a name `datasets.load_dataset` knows."""
    try:
        import datasets
    except ImportError:
        raise DatasetNotFoundError(f"dataset 'hf:{target}' needs Hugging Face datasets: "
                                   "pip install \"clusterfed[datasets]\"") from None
    folder = os.path.expanduser(target)
    try:
        data = datasets.load_from_disk(folder) if os.path.isdir(folder) else datasets.load_dataset(target)
    except (FileNotFoundError, OSError, ValueError, ConnectionError) as exc:
        where = f"the folder {folder!r}" if os.path.isdir(folder) else f"the Hugging Face Hub or its cache"
        raise DatasetNotFoundError(f"dataset 'hf:{target}' could not be read from {where}: {exc}") from None
    splits = list(data.values()) if isinstance(data, datasets.DatasetDict) else [data]
    if not splits or not sum(len(s) for s in splits):
        raise DatasetNotFoundError(f"dataset 'hf:{target}' holds no rows")
    joined = datasets.concatenate_datasets(splits)
    image_col, label_col = _image_and_label_columns(target, joined.features)
    images = np.stack([np.asarray(img) for img in joined[image_col]])
    if images.ndim == 3:  # (N, H, W): one channel
        images = images[:, None]
    elif images.ndim == 4:  # (N, H, W, C), as images are stored
        images = images.transpose(0, 3, 1, 2)
    else:
        raise DatasetNotFoundError(f"dataset 'hf:{target}': column {image_col!r} holds {images.ndim - 1}-d "
                                   "values, not images (H, W) or (H, W, C)")
    scale = 255.0 if images.dtype == np.uint8 else 1.0
    labels = np.asarray(joined[label_col])
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise DatasetNotFoundError(f"dataset 'hf:{target}': column {label_col!r} must hold class ids 0..C-1")
    num_classes = getattr(joined.features[label_col], "num_classes", None) or int(labels.max()) + 1
    return images.astype(np.float32) / scale, labels.astype(np.int64), int(num_classes)


def _image_and_label_columns(target: str, features) -> tuple[str, str]:
    """The first `Image` (else `image`/`img`) column and the first `ClassLabel` (else `label`) column."""
    from datasets import ClassLabel, Image

    names = list(features)
    image = next((n for n in names if isinstance(features[n], Image)), None) or next(
        (n for n in ("image", "img") if n in names), None)
    label = next((n for n in names if isinstance(features[n], ClassLabel)), None) or next(
        (n for n in ("label", "labels") if n in names), None)
    if image is None or label is None:
        raise DatasetNotFoundError(f"dataset 'hf:{target}' needs an image column and a class-label column; "
                                   f"it has {', '.join(names)}")
    return image, label


def _make_source(name: str, images: np.ndarray, labels: np.ndarray, num_classes: int) -> DataSource:
    images = np.ascontiguousarray(images, dtype=np.float32)
    # Per-channel statistics in float64 to avoid accumulation error on large pools.
    mean = images.mean(axis=(0, 2, 3), dtype=np.float64)
    std = images.std(axis=(0, 2, 3), dtype=np.float64)
    std[std == 0] = 1.0
    images -= mean.astype(np.float32)[None, :, None, None]
    images /= std.astype(np.float32)[None, :, None, None]
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    images.setflags(write=False)
    labels.setflags(write=False)
    return DataSource(name=name, x=images, y=labels, num_classes=int(num_classes))
