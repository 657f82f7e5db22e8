"""A device's own data: the files a SuperNode's node config names with ``data-path``.

Two layouts are read, both without the data set's global pool:

* an ``.npz`` file with ``x_train, y_train, x_test, y_test`` and optionally a scalar
  ``true_group`` (what ``clusterfed partition`` writes);
* a folder in torchvision ``ImageFolder`` layout: class sub-folders (``0/``, ``1/``, ... or
  any names) either under ``train/`` and ``test/``, or directly in the folder, in which case
  a seeded ``test-fraction`` of the images becomes the test split.

Images are brought to the model's input shape of the run's data set (``shapes.py``):
``(N, H, W)`` gains a channel axis, ``(N, H, W, C)`` becomes ``(N, C, H, W)``, RGB becomes
grey (ITU-R 601 luma) or grey is repeated to RGB, and other sizes are resized bilinearly.
Integer images are 8-bit pixels: they are scaled to [0, 1] and normalised per channel with
the data set's fixed statistics (``CHANNEL_STATS``). Floating-point images are taken as
already normalised (as exported by ``clusterfed partition``) and only reshaped.

The converted arrays are written once as uncompressed ``.npy`` files to a cache folder and
memory-mapped from there, so a ClientApp process (deployment starts one per message) does
not decode or convert the files again, and large data need not fit in memory. Within a
process, results are cached by path, modification time and conversion settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .shapes import DATASET_SHAPES
from .sources import BUILT_IN

NPZ_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
TRUE_GROUP = "true_group"
UNKNOWN_GROUP = -1

# Per-channel mean and std of images scaled to [0, 1], used to normalise raw pixels (each
# data set's ``channel_stats``).
CHANNEL_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    name: dataset.channel_stats for name, dataset in BUILT_IN.items()}

_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)
_CACHE_FORMAT = 1


@dataclass(frozen=True, eq=False)
class DeviceData:
    x_train: np.ndarray  # float32 (N, C, H, W), normalised
    y_train: np.ndarray  # int64 (N,)
    x_test: np.ndarray
    y_test: np.ndarray
    true_group: int  # UNKNOWN_GROUP when the file does not say
    num_classes: int
    input_shape: tuple[int, int, int]


def cache_dir() -> Path:
    """Where converted copies go: ``$CLUSTERFED_CACHE_DIR``, else ``$XDG_CACHE_HOME/clusterfed``
    (``~/.cache/clusterfed``)."""
    if os.environ.get("CLUSTERFED_CACHE_DIR"):
        return Path(os.environ["CLUSTERFED_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "clusterfed"


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_fingerprint(path: str | os.PathLike) -> str:
    """sha256 of a data file, or of a folder's relative file names and contents."""
    root = Path(path).expanduser()
    if not root.is_dir():
        return file_sha256(root)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(root).as_posix()}\0{file_sha256(file)}\0".encode())
    return digest.hexdigest()


def load_device_data(path: str | os.PathLike, dataset: str, *, test_fraction: float = 0.2,
                     seed: int = 0) -> DeviceData:
    """Load a device's data for a run on `dataset` (cached per process and on disk).

    Raises FileNotFoundError if `path` does not exist and ValueError, naming the file, if
    its content does not fit the data set's model (shape, labels, empty split).
    """
    if dataset not in DATASET_SHAPES:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of: {', '.join(DATASET_SHAPES)}")
    resolved = Path(path).expanduser().resolve()
    if not resolved.exists():
        raise FileNotFoundError(f"data-path {str(resolved)!r} does not exist")
    if resolved.is_dir():
        stamp = _folder_stamp(resolved)
        fraction = float(test_fraction)
        seed = int(seed)
    else:
        info = resolved.stat()
        stamp = (info.st_mtime_ns, info.st_size)
        fraction, seed = 0.0, 0  # a file carries its own split
    return _load_cached(str(resolved), stamp, dataset, fraction, seed)


