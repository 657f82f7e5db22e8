"""The ClientApp Flower loads (``clientapp`` in pyproject.toml).

In a simulation (Ray actors or the in-process grid) a process serves many messages, so the
messages go straight to ``clusterfed.client_app``. On a device, Flower 1.41 starts one
``flwr-clientapp`` process per message; there each message is handed to a warm worker
(``clusterfed.client_worker``) that keeps torch and the data loaded, so this module imports
only flwr and numpy. Node config ``warm-worker``: ``"auto"`` (default: a worker exactly when
this is such a one-message process), ``true`` or ``false``; ``warm-worker-idle`` (seconds,
default 900) is how long the worker waits for the next message before it exits.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clusterfed import protocol

app = ClientApp()

# imported by Flower's `flwr-clientapp` process (one message, then exit), not by simulations
_ONE_MESSAGE_PROCESS = "flwr.supernode.runtime.run_clientapp"


def uses_warm_worker(node_config: Mapping) -> bool:
    setting = node_config.get("warm-worker", "auto")
    if isinstance(setting, bool):
        return setting
    if str(setting).lower() in ("true", "false"):
        return str(setting).lower() == "true"
    if str(setting) != "auto":
        raise ValueError(f"node config warm-worker={setting!r}: use \"auto\", true or false")
    return _ONE_MESSAGE_PROCESS in sys.modules


def _reply(msg: Message, context: Context) -> Message:
    node_config = context.node_config
    if uses_warm_worker(node_config):
        from clusterfed.client_worker import DEFAULT_IDLE_SECONDS, request

        idle = float(node_config.get("warm-worker-idle", DEFAULT_IDLE_SECONDS))
        content = request(msg.metadata.message_type, msg.content, node_config, idle_seconds=idle)
    else:
        from clusterfed.client_app import REPLIES

        content = REPLIES[msg.metadata.message_type](msg.content, node_config)
    return Message(content, reply_to=msg)


@app.query("profile")
def profile(msg: Message, context: Context) -> Message:
    return _reply(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return _reply(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return _reply(msg, context)
