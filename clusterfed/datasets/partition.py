"""Seeded non-IID partitioners: split a labelled pool over clients with ground-truth groups.

Every partitioner works on the label vector only (pure NumPy) and returns indices into the
pool; images are touched only by `client_arrays`, which applies a client's rotation and
label permutation.  This module holds the entry points (`make_partition`, `client_arrays`,
`rotate_images`); the partitioners themselves live in `label_skew` (clients differ in their
labels) and `iid_shifts` (IID samples with a per-group shift), their shared pieces in
`partition_base`.  Ground-truth group ids are for metrics only and lie in
range(num_groups).
"""

from __future__ import annotations

import math

import numpy as np

from . import iid_shifts, label_skew
from .partition_base import ClientPartition, Partition, PartitionError
from .sources import DataSource

PARTITIONERS = (
    "iid",
    "dirichlet",
    "label-skew",
    "shards",
    "dominant",
    "label-groups",
    "rotation",
    "quantity",
    "label-swap",
)


# ---------------------------------------------------------------------------------------
# public entry points


def make_partition(
    labels: np.ndarray,
    num_classes: int,
    *,
    name: str,
    num_clients: int,
    num_groups: int = 4,
    alpha: float = 0.7,
    beta: float = 0.5,
    labels_per_client: int = 2,
    label_groups: str = "",
    rotations: str = "0,90,180,270",
    min_samples: int = 10,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> Partition:
    """Split the pool with labels `labels` over `num_clients` clients by setting `name`.

    Same arguments and seed give an identical partition.  See PARTITIONERS for the names;
    `alpha` is the dominant-class fraction (`dominant`), `beta` the Dirichlet
    concentration (`dirichlet`, `quantity`).
    """
    if name not in PARTITIONERS:
        raise PartitionError(f"unknown partitioner {name!r}; choose one of: {', '.join(PARTITIONERS)}")
    labels = np.asarray(labels).astype(np.int64, copy=False)
    if labels.ndim != 1:
        raise PartitionError(f"labels must be one-dimensional, got shape {labels.shape}")
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > len(labels):
        raise PartitionError(
            f"num_clients={num_clients} exceeds the {len(labels)} samples in the pool; use fewer clients"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise PartitionError(f"labels must lie in 0..{num_classes - 1}")
    if not 0.0 <= test_fraction < 1.0:
        raise PartitionError(f"test_fraction must be in [0, 1), got {test_fraction}")

    rng = np.random.default_rng(seed)
    if name == "iid":
        drafts, groups = iid_shifts.iid(labels, num_clients, rng), 1
    elif name == "dirichlet":
        drafts, groups = label_skew.dirichlet(labels, num_classes, num_clients, beta, min_samples, rng)
    elif name == "label-skew":
        drafts, groups = label_skew.label_skew(labels, num_classes, num_clients, labels_per_client, rng)
    elif name == "shards":
        drafts, groups = label_skew.shards(labels, num_clients, rng)
    elif name == "dominant":
        drafts, groups = label_skew.dominant(labels, num_classes, num_clients, num_groups, alpha, rng), num_groups
    elif name == "label-groups":
        drafts, groups = label_skew.label_groups(labels, num_classes, num_clients, label_groups, min_samples, rng)
    elif name == "rotation":
        drafts, groups = iid_shifts.rotation(labels, num_clients, rotations, rng)
    elif name == "quantity":
        drafts, groups = iid_shifts.quantity(labels, num_clients, beta, min_samples, rng), 1
    else:  # label-swap
        drafts, groups = iid_shifts.label_swap(labels, num_classes, num_clients, num_groups, rng), num_groups

    for i, draft in enumerate(drafts):
        if len(draft.idx) < min_samples:
            raise PartitionError(
                f"partition {name!r}: client {i} gets {len(draft.idx)} samples, fewer than "
                f"min_samples={min_samples}; use fewer clients or a smaller min-samples"
            )
        size = len(draft.idx)
        if test_fraction > 0 and size >= 2 and size - math.ceil(test_fraction * size) < 1:
            raise PartitionError(
                f"partition {name!r}: test-fraction {test_fraction:g} leaves client {i} ({size} samples) "
                f"no training data; lower test-fraction"
            )
    clients = []
    for draft in drafts:
        train_idx, test_idx = _train_test(draft.idx, labels, test_fraction, rng)
        clients.append(ClientPartition(train_idx, test_idx, int(draft.group), draft.rotation, draft.label_perm))
    return Partition(clients=clients, num_groups=int(groups), name=name)


def client_arrays(
    source: DataSource, part: ClientPartition
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) of one client, rotated and label-permuted."""

    def take(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = rotate_images(source.x[idx], part.rotation)
        y = source.y[idx]
        if part.label_perm is not None:
            y = np.asarray(part.label_perm, dtype=np.int64)[y]
        return np.ascontiguousarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64).copy()

    x_train, y_train = take(part.train_idx)
    x_test, y_test = take(part.test_idx)
    return x_train, y_train, x_test, y_test


def rotate_images(x: np.ndarray, degrees: float) -> np.ndarray:
    """Rotate (N, C, H, W) images counter-clockwise by `degrees`.

    Multiples of 90 use np.rot90 (exact); other angles interpolate bilinearly, filling
    the corners with the nearest edge pixel (the normalised background, not 0).
    """
    angle = float(degrees) % 360.0
    if angle == 0.0:
        return x
    if angle % 90.0 == 0.0:
        return np.rot90(x, k=int(angle // 90), axes=(2, 3))
    return _rotate_interpolated(x, angle)


def _rotate_interpolated(x: np.ndarray, angle: float) -> np.ndarray:
    from scipy import ndimage

    # axes=(3, 2) makes a positive angle turn the same way as np.rot90(axes=(2, 3)).
    return ndimage.rotate(x, angle, axes=(3, 2), reshape=False, order=1, mode="nearest")



def _train_test(idx, labels, test_fraction, rng) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train/test split of one client's pool, stratified by label when possible."""
    from sklearn.model_selection import train_test_split

    idx = np.asarray(idx, dtype=np.int64)
    state = int(rng.integers(2**31 - 1))  # drawn always, so the stream does not depend on the data
    if test_fraction == 0.0 or len(idx) < 2:
        return np.sort(idx), np.empty(0, dtype=np.int64)
    y = labels[idx]
    stratify = y if np.unique(y, return_counts=True)[1].min() >= 2 else None
    try:
        train, test = train_test_split(idx, test_size=test_fraction, random_state=state, stratify=stratify)
    except ValueError:
        # Too few test (or train) slots for one sample of every label: split unstratified.
        train, test = train_test_split(idx, test_size=test_fraction, random_state=state)
    return np.sort(train), np.sort(test)
