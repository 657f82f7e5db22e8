"""clusterfed's skew partitioners as Flower Datasets partitioners.

Use them in any Flower app where a ``flwr_datasets`` partitioner goes::

    from flwr_datasets import FederatedDataset
    from clusterfed.datasets.flower_datasets import RotationPartitioner

    partitioner = RotationPartitioner(num_partitions=20, rotations=(0, 90, 180, 270))
    fds = FederatedDataset(dataset="ylecun/mnist", partitioners={"train": partitioner})
    partition = fds.load_partition(3)          # client 3's rows, its images rotated
    partitioner.group_of(3)                    # its true group (for metrics only)

Each partitioner splits the label column with the same seeded code as clusterfed's own
runs (`make_partition`), so a seed gives the same clients in both; a partition is the
client's rows (``Dataset.select``) with its rotation or label permutation applied. The
train/test split of a client is left to the app, as with Flower's partitioners.
Needs the ``datasets`` extra (``pip install "clusterfed[datasets]"``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
from flwr_datasets.partitioner import Partitioner

from .iid_shifts import parse_rotations
from .label_skew import parse_label_groups
from .partition import PARTITIONERS, make_partition
from .partition_base import ClientPartition, Partition, PartitionError

__all__ = [
    "DominantLabelPartitioner",
    "LabelGroupsPartitioner",
    "LabelSwapPartitioner",
    "RotationPartitioner",
    "SkewPartitioner",
]


class SkewPartitioner(Partitioner):
    """A clusterfed partitioner (one of `PARTITIONERS`) over a Hugging Face `Dataset`.

    `partitioner` names the split (e.g. ``"label-groups"``); `settings` are
    `make_partition`'s keywords (``num_groups``, ``alpha``, ``label_groups``, ``rotations``,
    ``min_samples``). The partition is computed once, on the first `load_partition`, from
    the column `partition_by` (integer labels 0..C-1); `image_column` is the column a
    rotation turns. Settings that can never work raise `PartitionError` here, before any
    data is read; settings that do not fit the data raise it on the first `load_partition`.
    """

    def __init__(self, num_partitions: int, partitioner: str, *, partition_by: str = "label",
                 image_column: str = "image", seed: int = 0, min_samples: int = 1, **settings) -> None:
        super().__init__()
        if not isinstance(num_partitions, int) or isinstance(num_partitions, bool) or num_partitions < 1:
            raise PartitionError(f"num_partitions must be an integer >= 1, got {num_partitions!r}")
        if min_samples < 0:
            raise PartitionError(f"min_samples must be >= 0, got {min_samples}")
        _check_settings(partitioner, settings)
        self._num_partitions = num_partitions
        self._partitioner = partitioner
        self._partition_by = partition_by
        self._image_column = image_column
        self._seed = seed
        self._settings = dict(settings, min_samples=min_samples, test_fraction=0.0)
        self._partition: Partition | None = None

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    @property
    def partition(self) -> Partition:
        """The computed split (clients' row indices, groups, rotations, label permutations)."""
        if self._partition is None:
            self._partition = self._split()
        return self._partition

    def group_of(self, partition_id: int) -> int:
        """The true group of a partition (for metrics such as ARI; no algorithm may read it)."""
        return self._client(partition_id).group

    def groups(self) -> np.ndarray:
        """The true group of every partition, in partition order."""
        return self.partition.groups()

    def load_partition(self, partition_id: int):
        client = self._client(partition_id)
        rows = self.dataset.select(client.train_idx)
        if client.rotation % 360.0:
            if self._image_column not in rows.column_names:
                raise PartitionError(
                    f"rotation: the data set has no image column {self._image_column!r} "
                    f"(columns: {', '.join(rows.column_names)}); pass image_column=")
            with quiet_progress():
                rows = rows.map(lambda row: {self._image_column: rotate_image(row[self._image_column], client.rotation)})
        if client.label_perm is not None:
            perm = client.label_perm
            with quiet_progress():
                rows = rows.map(lambda row: {self._partition_by: int(perm[row[self._partition_by]])})
        return rows

    def _client(self, partition_id: int) -> ClientPartition:
        if not 0 <= partition_id < self._num_partitions:
            raise PartitionError(f"partition_id must be in 0..{self._num_partitions - 1}, got {partition_id}")
        return self.partition.clients[partition_id]

    def _split(self) -> Partition:
        if self._partition_by not in self.dataset.column_names:
            raise PartitionError(
                f"{self._partitioner}: the data set has no label column {self._partition_by!r} "
                f"(columns: {', '.join(self.dataset.column_names)}); pass partition_by=")
        labels = np.asarray(self.dataset[self._partition_by])
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise PartitionError(f"{self._partitioner}: column {self._partition_by!r} must hold integer labels")
        feature = self.dataset.features[self._partition_by]
        num_classes = getattr(feature, "num_classes", None) or int(labels.max(initial=-1)) + 1
        return make_partition(labels, num_classes, name=self._partitioner, num_clients=self._num_partitions,
                              seed=self._seed, **self._settings)


@contextmanager
def quiet_progress() -> Iterator[None]:
    """Hugging Face datasets' progress bars off for one of our own calls: ``Dataset.map``
    draws a "Map" bar on every ``load_partition`` otherwise (a line per client per load);
    the user's own setting is left as it was."""
    if are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


class RotationPartitioner(SkewPartitioner):
    """IID rows; partition i is in group i % G and sees its images rotated by `rotations[G]`
    degrees counter-clockwise (the concept-shift setting of Sattler et al., CFL)."""

    def __init__(self, num_partitions: int, rotations: Sequence[float] = (0, 90, 180, 270), **options) -> None:
        super().__init__(num_partitions, "rotation", rotations=",".join(str(float(a)) for a in rotations), **options)


class LabelSwapPartitioner(SkewPartitioner):
    """IID rows; partition i is in group i % `num_groups` and relabels y → perm_g[y] (group 0
    keeps the labels; the others get distinct seeded permutations)."""

    def __init__(self, num_partitions: int, num_groups: int = 4, **options) -> None:
        super().__init__(num_partitions, "label-swap", num_groups=num_groups, **options)


class LabelGroupsPartitioner(SkewPartitioner):
    """Partition i is in group i % G and holds only that group's labels: `label_groups` such
    as ``"0,1;2,3;4,5"`` (``;`` between groups, ``a-b`` an inclusive range)."""

    def __init__(self, num_partitions: int, label_groups: str = "0,1;2,3;4,5;6,7;8,9", **options) -> None:
        super().__init__(num_partitions, "label-groups", label_groups=label_groups, **options)


class DominantLabelPartitioner(SkewPartitioner):
    """Partition i is in group g = i % `num_groups`; a fraction `alpha` of its rows has
    label g, the rest is spread evenly over the other labels; all partitions equal in size."""

    def __init__(self, num_partitions: int, num_groups: int = 4, alpha: float = 0.7, **options) -> None:
        super().__init__(num_partitions, "dominant", num_groups=num_groups, alpha=alpha, **options)


def rotate_image(image, degrees: float):
    """`image` (a PIL image, or an (H, W) / (H, W, C) array or nested list) turned
    counter-clockwise by `degrees`, as the same kind of value."""
    if hasattr(image, "rotate"):  # PIL: multiples of 90 are exact; others bilinear, corners black
        return image.rotate(degrees, resample=2)
    array = np.asarray(image)
    angle = float(degrees) % 360.0
    if angle % 90.0 == 0.0:
        turned = np.rot90(array, k=int(angle // 90), axes=(0, 1))
    else:
        from scipy import ndimage

        turned = ndimage.rotate(array, angle, axes=(1, 0), reshape=False, order=1, mode="nearest")
    return np.ascontiguousarray(turned)


def _check_settings(partitioner: str, settings: dict) -> None:
    """Raise PartitionError for settings no data set can satisfy."""
    if partitioner not in PARTITIONERS:
        raise PartitionError(f"unknown partitioner {partitioner!r}; choose one of: {', '.join(PARTITIONERS)}")
    if "num_groups" in settings and (not isinstance(settings["num_groups"], int) or settings["num_groups"] < 1):
        raise PartitionError(f"{partitioner}: num_groups must be an integer >= 1, got {settings['num_groups']!r}")
    if "alpha" in settings and not 0.0 <= settings["alpha"] <= 1.0:
        raise PartitionError(f"{partitioner}: alpha must be in [0, 1], got {settings['alpha']}")
    if "rotations" in settings:
        parse_rotations(settings["rotations"])
    if "label_groups" in settings:
        if not str(settings["label_groups"]).strip():
            raise PartitionError(f"{partitioner}: label_groups is empty; e.g. '0,1;2,3;4,5'")
        parse_label_groups(settings["label_groups"], num_classes=1 << 30)  # the syntax; the labels come with the data