@lru_cache(maxsize=16)
def _load_cached(path: str, stamp: tuple, dataset: str, test_fraction: float, seed: int) -> DeviceData:
    key = hashlib.sha256(repr((_CACHE_FORMAT, path, stamp, dataset, test_fraction, seed)).encode()).hexdigest()[:32]
    folder = cache_dir() / "device-data" / key
    arrays = _read_cache(folder)
    if arrays is None:
        arrays = _convert(Path(path), dataset, test_fraction, seed)
        if _write_cache(folder, arrays):
            arrays = _read_cache(folder) or arrays
    shape, num_classes = DATASET_SHAPES[dataset]
    group = int(arrays.pop(TRUE_GROUP))
    return DeviceData(**arrays, true_group=group, num_classes=num_classes, input_shape=shape)


def _read_cache(folder: Path) -> dict | None:
    meta = folder / "meta.json"
    if not meta.is_file():
        return None
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="c") for name in NPZ_ARRAYS}
    arrays[TRUE_GROUP] = json.loads(meta.read_text())[TRUE_GROUP]
    return arrays


def _write_cache(folder: Path, arrays: dict) -> bool:
    """Write the converted arrays atomically; False (data stays in memory) if not writable."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
        for name in NPZ_ARRAYS:
            np.save(tmp / f"{name}.npy", arrays[name])
        (tmp / "meta.json").write_text(json.dumps({TRUE_GROUP: int(arrays[TRUE_GROUP])}))
        try:
            tmp.rename(folder)
        except OSError:  # another process wrote it first
            shutil.rmtree(tmp, ignore_errors=True)
        return True
    except OSError:
        return False


def _folder_stamp(root: Path) -> tuple:
    files = [p for p in root.rglob("*") if p.is_file()]
    return (len(files), max((p.stat().st_mtime_ns for p in files), default=0), sum(p.stat().st_size for p in files))


def _convert(path: Path, dataset: str, test_fraction: float, seed: int) -> dict:
    if path.is_dir():
        splits = _read_image_folder(path, dataset, test_fraction, seed)
        group = UNKNOWN_GROUP
    else:
        splits, group = _read_npz(path)
    shape, num_classes = DATASET_SHAPES[dataset]
    out: dict = {TRUE_GROUP: group}
    for split in ("train", "test"):
        x, y = splits[split]
        out[f"x_{split}"] = to_model_input(x, dataset, where=f"{path} (x_{split})")
        out[f"y_{split}"] = _check_labels(y, len(out[f"x_{split}"]), num_classes, where=f"{path} (y_{split})")
    return out


def _read_npz(path: Path) -> tuple[dict, int]:
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not an .npz file; data-path must be an .npz file or an ImageFolder folder")
    with np.load(path, allow_pickle=False) as npz:
        missing = [name for name in NPZ_ARRAYS if name not in npz.files]
        if missing:
            raise ValueError(f"{path}: missing arrays {missing}; an .npz data-path needs {list(NPZ_ARRAYS)}")
        splits = {split: (npz[f"x_{split}"], npz[f"y_{split}"]) for split in ("train", "test")}
        group = UNKNOWN_GROUP
        if TRUE_GROUP in npz.files:
            value = npz[TRUE_GROUP]
            if value.size != 1 or not np.issubdtype(value.dtype, np.integer):
                raise ValueError(f"{path}: true_group must be one integer, got {value.dtype} {value.shape}")
            group = int(value.reshape(()))
    return splits, group


def to_model_input(x: np.ndarray, dataset: str, *, where: str) -> np.ndarray:
    """Images of any supported layout -> float32 (N, C, H, W) as `dataset`'s model expects."""
    (channels, height, width), _ = DATASET_SHAPES[dataset]
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[:, None, :, :]
    elif x.ndim == 4 and x.shape[1] not in (1, 3) and x.shape[3] in (1, 3):
        x = x.transpose(0, 3, 1, 2)  # NHWC -> NCHW
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"{where}: images of shape {x.shape} cannot be read as (N, H, W), (N, C, H, W) "
                         f"or (N, H, W, C) with 1 or 3 channels; the {dataset} model takes "
                         f"({channels}, {height}, {width})")
    if len(x) == 0:
        raise ValueError(f"{where}: the split is empty")
    raw = np.issubdtype(x.dtype, np.integer)
    if not raw and not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"{where}: images of dtype {x.dtype}; expected 8-bit integers or floats")
    if raw and (x.min() < 0 or x.max() > 255):
        raise ValueError(f"{where}: integer images must be 8-bit pixels 0..255, got {x.min()}..{x.max()}")
    x = x.astype(np.float32) / 255.0 if raw else np.asarray(x, dtype=np.float32)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{where}: images hold NaN or infinite values")
    if x.shape[1] != channels:
        if not raw:
            raise ValueError(f"{where}: normalised (float) images have {x.shape[1]} channels, the {dataset} "
                             f"model takes {channels}; give 8-bit images to have them converted")
        x = np.repeat(x, 3, axis=1) if channels == 3 else np.tensordot(x, _LUMA, axes=([1], [0]))[:, None]
    if x.shape[2:] != (height, width):
        x = _resize(x, height, width)
    if raw:
        mean, std = (np.asarray(v, dtype=np.float32)[None, :, None, None] for v in CHANNEL_STATS[dataset])
        x = (x - mean) / std
    return np.ascontiguousarray(x, dtype=np.float32)


