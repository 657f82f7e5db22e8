"""A device's own data (data-path): .npz and ImageFolder files, conversion, errors, export."""

import json
import os

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from PIL import Image

from clusterfed import client_app, protocol
from clusterfed.cli import main as cli_main
from clusterfed.config import parse_config
from clusterfed.datasets import device_data
from clusterfed.datasets.device_data import CHANNEL_STATS, file_sha256, load_device_data

DIGITS = {"dataset": "digits", "partitioner": "label-groups", "num-clients": 6, "num-groups": 3,
          "label-groups": "0,1,2;3,4,5;6,7,8,9", "seed": 3}


@pytest.fixture(autouse=True)
def fresh_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERFED_CACHE_DIR", str(tmp_path / "cache"))
    device_data._load_cached.cache_clear()
    client_app._data_key.cache_clear()
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    yield
    device_data._load_cached.cache_clear()


def _config_record(values):
    config = parse_config(values)
    return protocol.config_record(protocol.client_spec(config.to_flower()))


def _context(node_config):
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})


def _save(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_exported_parts_load_to_what_the_simulated_client_gets(tmp_path):
    out = tmp_path / "parts"
    args = ["partition", "--out", str(out)] + [arg for k, v in DIGITS.items() for arg in ("--set", f"{k}={v}")]
    assert cli_main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["clients"]) == 6 and manifest["settings"]["label-groups"] == DIGITS["label-groups"]
    config = _config_record(DIGITS)
    for entry in manifest["clients"]:
        path = out / entry["file"]
        assert entry["sha256"] == file_sha256(path)
        simulated = client_app._client_data(config, {"partition-id": entry["partition-id"]})
        own = load_device_data(path, "digits")
        for name in ("x_train", "y_train", "x_test", "y_test"):
            np.testing.assert_array_equal(getattr(own, name), getattr(simulated, name))
        assert own.true_group == simulated.true_group == entry["true-group"]
        assert (entry["train-samples"], entry["test-samples"]) == (len(own.y_train), len(own.y_test))
    assert sorted({c["true-group"] for c in manifest["clients"]}) == [0, 1, 2]


def test_converted_copy_is_memory_mapped_from_the_cache(tmp_path):
    path = _save(tmp_path / "p.npz", x_train=np.zeros((4, 8, 8), np.uint8), y_train=np.arange(4),
                 x_test=np.zeros((2, 8, 8), np.uint8), y_test=np.arange(2))
    first = load_device_data(path, "digits")
    device_data._load_cached.cache_clear()  # as a new ClientApp process would
    second = load_device_data(path, "digits")
    assert isinstance(second.x_train, np.memmap)
    np.testing.assert_array_equal(first.x_train, second.x_train)
    assert any((tmp_path / "cache" / "device-data").iterdir())


def test_a_changed_file_is_read_again(tmp_path):
    path = tmp_path / "p.npz"
    arrays = dict(x_train=np.zeros((4, 8, 8), np.uint8), x_test=np.zeros((2, 8, 8), np.uint8), y_test=np.arange(2))
    _save(path, y_train=np.array([0, 0, 0, 0]), **arrays)
    assert load_device_data(path, "digits").y_train.tolist() == [0, 0, 0, 0]
    stamp = path.stat().st_mtime_ns
    _save(path, y_train=np.array([1, 2, 3, 4]), **arrays)  # same size: only the time tells them apart
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))
    assert load_device_data(path, "digits").y_train.tolist() == [1, 2, 3, 4]


def test_rgb_nhwc_pixels_are_converted_to_the_models_shape_and_normalised(tmp_path):
    x = np.full((3, 32, 32, 3), 200, np.uint8)
    path = _save(tmp_path / "rgb.npz", x_train=x, y_train=np.array([0, 1, 2]), x_test=x[:1], y_test=np.array([9]),
                 true_group=np.int64(2))
    data = load_device_data(path, "digits")
    assert data.x_train.shape == (3, 1, 8, 8) and data.x_train.dtype == np.float32
    (mean,), (std,) = CHANNEL_STATS["digits"]
    np.testing.assert_allclose(data.x_train, (200 / 255 - mean) / std, rtol=1e-5)
    assert data.true_group == 2 and data.num_classes == 10 and data.input_shape == (1, 8, 8)
    grey = load_device_data(_save(tmp_path / "g.npz", x_train=np.full((2, 28, 28), 10, np.uint8),
                                  y_train=np.array([0, 1]), x_test=np.full((1, 28, 28), 10, np.uint8),
                                  y_test=np.array([1])), "cifar10")
    assert grey.x_train.shape == (2, 3, 32, 32)
    expected = [(10 / 255 - m) / s for m, s in zip(*CHANNEL_STATS["cifar10"])]
    np.testing.assert_allclose(grey.x_train[0, :, 5, 5], expected, rtol=1e-5)
    assert grey.true_group == device_data.UNKNOWN_GROUP


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"y_train": np.array([0, 10])}, r"label ids 0\.\.10 outside 0\.\.9"),
        ({"x_train": np.zeros((2, 5, 7, 9), np.uint8)}, r"shape \(2, 5, 7, 9\) cannot be read"),
        ({"x_test": np.zeros((0, 8, 8), np.uint8), "y_test": np.zeros(0, np.int64)}, "split is empty"),
        ({"y_train": np.array([0, 1, 2])}, "do not match 2 images"),
        ({"x_train": np.zeros((2, 3, 8, 8), np.float32)}, "normalised .float. images have 3 channels"),
        ({"true_group": np.array([1, 2])}, "true_group must be one integer"),
    ],
)
def test_data_that_does_not_fit_names_the_file_and_the_mismatch(tmp_path, change, message):
    arrays = dict(x_train=np.zeros((2, 8, 8), np.uint8), y_train=np.array([0, 1]),
                  x_test=np.zeros((1, 8, 8), np.uint8), y_test=np.array([1]))
    path = _save(tmp_path / "bad.npz", **{**arrays, **change})
    with pytest.raises(ValueError, match=message) as error:
        load_device_data(path, "digits")
    assert "bad.npz" in str(error.value)


