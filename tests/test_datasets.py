"""Data sources: built-in digits, torchvision sets read offline, missing-data messages."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from clusterfed.datasets import (
    DATASETS,
    DatasetNotFoundError,
    client_arrays,
    load_source,
    make_partition,
)

SHARED_MNIST = Path(__file__).resolve().parents[2] / "shared/data/MNIST"


def _write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array in the IDX format torchvision reads (magic 0x08 = uint8)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def test_digits_shape_and_normalisation():
    src = load_source("digits")
    assert src.x.shape == (1797, 1, 8, 8)
    assert src.x.dtype == np.float32 and src.y.dtype == np.int64
    assert src.input_shape == (1, 8, 8)
    assert src.num_classes == 10
    assert set(np.unique(src.y)) == set(range(10))
    assert abs(float(src.x.mean())) < 1e-4
    assert abs(float(src.x.std()) - 1.0) < 1e-3


def test_synthetic_digits_are_noisy_copies_of_the_digits_of_their_label():
    """The generated pool: seeded (the same images in every process), every label drawn,
    and each image nearer the digits of its own label than of any other (the noise hides
    no label: a nearest-class-mean rule recovers them)."""
    from clusterfed.datasets.sources import (
        SYNTHETIC_DIGITS_SIZE,
        _generate_synthetic_digits,
        _load_digits,
    )

    images, labels, num_classes = _generate_synthetic_digits(size=2_000)
    again, labels_again, _ = _generate_synthetic_digits(size=2_000)
    assert np.array_equal(images, again) and np.array_equal(labels, labels_again)
    assert images.shape == (2_000, 1, 8, 8) and num_classes == 10
    assert set(np.unique(labels)) == set(range(10))
    digits, targets, _ = _load_digits()
    means = np.stack([digits[targets == c].mean(axis=0) for c in range(10)]).reshape(10, -1)
    nearest = np.argmin(((images.reshape(len(images), 1, -1) - means[None]) ** 2).sum(axis=2), axis=1)
    assert (nearest == labels).mean() > 0.8
    # the noise is there: every image is away from its nearest digit, and that digit has its label
    few, flat = images[:200].reshape(200, 1, -1), digits.reshape(1, len(digits), -1)
    squared = ((few - flat) ** 2).sum(axis=2)
    assert squared.min(axis=1).min() > 64 * 0.1 ** 2
    assert (targets[squared.argmin(axis=1)] == labels[:200]).mean() > 0.9
    source = load_source("synthetic-digits")  # no data-dir: it is generated
    assert source.x.shape == (SYNTHETIC_DIGITS_SIZE, 1, 8, 8) and source.input_shape == (1, 8, 8)
    assert abs(float(source.x.mean())) < 1e-3 and abs(float(source.x.std()) - 1.0) < 1e-3


@pytest.mark.end_to_end
def test_the_10000_client_setting_gives_every_client_its_minimum():
    from clusterfed.experiments.settings import setting

    values = setting("synthetic-rotation-10000-frac0.1")
    source = load_source(values["dataset"])
    partition = make_partition(source.y, source.num_classes, name=values["partitioner"],
                               num_clients=values["num-clients"], seed=0, min_samples=values["min-samples"],
                               rotations=values["rotations"])
    sizes = [client.num_samples for client in partition.clients]
    assert len(sizes) == 10_000 and min(sizes) >= values["min-samples"] and sum(sizes) == len(source)
    assert sorted(set(partition.groups().tolist())) == [0, 1, 2, 3]


def test_sources_are_cached_and_read_only():
    a = load_source("digits")
    assert load_source("digits") is a
    with pytest.raises(ValueError):
        a.x[0, 0, 0, 0] = 1.0


def test_unknown_dataset_lists_choices():
    with pytest.raises(ValueError) as err:
        load_source("imagenet")
    for name in DATASETS:
        assert name in str(err.value)


def test_disk_dataset_without_data_dir():
    with pytest.raises(DatasetNotFoundError, match="data-dir"):
        load_source("mnist")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("mnist", "MNIST/raw/train-images-idx3-ubyte"),
        ("fmnist", "FashionMNIST/raw/train-images-idx3-ubyte"),
        ("emnist-letters", "EMNIST/raw/emnist-letters-train-images-idx3-ubyte"),
        ("cifar10", "cifar-10-batches-py/data_batch_1"),
        ("svhn", "train_32x32.mat"),
    ],
)
def test_missing_dataset_message(tmp_path, name, expected):
    with pytest.raises(DatasetNotFoundError) as err:
        load_source(name, str(tmp_path))
    msg = str(err.value)
    assert f"{tmp_path}/{expected}" in msg
    assert "download=True" in msg and "torchvision layout" in msg
    assert err.value.__cause__ is None  # raised `from None`: no torchvision trace for callers


def test_emnist_letters_orientation_and_labels(tmp_path):
    # An image that is not symmetric under transposition: one lit pixel at row 1, col 5.
    raw = tmp_path / "EMNIST" / "raw"
    stored = np.zeros((3, 28, 28), dtype=np.uint8)
    stored[:, 5, 1] = 255  # EMNIST files hold the transpose of the upright image
    for split, labels in (("train", [1, 2, 26]), ("test", [3, 4, 5])):
        _write_idx(raw / f"emnist-letters-{split}-images-idx3-ubyte", stored)
        _write_idx(raw / f"emnist-letters-{split}-labels-idx1-ubyte", np.array(labels, dtype=np.uint8))
    src = load_source("emnist-letters", str(tmp_path))
    assert src.num_classes == 26
    assert src.x.shape == (6, 1, 28, 28)
    assert src.y.tolist() == [0, 1, 25, 2, 3, 4]
    bright = np.argwhere(src.x[0, 0] == src.x[0, 0].max())
    assert bright.tolist() == [[1, 5]]


def test_fake_mnist_pool_joins_train_and_test(tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    rng = np.random.default_rng(0)
    for split, n in (("train", 7), ("t10k", 3)):
        _write_idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(raw / f"{split}-labels-idx1-ubyte", np.arange(n) % 10)
    src = load_source("fmnist", str(tmp_path))
    assert src.x.shape == (10, 1, 28, 28)
    assert src.y.tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2]


@pytest.mark.skipif(not SHARED_MNIST.exists(), reason="shared MNIST folder not present")
def test_shared_mnist_pool():
    src = load_source("mnist", str(SHARED_MNIST.parent))
    assert src.x.shape == (10000, 1, 28, 28)
    assert src.input_shape == (1, 28, 28)
    assert np.bincount(src.y).tolist() == [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]
    assert abs(float(src.x.mean())) < 1e-3 and abs(float(src.x.std()) - 1.0) < 1e-3


def test_digits_partition_end_to_end():
    src = load_source("digits")
    part = make_partition(src.y, src.num_classes, name="rotation", num_clients=8, seed=3)
    total = 0
    for c in part.clients:
        x_tr, y_tr, x_te, y_te = client_arrays(src, c)
        assert x_tr.shape[1:] == src.input_shape and x_tr.dtype == np.float32
        assert len(x_tr) == len(y_tr) and len(x_te) == len(y_te) and len(x_te) > 0
        assert x_tr.flags.writeable  # copies, safe to hand to torch
        total += len(y_tr) + len(y_te)
    assert total == len(src.y)


@pytest.fixture
def saved_digits(tmp_path, monkeypatch) -> tuple[Path, np.ndarray, np.ndarray]:
    """scikit-learn's digits as a Hugging Face data set on disk (train/test, PIL images, ClassLabel)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # local files only (read when datasets is first imported)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels = (bunch.images * 255 / 16).astype(np.uint8)
    features = Features({"img": Image(), "digit": ClassLabel(num_classes=10)})
    parts = {split: Dataset.from_dict({"img": list(pixels[rows]), "digit": bunch.target[rows]}, features=features)
             for split, rows in (("train", slice(0, 1500)), ("test", slice(1500, None)))}
    folder = tmp_path / "digits-hf"
    DatasetDict(parts).save_to_disk(str(folder))
    return folder, pixels, bunch.target


