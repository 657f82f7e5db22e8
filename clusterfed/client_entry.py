"""The ClientApp Flower loads (``clientapp`` in pyproject.toml): the built-in task by its import path.

In a simulation (Ray actors or the in-process grid) a process serves many messages, so the
messages are answered in this process by ``clusterfed.client_app.TASK``. On a device, Flower
1.41 starts one ``flwr-clientapp`` process per message; there each message is handed to a warm
worker (``clusterfed.client_worker``) that keeps torch and the data loaded, so this module
imports only flwr and numpy. Node config ``warm-worker``: ``"auto"`` (default: a worker exactly
when this is such a one-message process), ``true`` or ``false``; ``warm-worker-idle`` (seconds,
default 900) is how long the worker waits for the next message before it exits.

A user's own task gets the same with ``clusterfed.client.client_app("package.module:task")``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from clusterfed import faults
from clusterfed.client.app import client_app, uses_warm_worker

BUILTIN_TASK = "clusterfed.client_app:TASK"
NPZ_ARRAYS = ("x_train", "y_train", "x_test", "y_test")  # as clusterfed.datasets.device_data reads them


def check_node_data(context) -> None:
    """The built-in task's cheap test of a node's ``data-path``, run in this light process
    before a message is handed to a warm worker (so a device with a broken file never starts
    one): the path exists, and an ``.npz`` file is a zip holding the four arrays with readable
    headers and non-empty training data. Only headers are read. Raises ValueError or
    FileNotFoundError naming the file; the full checks are the loader's."""
    data_path = str(context.node_config.get("data-path", ""))
    if not data_path:
        return
    path = Path(data_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"data-path {str(path)!r} does not exist")
    if path.is_dir():
        return
    shapes = {}
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            missing = [name for name in NPZ_ARRAYS if f"{name}.npy" not in names]
            if missing:
                raise ValueError(f"it lacks the arrays {missing}")
            for name in NPZ_ARRAYS:
                with archive.open(f"{name}.npy") as member:
                    version = np.lib.format.read_magic(member)
                    header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                              else np.lib.format.read_array_header_2_0)
                    shapes[name] = header(member)[0]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as error:
        raise ValueError(f"data-path {str(path)!r} is not a readable .npz with arrays "
                         f"{', '.join(NPZ_ARRAYS)} ({error})") from None
    if not shapes["x_train"] or shapes["x_train"][0] == 0 or shapes["y_train"][:1] != shapes["x_train"][:1]:
        raise ValueError(f"data-path {str(path)!r}: x_train {shapes['x_train']} and y_train {shapes['y_train']} "
                         "need the same, non-zero number of examples")


# secure_aggregation: the SecAgg+ mod (clusterfed.secagg) answers a secure round's stages on the
# device and passes every other message through unchanged, as in the in-process app
app = client_app(BUILTIN_TASK, mods=[faults.inject_faults], check=check_node_data, secure_aggregation=True)

__all__ = ["BUILTIN_TASK", "app", "check_node_data", "uses_warm_worker"]
