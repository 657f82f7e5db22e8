"""Checkpoints: the full state of a run after a round, written atomically, read back with
checks, so that a resumed run continues exactly where the interrupted one stopped.

Format (version 2): two files in the run's folder, read without pickle, so loading a
checkpoint someone else wrote cannot run code.

- ``checkpoint-<first 16 hex digits of its SHA-256>.npz``: every numpy array of the state,
  named ``a0``, ``a1``, ... (an uncompressed zip of ``.npy`` files with fixed timestamps,
  read with ``np.load(..., allow_pickle=False)``).
- ``checkpoint.json``: ``{"format": "clusterfed-checkpoint", "format_version": 2, "npz":
  {"file", "sha256", "arrays"}, "sha256": ..., "state": ...}``. ``state`` is the run's
  state as ``clusterfed.runner.state_codec`` writes it (arrays replaced by references into
  the npz); ``sha256`` is that of the canonical JSON of everything else in the document.

Writing: the npz goes to a temporary file, is fsynced and renamed to its content-derived
name, then the JSON the same way; the JSON is written last and names the npz and its
digest, and the previous round's npz is deleted only after that. Killed at any moment, the
folder holds a complete old or a complete new checkpoint; a half-copied folder (a JSON
whose npz is missing or differs) is refused, not half-restored.

Checkpoints of version 1 (``checkpoint.pkl``, a pickle) are recognised by their first line
and refused without being unpickled.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
import zipfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from clusterfed.runner import state_codec
from clusterfed.runner.canonical_json import dumps_json, loads_json
from clusterfed.runner.state_rules import DecodeError

FORMAT = "clusterfed-checkpoint"
VERSION = 2
FILENAME = "checkpoint.json"
ARRAYS_NAME = re.compile(r"checkpoint-[0-9a-f]{16}\.npz")
# the first bytes of every checkpoint.json this module writes (canonical JSON, sorted keys)
HEAD = b'{"format":"clusterfed-checkpoint",'
# version 1: a pickle behind a magic line; recognised, never loaded
OLD_FILENAME = "checkpoint.pkl"
OLD_MAGIC = b"clusterfed-checkpoint v1\n"
# config keys a resumed run may change: they do not decide what the algorithm computes
RESUMABLE_CHANGES = frozenset({"rounds", "out-dir", "resume-from", "timeout", "checkpoint", "log-to"})
# keys added with a default other than what the version before them did (by the key's last
# part): a checkpoint without the key resumes only at this value, the way it was running
EARLIER_BEHAVIOUR = {
    "split-timing": "criteria",  # the CFL family split on Sattler's criteria
    "ask-again": False,  # a deferred split's repliers were not asked again
    "decision-arrays": "every",  # CFL compared the whole update
    "same-round-splits": False,  # a split's children waited for the next round
    "cluster-all-active": False,  # FedClust's and AdaCFL's clustering step asked the round's sample only
    "split-min-repliers": 0,  # the CFL family trained the sample only
    "revisit-rounds": 1,  # FedClust's and AdaCFL's revisits cut one round's repliers only
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; nothing was changed."""


def checkpoint_path(directory: str | Path) -> Path:
    """The checkpoint's JSON file: ``directory/checkpoint.json``, or ``directory`` itself
    when it names a ``.json`` file."""
    path = Path(directory)
    return path / FILENAME if path.is_dir() or path.suffix != ".json" else path


# ---------------------------------------------------------------------- writing
def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_temporary(folder: Path, write) -> Path:
    """A new temporary file in ``folder`` filled by ``write(handle)`` and fsynced."""
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _write_npz(handle, arrays: dict[str, np.ndarray]) -> None:
    """An .npz np.load reads, with fixed timestamps: the same arrays give the same bytes."""
    with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _document_digest(document: dict[str, Any]) -> str:
    return hashlib.sha256(dumps_json({k: v for k, v in document.items() if k != "sha256"})).hexdigest()