def test_a_hugging_face_folder_is_a_source_like_the_built_in_sets(saved_digits):
    from clusterfed.datasets.shapes import DATASET_SHAPES

    folder, pixels, target = saved_digits
    src = load_source(f"hf:{folder}")
    assert src.x.shape == (1797, 1, 8, 8) and src.num_classes == 10
    assert np.array_equal(src.y, target)  # both splits, in order: the partitioner splits them again
    assert abs(float(src.x.mean())) < 1e-4 and abs(float(src.x.std()) - 1.0) < 1e-3
    assert f"hf:{folder}" in DATASET_SHAPES and DATASET_SHAPES[f"hf:{folder}"] == ((1, 8, 8), 10)
    part = make_partition(src.y, src.num_classes, name="rotation", num_clients=4)
    x_train, y_train, _, _ = client_arrays(src, part.clients[1])
    assert x_train.shape[1:] == (1, 8, 8) and len(y_train) == len(part.clients[1].train_idx)


@pytest.mark.end_to_end
def test_the_built_in_task_runs_on_a_hugging_face_folder(saved_digits, small_config, tmp_path):
    from clusterfed.simulation import simulate

    folder, _, _ = saved_digits
    common = {"model": "digits-cnn", "rounds": 2, "num_clients": 4}
    folder_run = simulate(small_config(dataset=f"hf:{folder}", out_dir=str(tmp_path / "hf"), **common),
                          engine="inprocess", stream=None)
    built_in = simulate(small_config(dataset="digits", out_dir=str(tmp_path / "digits"), **common),
                        engine="inprocess", stream=None)
    # the same images (up to 8-bit rounding) in the same order: the same split, nearly the same accuracy
    assert folder_run["final_accuracy"] == pytest.approx(built_in["final_accuracy"], abs=0.05)


