"""ClientApp: trains and evaluates the model it is sent on its own data.

The same app runs in simulation (one virtual SuperNode per partition) and on a device:
a SuperNode started with ``--node-config 'data-path="/data/part-3.npz" client-key="pi-03"'``
reads only its own data (``clusterfed.datasets.device_data``); one started with
``--node-config 'partition-id=3 client-key="pi-03"'`` cuts its share of the shared data set.

The work is done by ``profile_reply`` / ``train_reply`` / ``evaluate_reply``: a message's
content and the node's config in, the reply's content out. The ``app`` here calls them in
this process; on a device, Flower loads ``clusterfed.client_entry`` instead, which hands
them to a warm worker process (``clusterfed.client_worker``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore import log

from clusterfed import faults, protocol
from clusterfed.datasets import client_arrays
from clusterfed.datasets.device_data import data_fingerprint, load_device_data
from clusterfed.datasets.export import PARTITION_KEYS, build_partition
from clusterfed.label_stats import label_entropy, num_classes_present
from clusterfed.models import build_model
from clusterfed.strategies.exchange import CHOICE, CHOICES, unpack_model
from clusterfed.training import cap_threads, evaluate, load_numpy_state, pick_device, state_to_numpy, train

app = ClientApp()


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
    return build_partition(dict(spec_items))


@lru_cache(maxsize=256)
def _load_client_data(spec_items: tuple, partition_id: int) -> ClientData:
    source, partition = _partition(tuple((k, v) for k, v in spec_items if k in PARTITION_KEYS))
    if not 0 <= partition_id < len(partition.clients):
        raise ValueError(f"partition-id {partition_id} outside 0..{len(partition.clients) - 1}")
    part = partition.clients[partition_id]
    x_train, y_train, x_test, y_test = client_arrays(source, part)
    return ClientData(x_train, y_train, x_test, y_test, int(part.group), source.num_classes, source.input_shape)


def client_identity(node_config: Mapping) -> tuple[int | None, str]:
    """(partition id or None, stable client key). The key survives reconnects; node ids do not.

    The key is the node config's ``client-key``; without one, a device with a ``data-path``
    is keyed by its data's fingerprint (with a warning) and a partition by its id.
    """
    data_path = str(node_config.get("data-path", ""))
    if "partition-id" not in node_config and not data_path:
        raise ValueError(
            "node config has neither 'data-path' nor 'partition-id' (start the SuperNode with "
            "--node-config 'data-path=\"/data/part-3.npz\" client-key=\"pi-03\"', or 'partition-id=N' "
            "to use a share of the shared data set)"
        )
    partition_id = int(node_config["partition-id"]) if "partition-id" in node_config else None
    if "client-key" in node_config:
        key = str(node_config["client-key"])
    elif data_path:
        key = _data_key(data_path)
    else:
        key = str(partition_id)
    return partition_id, key


@lru_cache(maxsize=8)
def _data_key(data_path: str) -> str:
    key = f"data-{data_fingerprint(data_path)[:16]}"
    log(logging.WARNING, "node config has no 'client-key': using %s, derived from the hash of %s; set "
        "client-key in --node-config to keep the key when the data changes", key, data_path)
    return key


def _spec(config: ConfigRecord, node_config: Mapping) -> dict:
    spec = {key: config[key] for key in protocol.CLIENT_SPEC_KEYS}
    for key in ("data-dir", "device"):  # a device may point at its own data folder / accelerator
        if key in node_config:
            spec[key] = node_config[key]
    return spec


def _client_data(config: ConfigRecord, node_config: Mapping) -> ClientData:
    data_path = str(node_config.get("data-path", ""))
    if data_path:  # the device's own files; the shared data set is never loaded
        spec = _spec(config, node_config)
        own = load_device_data(data_path, str(spec["dataset"]), test_fraction=float(spec["test-fraction"]),
                               seed=int(spec["seed"]))
        return ClientData(own.x_train, own.y_train, own.x_test, own.y_test, own.true_group, own.num_classes,
                          own.input_shape)
    partition_id, _ = client_identity(node_config)
    return _load_client_data(tuple(sorted(_spec(config, node_config).items())), partition_id)


def _identity_record(node_config: Mapping, data: ClientData) -> ConfigRecord:
    _, key = client_identity(node_config)
    return ConfigRecord({"client-key": key, "true-group": data.true_group})


def _label_stats(data: ClientData) -> dict[str, float]:
    histogram = np.bincount(data.y_train, minlength=data.num_classes)
    return {"num-classes": num_classes_present(histogram), "label-entropy": float(label_entropy(histogram))}


def _seed(*parts: object) -> int:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


@lru_cache(maxsize=8)
def _model(name: str, dataset: str, input_shape: tuple, num_classes: int, seed: int):
    """One model object per process and architecture, reused across messages: every message
    loads its complete state (``load_numpy_state`` refuses a partial one), so nothing of an
    earlier client's training survives into the next (optimizer state lives in ``train``)."""
    return build_model(name, dataset, input_shape, num_classes, seed)


