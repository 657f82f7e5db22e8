"""The cell's clients' data: MNIST (torchvision's files, read locally, never downloaded) or
scikit-learn's digits (bundled with scikit-learn), as images ``(1, S, S)`` scaled to [0, 1]
(the loaders normalise them).

Client i belongs to true group ``true_groups(cell)[i]`` (balanced, shuffled by the cell's seed;
all 0 in the IID control). Each client draws ``train_examples`` and ``test_examples`` from the
training and test pools, then its group's shift applies:

- ``label_swap``: group g > 0 relabels through its own permutation of the 10 classes;
- ``rotation``: group g rotates its images by g·360°/groups;
- ``label_skew``: group g draws only from its own share of the classes (the classes split among
  the groups);
- ``iid``: one group, no shift (the control: nothing to find).

The MNIST folder: ``$CLUSTERFED_MNIST_ROOT``, else ``../shared/data`` beside the repository,
else ``/work/shared/data`` (a folder holding ``MNIST/raw/``)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage
from torch.utils.data import DataLoader, TensorDataset

from fuzz.cell import Cell

ROOT = Path(__file__).resolve().parents[2]
NUM_CLASSES = 10
NORMALISE = {"mnist": (0.1307, 0.3081), "digits": (0.3, 0.4)}  # (mean, std), as torchvision's MNIST examples do
MNIST_POOL = 12000  # the leading training images drawn from (the test pool: all 10,000 test images)


def mnist_root() -> Path:
    candidates = [os.environ.get("CLUSTERFED_MNIST_ROOT"), ROOT.parent / "shared" / "data", "/work/shared/data"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "MNIST" / "raw").is_dir():
            return Path(candidate)
    raise FileNotFoundError("MNIST not found: set CLUSTERFED_MNIST_ROOT to a folder holding MNIST/raw/ "
                            "(torchvision.datasets.MNIST's layout)")


@lru_cache(maxsize=2)
def pools(dataset: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels): float32 ``(N, 1, S, S)`` in [0, 1]."""
    if dataset == "mnist":
        from torchvision.datasets import MNIST

        root = str(mnist_root())
        train, test = MNIST(root, train=True, download=False), MNIST(root, train=False, download=False)
        to_float = lambda t: (t.numpy()[:, None].astype(np.float32) / 255.0)  # noqa: E731
        return (to_float(train.data[:MNIST_POOL]), train.targets.numpy()[:MNIST_POOL],
                to_float(test.data), test.targets.numpy())
    if dataset == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        x, y = (digits.images[:, None] / 16.0).astype(np.float32), digits.target
        order = np.random.default_rng(0).permutation(len(y))
        test, train = order[:500], order[500:]
        return x[train], y[train], x[test], y[test]
    raise ValueError(f"unknown dataset {dataset!r}")


def true_groups(cell: Cell) -> list[int]:
    """Each client's true group (metrics only: no strategy sees it)."""
    rng = np.random.default_rng([cell.seed, 1])
    return [int(g) for g in rng.permutation([i % cell.groups for i in range(cell.clients)])]


def world(cell: Cell) -> dict:
    """What the groups share: label permutations, class shares, rotation angles."""
    rng = np.random.default_rng([cell.seed, 2])
    permutations = [np.arange(NUM_CLASSES)] + [rng.permutation(NUM_CLASSES) for _ in range(1, cell.groups)]
    shares = np.array_split(rng.permutation(NUM_CLASSES), cell.groups)
    angles = [360.0 * g / cell.groups for g in range(cell.groups)]
    return {"permutations": permutations, "shares": shares, "angles": angles}


def _draw(x: np.ndarray, y: np.ndarray, n: int, classes, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    index = np.flatnonzero(np.isin(y, classes)) if classes is not None else np.arange(len(y))
    chosen = rng.choice(index, size=n, replace=len(index) < n)
    return x[chosen], y[chosen]


@lru_cache(maxsize=64)
def client_arrays(cell_json: str, partition: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Client ``partition``'s (train x, train y, test x, test y) after its group's shift."""
    cell = Cell.from_json(cell_json)
    group, shared = true_groups(cell)[partition], world(cell)
    x_pool, y_pool, x_test_pool, y_test_pool = pools(cell.dataset)
    rng = np.random.default_rng([cell.seed, 3, partition])
    classes = shared["shares"][group] if cell.shift == "label_skew" else None
    x, y = _draw(x_pool, y_pool, cell.train_examples, classes, rng)
    xt, yt = _draw(x_test_pool, y_test_pool, cell.test_examples, classes, rng)
    if cell.shift == "label_swap":
        y, yt = shared["permutations"][group][y], shared["permutations"][group][yt]
    elif cell.shift == "rotation" and shared["angles"][group]:
        angle = shared["angles"][group]
        x, xt = (ndimage.rotate(a, angle, axes=(2, 3), reshape=False, order=1).clip(0, 1).astype(np.float32)
                 for a in (x, xt))
    return x, y.astype(np.int64), xt, yt.astype(np.int64)


def loaders(cell: Cell, partition: int) -> tuple[DataLoader, DataLoader]:
    """This client's train (shuffled) and test loaders of ``(images, labels)`` batches, the
    images normalised by the data set's mean and standard deviation."""
    x, y, xt, yt = client_arrays(cell.to_json(), int(partition))
    mean, std = NORMALISE[cell.dataset]
    x, xt = (x - mean) / std, (xt - mean) / std
    generator = torch.Generator().manual_seed(cell.seed * 1000 + int(partition))
    train = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=cell.batch_size,
                       shuffle=True, generator=generator)
    return train, DataLoader(TensorDataset(torch.from_numpy(xt), torch.from_numpy(yt)), batch_size=256)