def test_a_missing_or_malformed_hugging_face_set_is_one_clear_message(tmp_path, small_config):
    from datasets import Dataset

    from clusterfed.config import ConfigError

    with pytest.raises(DatasetNotFoundError, match="could not be read from the folder"):
        (tmp_path / "empty").mkdir()
        load_source(f"hf:{tmp_path / 'empty'}")
    tabular = tmp_path / "tabular"
    Dataset.from_dict({"x": [1.0, 2.0], "label": [0, 1]}).save_to_disk(str(tabular))
    with pytest.raises(DatasetNotFoundError, match="needs an image column and a class-label column; it has x, label"):
        load_source(f"hf:{tabular}")
    with pytest.raises(ConfigError, match="hf:<name or folder>"):
        small_config(dataset="hf:")


def test_each_built_in_data_set_is_declared_once_and_the_tables_derive_from_it():
    from clusterfed.datasets.device_data import CHANNEL_STATS
    from clusterfed.datasets.shapes import DATASET_SHAPES
    from clusterfed.datasets.sources import BUILT_IN, DATASETS, EMBEDDED
    from clusterfed.models import AUTO_MODEL, MODELS

    assert list(BUILT_IN) == list(DATASETS) == list(AUTO_MODEL) == list(CHANNEL_STATS)
    assert set(EMBEDDED) == {"digits", "synthetic-digits"}
    for name, dataset in BUILT_IN.items():
        assert DATASET_SHAPES[name] == (dataset.input_shape, dataset.num_classes)
        assert dataset.default_model in MODELS
        means, stds = dataset.channel_stats
        assert len(means) == len(stds) == dataset.input_shape[0], name  # one mean and std per channel
