"""What every partitioner shares: a partition and its clients, the error a partition that
cannot be built raises, a client's draft (its whole pool before the train/test split) and the
seeded split of a pool into sizes with a minimum each."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class PartitionError(ValueError):
    """The requested partition cannot be built; the message says what to change."""


@dataclass
class ClientPartition:
    train_idx: np.ndarray  # indices into the source pool
    test_idx: np.ndarray
    group: int  # ground-truth group id (metrics only)
    rotation: float = 0.0  # degrees applied to this client's images
    label_perm: np.ndarray | None = None  # label-swap: y -> label_perm[y]

    @property
    def num_samples(self) -> int:
        return int(len(self.train_idx) + len(self.test_idx))


@dataclass
class Partition:
    clients: list[ClientPartition]
    num_groups: int
    name: str

    def groups(self) -> np.ndarray:
        return np.array([c.group for c in self.clients], dtype=np.int64)



@dataclass
class Draft:
    """A client's whole pool before the train/test split."""

    idx: np.ndarray
    group: int
    rotation: float = 0.0
    label_perm: np.ndarray | None = None



def sizes_with_minimum(total, parts, concentration, minimum, rng) -> np.ndarray | None:
    """Integer sizes summing to `total`: `minimum` each plus a Dir(concentration) split
    of the remainder (largest-remainder rounding).  None if total < parts * minimum."""
    spare = total - parts * minimum
    if spare < 0:
        return None
    props = rng.dirichlet(np.full(parts, float(concentration)))
    raw = props * spare
    sizes = np.floor(raw).astype(np.int64)
    short = spare - int(sizes.sum())
    sizes[np.argsort(-(raw - sizes), kind="stable")[:short]] += 1
    return sizes + minimum