def _resize(x: np.ndarray, height: int, width: int) -> np.ndarray:
    import torch
    from torch.nn import functional as F

    with torch.no_grad():
        out = F.interpolate(torch.from_numpy(np.ascontiguousarray(x)), size=(height, width), mode="bilinear",
                            align_corners=False, antialias=True)
    return out.numpy()


def _check_labels(y: np.ndarray, n: int, num_classes: int, *, where: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != n:
        raise ValueError(f"{where}: labels of shape {y.shape} do not match {n} images")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{where}: labels must be integers, got {y.dtype}")
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"{where}: label ids {y.min()}..{y.max()} outside 0..{num_classes - 1} "
                         f"({num_classes} classes)")
    return np.ascontiguousarray(y, dtype=np.int64)


def _read_image_folder(root: Path, dataset: str, test_fraction: float, seed: int) -> dict:
    """ImageFolder layout -> uint8 images at the model size, labels, per split."""
    from PIL import Image
    from torchvision.datasets import ImageFolder

    (channels, height, width), num_classes = DATASET_SHAPES[dataset]
    mode = "L" if channels == 1 else "RGB"
    split_roots = {"train": root / "train", "test": root / "test"}
    has_splits = all(p.is_dir() for p in split_roots.values())
    roots = list(split_roots.values()) if has_splits else [root]
    names = sorted({p.name for r in roots for p in r.iterdir() if p.is_dir()})
    if not names:
        raise ValueError(f"{root}: no class sub-folders (ImageFolder layout: <class>/<image> "
                         "or train/<class>/<image> and test/<class>/<image>)")
    # numeric folder names are the label ids; other names are numbered in sorted order
    numeric = all(name.isdigit() for name in names)
    class_to_idx = {name: int(name) if numeric else i for i, name in enumerate(names)}
    too_big = {name: idx for name, idx in class_to_idx.items() if idx >= num_classes}
    if too_big:
        raise ValueError(f"{root}: class folders {sorted(too_big)} give label ids >= {num_classes}, "
                         f"the number of classes of {dataset}")

    def loader(file: str) -> np.ndarray:
        with Image.open(file) as image:
            return np.asarray(image.convert(mode).resize((width, height), Image.Resampling.BILINEAR))

    class _Folder(ImageFolder):
        def find_classes(self, directory):
            present = sorted(p.name for p in Path(directory).iterdir() if p.is_dir())
            return present, {name: class_to_idx[name] for name in present}

    def read(folder: Path) -> tuple[np.ndarray, np.ndarray]:
        try:
            items = _Folder(str(folder), loader=loader, allow_empty=True)
        except FileNotFoundError as error:
            raise ValueError(f"{folder}: {error}") from None
        if len(items) == 0:
            raise ValueError(f"{folder}: no images found in the class folders")
        images = np.stack([items.loader(path) for path, _ in items.samples])
        return images, np.asarray(items.targets, dtype=np.int64)

    if has_splits:
        return {split: read(folder) for split, folder in split_roots.items()}
    images, labels = read(root)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"{root}: a folder without train/ and test/ is split by test-fraction, "
                         f"which must lie in (0, 1), got {test_fraction}")
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(round(test_fraction * len(labels)))
    if n_test == 0 or n_test == len(labels):
        raise ValueError(f"{root}: {len(labels)} images give an empty split at test-fraction {test_fraction}")
    test, train = order[:n_test], order[n_test:]
    return {"train": (images[train], labels[train]), "test": (images[test], labels[test])}
