"""Checkpoints: the full state of a run after a round, written atomically, read back with
checks, so that a resumed run continues exactly where the interrupted one stopped.

File layout: a fixed magic line, the SHA-256 of the payload, then the payload (a pickle
of plain data: the algorithm's state, the runner's membership and cumulative metrics, the
recorder's rows, RNG states). The checksum turns a truncated or corrupted file into a
clear refusal instead of a half-restored run. Pickle runs code when loaded: load only
checkpoints your own runs wrote.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

MAGIC = b"clusterfed-checkpoint v1\n"
FILENAME = "checkpoint.pkl"
# config keys a resumed run may change: they do not decide what the algorithm computes
RESUMABLE_CHANGES = frozenset({"rounds", "out-dir", "resume-from", "timeout", "checkpoint"})


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; nothing was changed."""


def checkpoint_path(directory: str | Path) -> Path:
    path = Path(directory)
    return path / FILENAME if path.is_dir() or path.suffix != ".pkl" else path


def save_checkpoint(directory: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``directory/checkpoint.pkl`` atomically (temporary file, then rename)."""
    path = checkpoint_path(directory)
    payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    digest = hashlib.sha256(payload).digest()
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(MAGIC + digest + payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(directory: str | Path) -> dict[str, Any]:
    """The state saved by ``save_checkpoint``, or CheckpointError saying why not."""
    path = checkpoint_path(directory)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror or error}") from None
    if not data.startswith(MAGIC):
        raise CheckpointError(f"{path} is not a clusterfed checkpoint")
    digest, payload = data[len(MAGIC):len(MAGIC) + 32], data[len(MAGIC) + 32:]
    if len(digest) < 32 or hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"{path} is truncated or corrupt (checksum mismatch)")
    try:
        state = pickle.loads(payload)
    except Exception as error:  # a payload that passed the checksum but will not load
        raise CheckpointError(f"{path} could not be read: {type(error).__name__}: {error}") from None
    if not isinstance(state, dict) or "round" not in state:
        raise CheckpointError(f"{path} holds no run state")
    return state


def check_compatible(state: dict[str, Any], config: dict[str, Any], shapes: dict[str, tuple]) -> None:
    """Refuse a checkpoint of another strategy, model, data setting or seed."""
    saved = state.get("config", {})
    problems = []
    if saved.get("strategy") != config.get("strategy"):
        problems.append(f"it is a {saved.get('strategy')!r} run, this run is {config.get('strategy')!r}")
    saved_shapes = state.get("model_shapes")
    if saved_shapes != shapes:
        problems.append("its model differs (array names or shapes)")
    changed = sorted(k for k in set(saved) | set(config)
                     if k not in RESUMABLE_CHANGES and k != "strategy" and saved.get(k) != config.get(k))
    if changed:
        problems.append("these config keys differ: " + ", ".join(
            f"{k} ({saved.get(k)!r} in the checkpoint, {config.get(k)!r} now)" for k in changed))
    if state["round"] >= int(config.get("rounds", 0)):
        problems.append(f"it already holds round {state['round']} of {config.get('rounds')} (raise rounds to go on)")
    if problems:
        raise CheckpointError("cannot resume from this checkpoint: " + "; ".join(problems))
