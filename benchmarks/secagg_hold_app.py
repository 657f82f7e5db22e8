"""The ClientApp of the deployed secure-aggregation check: the app a device runs
(``clusterfed.client_entry:app``, the built-in task with ``secagg_mod``), plus one test-only hook
that lets the check kill a SuperNode at an exact point of the protocol.

The hook is off unless the SuperNode's node config names it:
``hold-at-stage="collect" hold-from-round=3 hold-marker="/tmp/.../dev-5.held"``. The first
train message of that secure-aggregation stage at or after that round (the ask to upload the
masked vector: the device has already sent its public keys and its encrypted shares, and
holds its neighbours' shares) is not answered: the hook writes the marker file (the stage,
the session, the round and this process's id) and waits. The check sees the marker and
SIGKILLs the SuperNode's process group and this process, as a power cut would; nothing of
the masked upload ever leaves the device. Without the kill the hook gives up after
``hold-seconds`` (default 900) and fails the message, so a forgotten hold cannot hang forever.

Every other message (every message of every other device) goes to the stock app untouched.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clusterfed.client_entry import app as STOCK  # what pyproject.toml's clientapp names
from clusterfed.secagg import wire


def _round_of(msg: Message) -> int | None:
    """The server round: the train config's ``server-round``, else the message's group id
    (clusterfed's driver sends every message of a round with the round as its group id)."""
    config = msg.content.get("config") if "config" in msg.content else None
    value = config.get("server-round") if config is not None else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    group = msg.metadata.group_id
    return int(group) if group and group.isdigit() else None


def held_stage(msg: Message, node_config: dict) -> dict | None:
    """What the hook holds this message for (stage, session, round), or None to pass it on."""
    stage = node_config.get("hold-at-stage")
    if not stage or msg.metadata.message_type.split(".")[0] != "train" or wire.RECORD not in msg.content:
        return None
    ask = msg.content[wire.RECORD]
    if ask.get("stage") != stage:
        return None
    server_round = _round_of(msg)
    if server_round is not None and server_round < int(node_config.get("hold-from-round", 0)):
        return None
    return {"stage": stage, "session": str(ask.get("session")), "round": server_round}


class HoldMidProtocol(ClientApp):
    """The stock app, with the hook in front of it (a ClientApp, so Flower loads it as one)."""

    def __init__(self, inner: ClientApp) -> None:
        super().__init__()
        self._inner = inner

    def __call__(self, message: Message, context: Context) -> Message:
        held = held_stage(message, dict(context.node_config))
        if held is None:
            return self._inner(message, context)
        marker = Path(str(context.node_config["hold-marker"]))
        marker.write_text(json.dumps({**held, "pid": os.getpid(), "node_id": context.node_id}) + "\n")
        deadline = time.monotonic() + float(context.node_config.get("hold-seconds", 900))
        while time.monotonic() < deadline:
            time.sleep(0.5)
        raise RuntimeError(f"held at {held['stage']} for {context.node_config.get('hold-seconds', 900)} s and "
                           "never killed: the check did not see the marker")


app = HoldMidProtocol(STOCK)
