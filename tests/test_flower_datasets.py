"""clusterfed's skew partitioners as Flower Datasets partitioners, on local data (no download)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never ask the Hub (CI has no network)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest
from datasets import ClassLabel, Dataset, Features, Image, Sequence, Value
from flwr_datasets import FederatedDataset
from flwr_datasets.partitioner import Partitioner
from sklearn.datasets import load_digits

from clusterfed.datasets import PartitionError, make_partition
from clusterfed.datasets.flower_datasets import (
    DominantLabelPartitioner,
    LabelGroupsPartitioner,
    LabelSwapPartitioner,
    RotationPartitioner,
    SkewPartitioner,
)


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    bunch = load_digits()
    return bunch.images.astype(np.float32), bunch.target.astype(np.int64)


def _dataset(images: np.ndarray, labels: np.ndarray) -> Dataset:
    features = Features({"image": Sequence(Sequence(Value("float32"))), "label": ClassLabel(num_classes=10)})
    return Dataset.from_dict({"image": images, "label": labels}, features=features)


def test_rotation_partitions_are_the_seeded_split_with_each_groups_images_turned(digits):
    images, labels = digits
    partitioner = RotationPartitioner(num_partitions=8, rotations=(0, 90, 180, 270), seed=3)
    assert isinstance(partitioner, Partitioner)
    partitioner.dataset = _dataset(images, labels)
    expected = make_partition(labels, 10, name="rotation", num_clients=8, rotations="0,90,180,270",
                              seed=3, min_samples=1, test_fraction=0.0)
    assert partitioner.num_partitions == 8
    assert partitioner.groups().tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    for pid in (0, 1, 6):
        rows = expected.clients[pid].train_idx
        part = partitioner.load_partition(pid).with_format("numpy")
        turns = partitioner.group_of(pid)
        assert np.array_equal(part["label"], labels[rows])
        assert np.array_equal(part["image"], np.rot90(images[rows], k=turns, axes=(1, 2)))


def test_label_swap_permutes_labels_per_group_and_keeps_group_zero(digits):
    images, labels = digits
    partitioner = LabelSwapPartitioner(num_partitions=6, num_groups=3)
    partitioner.dataset = _dataset(images, labels)
    client = partitioner.partition.clients
    assert np.array_equal(partitioner.load_partition(0)["label"], labels[client[0].train_idx])
    moved = np.asarray(partitioner.load_partition(1)["label"])
    assert np.array_equal(moved, client[1].label_perm[labels[client[1].train_idx]])
    assert not np.array_equal(moved, labels[client[1].train_idx])
    assert partitioner.groups().tolist() == [0, 1, 2, 0, 1, 2]


def test_label_groups_and_dominant_work_inside_a_federated_dataset(digits, tmp_path):
    """FederatedDataset reads a local parquet file (no Hub) and hands our partitioners its split."""
    images, labels = digits
    path = tmp_path / "digits.parquet"
    _dataset(images, labels).to_parquet(str(path))
    groups = LabelGroupsPartitioner(num_partitions=10, label_groups="0,1;2,3;4,5;6,7;8,9")
    fds = FederatedDataset(dataset="parquet", data_files={"train": str(path)}, partitioners={"train": groups},
                           shuffle=False)
    wanted = [{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}]
    sizes = 0
    for pid in range(10):
        part = fds.load_partition(pid)
        assert set(part["label"]) == wanted[pid % 5] and groups.group_of(pid) == pid % 5
        sizes += len(part)
    assert sizes == len(labels)  # every row in exactly one partition

    dominant = DominantLabelPartitioner(num_partitions=4, num_groups=4, alpha=0.8)
    dominant.dataset = _dataset(images, labels)
    for pid in range(4):
        counts = np.bincount(dominant.load_partition(pid)["label"], minlength=10)
        assert counts.argmax() == pid and counts[pid] / counts.sum() == pytest.approx(0.8, abs=0.01)


def test_pil_images_turn_like_arrays():
    pixels = np.arange(4 * 6 * 6, dtype=np.uint8).reshape(4, 6, 6)
    data = Dataset.from_dict({"image": list(pixels), "label": [0, 1, 0, 1]},
                             features=Features({"image": Image(), "label": Value("int64")}))
    partitioner = RotationPartitioner(num_partitions=2, rotations=(0, 90))
    partitioner.dataset = data
    rows = partitioner.partition.clients[1].train_idx
    turned = [np.asarray(img) for img in partitioner.load_partition(1)["image"]]
    assert all(np.array_equal(t, np.rot90(pixels[r])) for t, r in zip(turned, rows))


@pytest.mark.parametrize("make, message", [
    (lambda: RotationPartitioner(4, rotations=()), "malformed rotations"),
    (lambda: LabelGroupsPartitioner(4, label_groups="0,1;3-2"), "runs backwards"),
    (lambda: LabelSwapPartitioner(4, num_groups=0), "num_groups must be an integer >= 1"),
    (lambda: DominantLabelPartitioner(4, alpha=1.5), "alpha must be in [0, 1]"),
    (lambda: SkewPartitioner(0, "rotation"), "num_partitions must be an integer >= 1"),
    (lambda: SkewPartitioner(4, "stripes"), "unknown partitioner 'stripes'"),
])
def test_impossible_settings_fail_at_construction(make, message):
    with pytest.raises(PartitionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make()


def test_settings_that_do_not_fit_the_data_fail_on_the_first_load(digits):
    images, labels = digits
    data = _dataset(images, labels)
    out_of_range = LabelGroupsPartitioner(4, label_groups="0,1;10,11")
    out_of_range.dataset = data
    with pytest.raises(PartitionError, match="label 10 out of range 0..9"):
        out_of_range.load_partition(0)
    too_many = RotationPartitioner(100, min_samples=50)
    too_many.dataset = data
    with pytest.raises(PartitionError, match="fewer than min_samples=50"):
        too_many.load_partition(0)
    no_labels = RotationPartitioner(4, partition_by="digit")
    no_labels.dataset = data
    with pytest.raises(PartitionError, match="no label column 'digit'"):
        no_labels.load_partition(0)
    with pytest.raises(PartitionError, match=r"partition_id must be in 0..3"):
        RotationPartitioner(4).load_partition(4)


@pytest.mark.parametrize("make", [lambda: LabelSwapPartitioner(num_partitions=6, num_groups=3),
                                  lambda: RotationPartitioner(num_partitions=4, rotations=(0, 90))])
def test_loading_a_partition_draws_no_progress_bar_and_leaves_the_users_setting(make, digits, capfd):
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    images, labels = digits
    partitioner = make()
    partitioner.dataset = _dataset(images, labels)
    enable_progress_bars()
    capfd.readouterr()
    for pid in (1, 2, 3):  # each one mapped (a permuted label or a turned image)
        partitioner.load_partition(pid)
    assert "Map" not in capfd.readouterr().err
    assert not are_progress_bars_disabled()  # not silenced for the user's own calls
    disable_progress_bars()
    partitioner.load_partition(1)
    assert are_progress_bars_disabled()  # nor switched on
    enable_progress_bars()
