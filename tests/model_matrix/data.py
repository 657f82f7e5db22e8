"""Generated group-structured data, shaped for each model: no downloads.

Every client belongs to one of ``num_groups`` groups (``group_of``: partition id modulo the
group count). Inputs are noisy class prototypes shared by all clients (vectors, blocky
images, token sequences drawn from a per-class token distribution). Two shifts:

- ``concept``: group g reports class ``(y + g) mod K`` for an input of class y (a label
  permutation per group: the same input means a different label in each group);
- ``covariate``: group g sees its inputs through its own transform (vectors: a permutation
  of the features; images: a rotation by g·90°; tokens: a permutation of the vocabulary),
  labels unchanged.

Group 0 sees the untouched task under both shifts.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from model_matrix.models import IMAGE_SHAPE, NUM_CLASSES, SEQ_LEN, VECTOR_DIM, VOCAB

NUM_GROUPS = 3
SHIFTS = ("concept", "covariate")
KINDS = ("vector", "image", "tokens")
WORLD_SEED = 7  # the prototypes and transforms every client shares


def group_of(partition_id: int, num_groups: int = NUM_GROUPS) -> int:
    return int(partition_id) % num_groups


def _prototypes(kind: str, num_classes: int, image_shape: tuple[int, int, int]) -> np.ndarray:
    rng = np.random.default_rng(WORLD_SEED)
    if kind == "vector":
        return rng.normal(size=(num_classes, VECTOR_DIM))
    if kind == "image":
        channels, side = image_shape[0], image_shape[1]
        coarse = rng.normal(size=(num_classes, channels, 4, 4))
        return np.kron(coarse, np.ones((1, 1, side // 4, side // 4)))  # blocky patterns, 4×4 blocks
    if kind == "tokens":  # per class, a peaked distribution over the vocabulary
        logits = 2.0 * rng.normal(size=(num_classes, VOCAB))
        return np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    raise ValueError(f"unknown data kind {kind!r}: one of {KINDS}")


def _covariate(kind: str, group: int, x: np.ndarray) -> np.ndarray:
    """Group ``group``'s view of the inputs ``x`` (group 0: unchanged)."""
    if group == 0:
        return x
    rng = np.random.default_rng(WORLD_SEED + 100 + group)
    if kind == "vector":
        return x[:, rng.permutation(VECTOR_DIM)]
    if kind == "image":
        return np.rot90(x, k=group, axes=(2, 3)).copy()
    return rng.permutation(VOCAB)[x]  # tokens: a vocabulary permutation


def make_examples(kind: str, shift: str, partition_id: int, n: int, *, num_groups: int = NUM_GROUPS,
                  num_classes: int = NUM_CLASSES, image_shape: tuple[int, int, int] = IMAGE_SHAPE,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` examples of partition ``partition_id``: inputs (float32, or int64 tokens) and labels."""
    x, y = _examples(kind, shift, partition_id, n, num_groups, num_classes, tuple(image_shape), seed)
    return x.copy(), y.copy()


@lru_cache(maxsize=512)  # a client's data is made again for every message
def _examples(kind: str, shift: str, partition_id: int, n: int, num_groups: int, num_classes: int,
              image_shape: tuple[int, int, int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    if shift not in SHIFTS:
        raise ValueError(f"unknown shift {shift!r}: one of {SHIFTS}")
    group = group_of(partition_id, num_groups)
    prototypes = _prototypes(kind, num_classes, image_shape)
    rng = np.random.default_rng([seed, partition_id])
    y = rng.integers(num_classes, size=n)
    if kind == "tokens":
        cumulative = prototypes[y].cumsum(axis=1)
        x = (rng.random(size=(n, SEQ_LEN, 1)) > cumulative[:, None, :]).sum(axis=2).clip(max=VOCAB - 1)
        x = x.astype(np.int64)
    else:
        noise = 1.0 if kind == "vector" else 0.5
        x = (prototypes[y] + noise * rng.normal(size=prototypes[y].shape)).astype(np.float32)
    if shift == "covariate":
        x = _covariate(kind, group, x)
    else:
        y = (y + group) % num_classes
    return x, y.astype(np.int64)


def load_data(kind: str, shift: str, partition_id: int, *, n_train: int = 64, n_test: int = 32,
              batch_size: int = 16, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """This partition's train and test loaders of ``(inputs, labels)`` batches."""
    x, y = make_examples(kind, shift, partition_id, n_train + n_test, seed=seed)
    train = TensorDataset(torch.from_numpy(x[:n_train]), torch.from_numpy(y[:n_train]))
    test = TensorDataset(torch.from_numpy(x[n_train:]), torch.from_numpy(y[n_train:]))
    generator = torch.Generator().manual_seed(int(partition_id))
    return (DataLoader(train, batch_size=batch_size, shuffle=True, generator=generator),
            DataLoader(test, batch_size=256))


class DictImages(Dataset):
    """Images and labels as Flower Datasets gives them: ``{"img": ..., "label": ...}`` items."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = torch.from_numpy(images), torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        return {"img": self.images[index], "label": self.labels[index]}