def _receive(content: RecordDict, node_config: Mapping):
    """The message's config, the client's spec and data, and the model it was sent."""
    config = content[protocol.CONFIG]
    data = _client_data(config, node_config)
    spec = _spec(config, node_config)
    model = _model(str(spec["model"]), str(spec["dataset"]), tuple(data.input_shape), data.num_classes,
                   int(spec["seed"]))
    received = protocol.from_array_record(content[protocol.ARRAYS])
    choices = int(config.get(CHOICES, 0) or 0)
    if choices:  # a multi-model (IFCA) message: keep the model of lowest training loss
        received, choice = _choose(model, received, choices, data, pick_device(str(spec["device"])))
        return config, spec, data, model, received, choice
    load_numpy_state(model, received)
    return config, spec, data, model, received, None


def _choose(model, packed, choices: int, data: ClientData, device) -> tuple[dict, int]:
    """Load each of the ``choices`` models of ``packed`` and keep the one whose loss on
    this client's *training* data is lowest (the test split never decides); returns it
    (loaded in ``model``) and its index."""
    losses = []
    for k in range(choices):
        load_numpy_state(model, unpack_model(packed, k))
        losses.append(evaluate(model, data.x_train, data.y_train, device=device)[0])
    choice = int(np.argmin(losses))
    chosen = unpack_model(packed, choice)
    load_numpy_state(model, chosen)
    return chosen, choice


def profile_reply(content: RecordDict, node_config: Mapping) -> RecordDict:
    """Who am I: the stable key, the data size and (if allowed) label statistics."""
    config = content[protocol.CONFIG]
    data = _client_data(config, node_config)
    metrics = {"num-examples": len(data.y_train)}
    if bool(config.get("label-stats", False)):
        metrics.update(_label_stats(data))
    return RecordDict({protocol.METRICS: MetricRecord(metrics), protocol.CLIENT: _identity_record(node_config, data)})


def _fault(config: ConfigRecord, key: str, kinds: tuple[str, ...]) -> str | None:
    """Injected fault of this message (tests and benchmarks; off unless a fault rate is set)."""
    fault = faults.draw_fault(config, key, int(config["server-round"]), str(config.get("phase", "train")), kinds)
    if fault == "raise":
        raise faults.InjectedFault(f"injected fault (fault-rate) at round {config['server-round']}")
    if fault == "slow":
        delay = float(config.get("fault-delay", 0.0) or 0.0) or float(config.get("timeout", 600.0)) + 1.0
        faults.clock.sleep(delay)
    return fault


def train_reply(content: RecordDict, node_config: Mapping) -> RecordDict:
    """Train the model sent on this client's data; upload what the config asks for."""
    cap_threads()
    config, spec, data, model, received, choice = _receive(content, node_config)
    device = pick_device(str(spec["device"]))
    partition_id, key = client_identity(node_config)
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
    if choice is not None:
        metrics[CHOICE] = choice
    if bool(config.get("label-stats", False)):
        metrics.update(_label_stats(data))
    return RecordDict(
        {
            protocol.ARRAYS: protocol.to_array_record(out),
            protocol.METRICS: MetricRecord(metrics),
            protocol.CLIENT: _identity_record(node_config, data),
        }
    )


def evaluate_reply(content: RecordDict, node_config: Mapping) -> RecordDict:
    """Loss and accuracy of the model sent on this client's test split."""
    cap_threads()
    config, spec, data, model, *_ = _receive(content, node_config)
    _fault(config, client_identity(node_config)[1], ("raise", "slow"))
    loss, accuracy = evaluate(model, data.x_test, data.y_test, device=pick_device(str(spec["device"])))
    metrics = MetricRecord({"num-examples": len(data.y_test), "eval-loss": float(loss), "eval-accuracy": float(accuracy)})
    return RecordDict({protocol.METRICS: metrics, protocol.CLIENT: _identity_record(node_config, data)})


# The reply function of each message type (the warm worker dispatches on it too).
REPLIES = {protocol.PROFILE_QUERY: profile_reply, "train": train_reply, "evaluate": evaluate_reply}


@app.query("profile")
def profile(msg: Message, context: Context) -> Message:
    return Message(profile_reply(msg.content, context.node_config), reply_to=msg)


@app.train()
def do_train(msg: Message, context: Context) -> Message:
    return Message(train_reply(msg.content, context.node_config), reply_to=msg)


@app.evaluate()
def do_evaluate(msg: Message, context: Context) -> Message:
    return Message(evaluate_reply(msg.content, context.node_config), reply_to=msg)
