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

from clusterfed import faults
from clusterfed.client.app import client_app, uses_warm_worker

BUILTIN_TASK = "clusterfed.client_app:TASK"

app = client_app(BUILTIN_TASK, mods=[faults.inject_faults])

__all__ = ["BUILTIN_TASK", "app", "uses_warm_worker"]
