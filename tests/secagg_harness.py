"""A small federation for the secure-aggregation tests: stock Message-API ClientApps with the
real ``secagg_mod``, real Flower Messages, and every message taken through Flower's protobuf
serialisation both ways (what crosses the wire, and its size), driven by ``run_groups``.

No training: a client's "trained" model is the model it was sent plus a fixed offset of its
own, and its weight is a fixed num-examples, so the plain weighted mean is known exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.supercore.task_identity import TaskIdentity

from clusterfed.secagg import wire

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


def model(seed: int, sizes: tuple[int, ...] = (6, 40, 10)) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {f"layer{i}.w": rng.normal(0, 0.5, size).astype(np.float32) for i, size in enumerate(sizes)}
    arrays["steps"] = np.array(seed, dtype=np.int64)  # a 0-d integer buffer
    return arrays


def trained(sent: Mapping[str, np.ndarray], key: str) -> dict[str, np.ndarray]:
    """What client ``key`` returns: the sent model moved by an offset of its own."""
    rng = np.random.default_rng(list(key.encode()))
    return {name: (value + rng.normal(0, 0.1, value.shape)).astype(value.dtype) if value.dtype.kind == "f"
            else np.asarray(value + 1) for name, value in sent.items()}


def weight(key: str) -> int:
    return 10 + sum(map(ord, key)) % 50


def make_app(trained_fn: Callable = trained) -> ClientApp:
    from clusterfed.secagg import secagg_mod

    app = ClientApp(mods=[secagg_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:  # a stock Message-API train function
        sent = {name: array.numpy() for name, array in msg.content["arrays"].items()}
        key = context.node_config["client-key"]
        arrays = ArrayRecord({name: Array(value) for name, value in trained_fn(sent, key).items()})
        metrics = MetricRecord({"num-examples": weight(key), "train-loss": 0.25})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return app


def over_the_wire(content: RecordDict) -> tuple[RecordDict, int]:
    data = recorddict_to_proto(content).SerializeToString()
    proto = type(recorddict_to_proto(RecordDict()))()
    proto.ParseFromString(data)
    return recorddict_from_proto(proto), len(data)


class Federation:
    """Clients by key (node ids 100, 101, ...); ``models``: each group's model; ``drop``:
    (member, stage) pairs that do not answer; ``wire_bytes``: stage -> member -> (down, up)."""

    def __init__(self, keys: list[str], models: Mapping[object, Mapping[str, np.ndarray]],
                 drop: set[tuple[str, str]] = frozenset(), app: ClientApp | None = None) -> None:
        self.app = app or make_app()
        self.node = {key: 100 + i for i, key in enumerate(keys)}
        self.contexts = {key: Context(run_id=1, node_id=self.node[key], node_config={"client-key": key},
                                      state=RecordDict(), run_config={}) for key in keys}
        self.models, self.drop = models, set(drop)
        self.wire_bytes: dict[str, dict[str, tuple[int, int]]] = {}
        self.received: list[RecordDict] = []  # every reply content the server side was handed

    def exchange(self, stage: str, asks: dict[object, dict[str, dict]]) -> dict[object, dict[str, dict | None]]:
        replies: dict[object, dict[str, dict | None]] = {}
        for group, by_member in asks.items():
            replies[group] = {}
            for member, ask in by_member.items():
                replies[group][member] = self._one(stage, group, member, ask)
        return replies

    def _one(self, stage: str, group: object, member: str, ask: dict) -> dict | None:
        train = None
        if stage == wire.COLLECT:
            arrays = ArrayRecord({name: Array(value) for name, value in self.models[group].items()})
            train = RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": 1})})
        content, down = over_the_wire(wire.ask_content(ask, train))
        if (member, stage) in self.drop:
            return None
        msg = Message(content, dst_node_id=self.node[member], message_type=MessageType.TRAIN, group_id="1")
        try:
            reply = self.app(msg, self.contexts[member])
        except Exception:  # noqa: BLE001  (a raising client is an error reply: dropped)
            return None
        if reply.has_error():
            return None
        received, up = over_the_wire(reply.content)
        self.wire_bytes.setdefault(stage, {})[member] = (down, up)
        self.received.append(received)
        return wire.reply_from_content(received)


def plain_mean(models: list[Mapping[str, np.ndarray]], weights: list[int]) -> dict[str, np.ndarray]:
    total = sum(weights)
    return {name: sum(w * m[name].astype(np.float64) for m, w in zip(models, weights)) / total for name in models[0]}