def save_checkpoint(directory: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``directory/checkpoint.json`` and its arrays to
    ``directory/checkpoint-<digest>.npz``, atomically; returns the JSON's path. TypeError
    (naming where) for a value the codec cannot store, before anything is written."""
    path = checkpoint_path(directory)
    folder = path.parent
    tree, arrays = state_codec.encode(state)
    tmp = _write_temporary(folder, lambda handle: _write_npz(handle, arrays))
    try:
        digest = _sha256_file(tmp)
        npz_name = f"checkpoint-{digest[:16]}.npz"
        os.replace(tmp, folder / npz_name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    document = {"format": FORMAT, "format_version": VERSION,
                "npz": {"file": npz_name, "sha256": digest, "arrays": len(arrays)}, "state": tree}
    document["sha256"] = _document_digest(document)
    text = dumps_json(document) + b"\n"
    tmp = _write_temporary(folder, lambda handle: handle.write(text))
    try:
        _fsync_folder(folder)  # the npz's name is durable before the JSON that names it
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(folder)
    for old in folder.glob("checkpoint-*.npz"):  # earlier rounds' arrays, and orphans of a killed write
        if old.name != npz_name and ARRAYS_NAME.fullmatch(old.name):
            old.unlink(missing_ok=True)
    return path


# ---------------------------------------------------------------------- reading
def _refuse_old(path: Path) -> None:
    """Always raises: ``path`` is a version-1 pickle checkpoint, or some other file. Reads
    its first line only; it is never unpickled."""
    try:
        with path.open("rb") as handle:
            head = handle.read(len(OLD_MAGIC))
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror or error}") from None
    if head == OLD_MAGIC:
        raise CheckpointError(
            f"{path} is an old pickle checkpoint (format version 1); this version of clusterfed will not "
            "load it, because unpickling a file can run arbitrary code. Restart the run (without "
            "resume-from), or finish it with the clusterfed version that wrote the checkpoint")
    raise CheckpointError(f"{path} is not a clusterfed checkpoint")


def _read_document(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror or error}") from None
    try:
        document = loads_json(data)
    except (ValueError, RecursionError):
        if data.startswith(HEAD):
            raise CheckpointError(f"{path} is truncated or corrupt (it is not valid JSON)") from None
        raise CheckpointError(f"{path} is not a clusterfed checkpoint") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a clusterfed checkpoint")
    version = document.get("format_version")
    if version != VERSION:
        raise CheckpointError(f"{path} is a clusterfed checkpoint of format version {version!r}; this version of "
                              f"clusterfed reads format version {VERSION} only")
    if document.get("sha256") != _document_digest(document):
        raise CheckpointError(f"{path} is truncated or corrupt (checksum mismatch)")
    return document


def _read_arrays(path: Path, npz: Any) -> dict[str, np.ndarray]:
    if not isinstance(npz, dict) or not isinstance(npz.get("file"), str) or not ARRAYS_NAME.fullmatch(npz["file"]) \
            or not isinstance(npz.get("sha256"), str):
        raise CheckpointError(f"{path} is not a clusterfed checkpoint (no valid array file entry)")
    npz_path = path.parent / npz["file"]
    try:
        blob = npz_path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"{path} names its arrays file {npz['file']}, which cannot be read "
                              f"({error.strerror or error}): a half-written or partly copied checkpoint") from None
    if hashlib.sha256(blob).hexdigest() != npz["sha256"]:
        raise CheckpointError(f"{npz_path} is truncated or corrupt (checksum mismatch)")
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except Exception as error:  # passed the checksum, yet not an npz of plain arrays
        raise CheckpointError(f"{npz_path} could not be read: {type(error).__name__}: {error}") from None
    if len(arrays) != npz.get("arrays"):
        raise CheckpointError(f"{npz_path} holds {len(arrays)} arrays, {path} says {npz.get('arrays')!r}")
    return arrays


def load_checkpoint(directory: str | Path) -> dict[str, Any]:
    """The state saved by ``save_checkpoint``, or CheckpointError saying why not
    (unreadable, not a checkpoint, truncated/corrupt, another format version, an old
    pickle checkpoint, a class or value the codec refuses)."""
    given = Path(directory)
    if given.suffix == ".pkl" and not given.is_dir():
        _refuse_old(given)
    path = checkpoint_path(given)
    if not path.exists() and given.is_dir() and (given / OLD_FILENAME).is_file():
        _refuse_old(given / OLD_FILENAME)
    document = _read_document(path)
    arrays = _read_arrays(path, document.get("npz"))
    try:
        state = state_codec.decode(document.get("state"), arrays)
    except DecodeError as error:
        raise CheckpointError(f"{path} is refused: {error}") from None
    except (RecursionError, TypeError, ValueError, KeyError, AttributeError) as error:  # a malformed tree
        raise CheckpointError(f"{path} could not be read: {type(error).__name__}: {error}") from None
    if not isinstance(state, dict) or "round" not in state:
        raise CheckpointError(f"{path} holds no run state")
    return state


def difference(saved: dict[str, Any], config: dict[str, Any], key: str) -> str:
    """``key (A in the checkpoint, B now)``; for a key the checkpoint predates whose default
    changed, what its version did and the value that resumes it."""
    earlier = EARLIER_BEHAVIOUR.get(key.rsplit(".", 1)[-1])
    if key not in saved and earlier is not None:
        return (f"{key} ({config.get(key)!r} now; the checkpoint predates the key and ran as {earlier!r}: "
                f"set {key} = {earlier!r} to resume it)")
    return f"{key} ({saved.get(key)!r} in the checkpoint, {config.get(key)!r} now)"


def check_compatible(state: dict[str, Any], config: dict[str, Any], shapes: dict[str, tuple],
                     defaults: dict[str, Any] | None = None) -> None:
    """Refuse a checkpoint of another strategy, model, data setting or seed. ``defaults``: the
    flat config's default values; a key the checkpoint's config lacks is accepted at its default."""
    saved = state.get("config", {})
    problems = []
    if saved.get("strategy") != config.get("strategy"):
        problems.append(f"it is a {saved.get('strategy')!r} run, this run is {config.get('strategy')!r}")
    saved_shapes = state.get("model_shapes")
    if saved_shapes != shapes:
        problems.append("its model differs (array names or shapes)")
    # a key added to the schema since the checkpoint was written is no change while it holds
    # its default: what the earlier version did without the key
    added_at_default = {k for k in set(config) - set(saved) if defaults is not None and k in defaults
                        and config[k] == EARLIER_BEHAVIOUR.get(k.rsplit(".", 1)[-1], defaults[k])}
    changed = sorted(k for k in set(saved) | set(config)
                     if k not in RESUMABLE_CHANGES | added_at_default and k != "strategy" and saved.get(k) != config.get(k))
    if changed:
        problems.append("these config keys differ: " + ", ".join(map(partial(difference, saved, config), changed)))
    if state["round"] >= int(config.get("rounds", 0)):
        problems.append(f"it already holds round {state['round']} of {config.get('rounds')} (raise rounds to go on)")
    if problems:
        raise CheckpointError("cannot resume from this checkpoint: " + "; ".join(problems))