def test_missing_arrays_and_non_npz_files_are_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"missing arrays \['x_test', 'y_test'\]"):
        load_device_data(_save(tmp_path / "half.npz", x_train=np.zeros((1, 8, 8)), y_train=np.zeros(1, int)),
                         "digits")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="notes.txt: not an .npz file"):
        load_device_data(tmp_path / "notes.txt", "digits")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_device_data(tmp_path / "absent.npz", "digits")


def _image(path, value, size=(20, 20), mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, (value,) * 3 if mode == "RGB" else value).save(path)


def test_image_folder_with_train_and_test_folders(tmp_path):
    for split, n in (("train", 3), ("test", 1)):
        for label in ("3", "7"):
            for i in range(n):
                _image(tmp_path / "imgs" / split / label / f"{i}.png", 40 * int(label) // 7)
    data = load_device_data(tmp_path / "imgs", "mnist")
    assert data.x_train.shape == (6, 1, 28, 28) and data.x_test.shape == (2, 1, 28, 28)
    assert sorted(data.y_train.tolist()) == [3, 3, 3, 7, 7, 7] and sorted(data.y_test.tolist()) == [3, 7]
    (mean,), (std,) = CHANNEL_STATS["mnist"]
    sevens = data.x_train[data.y_train == 7]
    np.testing.assert_allclose(sevens, (40 / 255 - mean) / std, rtol=1e-5)


def test_image_folder_without_splits_uses_a_seeded_test_fraction(tmp_path):
    for i in range(8):
        _image(tmp_path / "imgs" / ("cat" if i % 2 else "dog") / f"{i}.png", i, mode="L")
    first = load_device_data(tmp_path / "imgs", "digits", test_fraction=0.25, seed=1)
    assert (len(first.y_train), len(first.y_test)) == (6, 2)
    assert set(first.y_train.tolist()) | set(first.y_test.tolist()) == {0, 1}  # cat=0, dog=1 (sorted names)
    again = load_device_data(tmp_path / "imgs", "digits", test_fraction=0.25, seed=1)
    np.testing.assert_array_equal(first.x_test, again.x_test)
    with pytest.raises(ValueError, match="empty split"):
        load_device_data(tmp_path / "imgs", "digits", test_fraction=0.01, seed=1)


def test_image_folder_class_beyond_the_models_classes_is_rejected(tmp_path):
    _image(tmp_path / "imgs" / "train" / "12" / "a.png", 1)
    _image(tmp_path / "imgs" / "test" / "12" / "a.png", 1)
    with pytest.raises(ValueError, match=r"imgs: class folders \['12'\] give label ids >= 10"):
        load_device_data(tmp_path / "imgs", "digits")


def _profile(node_config):
    content = RecordDict({protocol.CONFIG: _config_record(DIGITS)})
    message = Message(content, dst_node_id=7, message_type=protocol.PROFILE_QUERY)
    message.metadata.__dict__["_message_id"] = "m1"
    return client_app.app(message, _context(node_config))


def test_client_with_data_path_never_loads_the_shared_data_set(tmp_path, monkeypatch):
    x = np.zeros((5, 8, 8), np.uint8)
    path = _save(tmp_path / "mine.npz", x_train=x, y_train=np.array([1, 1, 2, 2, 2]), x_test=x[:2],
                 y_test=np.array([1, 2]), true_group=np.int64(4))

    def no_shared_data(*args, **kwargs):
        raise AssertionError("the shared data set was loaded")

    monkeypatch.setattr(client_app, "build_partition", no_shared_data)
    client_app._partition.cache_clear()
    client_app._load_client_data.cache_clear()
    reply = _profile({"data-path": str(path), "client-key": "pi-03"})
    assert reply.content[protocol.METRICS]["num-examples"] == 5
    assert dict(reply.content[protocol.CLIENT]) == {"client-key": "pi-03", "true-group": 4,
                                                    protocol.CAPABILITIES_KEY: ["profile", "label-stats", "multi-model"]}
    keyless = _profile({"data-path": str(path)})
    assert keyless.content[protocol.CLIENT]["client-key"] == f"data-{file_sha256(path)[:16]}"


def test_client_needs_a_data_path_or_a_partition_id():
    with pytest.raises(ValueError, match="neither 'data-path' nor 'partition-id'"):
        client_app.client_identity({"client-key": "pi-03"})
    assert client_app.client_identity({"partition-id": 2}) == (2, "2")
