"""ClientApp: trains and evaluates the model it is sent on its own data.

The same app runs in simulation (one virtual SuperNode per partition) and on a device
(a SuperNode started with ``--node-config 'partition-id=3 client-key="pi-03"'``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clusterfed import faults, protocol
from clusterfed.clustering.entropy import label_entropy, num_classes_present
from clusterfed.datasets import client_arrays, load_source, make_partition
from clusterfed.models import build_model
from clusterfed.training import cap_threads, evaluate, load_numpy_state, pick_device, state_to_numpy, train

app = ClientApp()

# the spec keys that decide the partition (model, batch size, device do not)
_PARTITION_KEYS = ("dataset", "data-dir", "partitioner", "num-clients", "num-groups", "alpha", "beta",
                   "labels-per-client", "label-groups", "rotations", "min-samples", "test-fraction", "seed")


@dataclass(frozen=True)
class ClientData:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    true_group: int
    num_classes: int
    input_shape: tuple[int, int, int]


@lru_cache(maxsize=8)
def _partition(spec_items: tuple):
    # cached per process: a simulation actor serves many virtual clients of one run
    spec = dict(spec_items)
    source = load_source(str(spec["dataset"]), str(spec["data-dir"]) or None)
    return source, make_partition(
        source.y,
        source.num_classes,
        name=str(spec["partitioner"]),
        num_clients=int(spec["num-clients"]),
        num_groups=int(spec["num-groups"]),
        alpha=float(spec["alpha"]),
        beta=float(spec["beta"]),
        labels_per_client=int(spec["labels-per-client"]),
        label_groups=str(spec["label-groups"]),
        rotations=str(spec["rotations"]),
        min_samples=int(spec["min-samples"]),
        test_fraction=float(spec["test-fraction"]),
        seed=int(spec["seed"]),
    )


@lru_cache(maxsize=256)
def _load_client_data(spec_items: tuple, partition_id: int) -> ClientData:
    source, partition = _partition(tuple((k, v) for k, v in spec_items if k in _PARTITION_KEYS))
    if not 0 <= partition_id < len(partition.clients):
        raise ValueError(f"partition-id {partition_id} outside 0..{len(partition.clients) - 1}")
    part = partition.clients[partition_id]
    x_train, y_train, x_test, y_test = client_arrays(source, part)
    return ClientData(x_train, y_train, x_test, y_test, int(part.group), source.num_classes, source.input_shape)


def client_identity(context: Context) -> tuple[int, str]:
    """(partition id, stable client key). The key survives reconnects; node ids do not."""
    node_config = context.node_config
    if "partition-id" not in node_config:
        raise ValueError("node config has no 'partition-id' (start the SuperNode with --node-config 'partition-id=N')")
    partition_id = int(node_config["partition-id"])
    key = str(node_config.get("client-key", partition_id))
    return partition_id, key


def _spec(config: ConfigRecord, context: Context) -> dict:
    spec = {key: config[key] for key in protocol.CLIENT_SPEC_KEYS}
    for key in ("data-dir", "device"):  # a device may point at its own data folder / accelerator
        if key in context.node_config:
            spec[key] = context.node_config[key]
    return spec


def _client_data(config: ConfigRecord, context: Context) -> ClientData:
    partition_id, _ = client_identity(context)
    return _load_client_data(tuple(sorted(_spec(config, context).items())), partition_id)


def _identity_record(context: Context, data: ClientData) -> ConfigRecord:
    _, key = client_identity(context)
    return ConfigRecord({"client-key": key, "true-group": data.true_group})


def _label_stats(data: ClientData) -> dict[str, float]:
    histogram = np.bincount(data.y_train, minlength=data.num_classes)
    return {"num-classes": num_classes_present(histogram), "label-entropy": float(label_entropy(histogram))}


def _seed(*parts: object) -> int:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _receive(msg: Message, context: Context):
    """The message's config, the client's spec and data, and the model it was sent."""
    config = msg.content[protocol.CONFIG]
    data = _client_data(config, context)
    spec = _spec(config, context)
    model = build_model(str(spec["model"]), str(spec["dataset"]), data.input_shape, data.num_classes, int(spec["seed"]))
    received = protocol.from_array_record(msg.content[protocol.ARRAYS])
    load_numpy_state(model, received)
    return config, spec, data, model, received


@app.query("profile")
def profile(msg: Message, context: Context) -> Message:
    """Who am I: the stable key, the data size and (if allowed) label statistics."""
    config = msg.content[protocol.CONFIG]
    data = _client_data(config, context)
    metrics = {"num-examples": len(data.y_train)}
    if bool(config.get("label-stats", False)):
        metrics.update(_label_stats(data))
    reply = RecordDict({protocol.METRICS: MetricRecord(metrics), protocol.CLIENT: _identity_record(context, data)})
    return Message(reply, reply_to=msg)


def _fault(config: ConfigRecord, key: str, kinds: tuple[str, ...]) -> str | None:
    """Injected fault of this message (tests and benchmarks; off unless a fault rate is set)."""
    fault = faults.draw_fault(config, key, int(config["server-round"]), str(config.get("phase", "train")), kinds)
    if fault == "raise":
        raise faults.InjectedFault(f"injected fault (fault-rate) at round {config['server-round']}")
    if fault == "slow":
        delay = float(config.get("fault-delay", 0.0) or 0.0) or float(config.get("timeout", 600.0)) + 1.0
        faults.clock.sleep(delay)
    return fault


@app.train()
def do_train(msg: Message, context: Context) -> Message:
    cap_threads()
    config, spec, data, model, received = _receive(msg, context)
    device = pick_device(str(spec["device"]))
    partition_id, key = client_identity(context)
    fault = _fault(config, key, faults.KINDS)
    loss = train(
        model,
        data.x_train,
        data.y_train,
        epochs=int(config["local-epochs"]),
        batch_size=int(spec["batch-size"]),
        lr=float(config["lr"]),
        momentum=float(spec["momentum"]),
        seed=_seed(spec["seed"], key, config["server-round"], config.get("phase", "train")),
        device=device,
        proximal_mu=float(config.get("proximal-mu", 0.0)),
    )
    trained = state_to_numpy(model)
    names = protocol.parse_upload(str(config.get("upload", protocol.UPLOAD_FULL)))
    if names is None:
        names = list(trained)
    unknown = [name for name in names if name not in trained]
    if unknown:
        raise ValueError(f"upload asks for arrays this model does not have: {unknown}; it has {list(trained)}")
    if config.get("return", protocol.RETURN_WEIGHTS) == protocol.RETURN_UPDATE:
        out = {name: trained[name] - received[name] for name in names}
    else:
        out = {name: trained[name] for name in names}
    if fault in ("nan", "shape"):
        out = faults.corrupt(out, fault, key, int(config["server-round"]))
    metrics = {"num-examples": len(data.y_train), "train-loss": float(loss)}
    if bool(config.get("label-stats", False)):
        metrics.update(_label_stats(data))
    reply = RecordDict(
        {
            protocol.ARRAYS: protocol.to_array_record(out),
            protocol.METRICS: MetricRecord(metrics),
            protocol.CLIENT: _identity_record(context, data),
        }
    )
    return Message(reply, reply_to=msg)


@app.evaluate()
def do_evaluate(msg: Message, context: Context) -> Message:
    cap_threads()
    config, spec, data, model, _ = _receive(msg, context)
    _fault(config, client_identity(context)[1], ("raise", "slow"))
    loss, accuracy = evaluate(model, data.x_test, data.y_test, device=pick_device(str(spec["device"])))
    metrics = MetricRecord({"num-examples": len(data.y_test), "eval-loss": float(loss), "eval-accuracy": float(accuracy)})
    reply = RecordDict({protocol.METRICS: metrics, protocol.CLIENT: _identity_record(context, data)})
    return Message(reply, reply_to=msg)
