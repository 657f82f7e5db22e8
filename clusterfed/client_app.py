"""The built-in image task (digits, MNIST, ... with the papers' CNNs) as a ``ClientTask``, and its ClientApp.

The same app runs in simulation (one virtual SuperNode per partition) and on a device:
a SuperNode started with ``--node-config 'data-path="/data/part-3.npz" client-key="pi-03"'``
reads only its own data (``clusterfed.datasets.device_data``); one started with
``--node-config 'partition-id=3 client-key="pi-03"'`` cuts its share of the shared data set.

``TASK`` is the task: its data and model come from the data/model spec the server sends in
every message's config (``protocol.CLIENT_SPEC_KEYS``), trained by ``clusterfed.training``.
``clusterfed.client`` turns it into the message contract. The ``app`` here answers in this
process (with fault injection, ``clusterfed.faults``); on a device, Flower loads
``clusterfed.client_entry`` instead, which hands the messages to a warm worker.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from flwr.app import Context, Message

from clusterfed import faults, protocol
from clusterfed.client import ClientTask, client_app
from clusterfed.client.app import reply
from clusterfed.client.identity import client_key
from clusterfed.client_entry import check_node_data  # the same cheap test as the device's entry
from clusterfed.client.identity import data_key as _data_key  # noqa: F401 - tests clear its cache
from clusterfed.datasets import client_arrays
from clusterfed.datasets.device_data import load_device_data
from clusterfed.datasets.export import PARTITION_KEYS, build_partition
from clusterfed.models import build_model
from clusterfed.training import LocalSGD, cap_threads, evaluate, evaluates_on, train, trains_with


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


# The partitioners split the data set among the clients, so all clients' arrays together are
# about one copy of it whatever their count: the bound is above the client counts one process
# serves (so no client's arrays are rebuilt every round), and keeps a process that serves
# several runs from keeping them all.
@lru_cache(maxsize=16384)
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
    is keyed by its data's fingerprint (with a warning) and a partition by its id
    (``clusterfed.client.identity.client_key``).
    """
    data_path = str(node_config.get("data-path", ""))
    if "partition-id" not in node_config and not data_path:
        raise ValueError(
            "node config has neither 'data-path' nor 'partition-id' (start the SuperNode with "
            "--node-config 'data-path=\"/data/part-3.npz\" client-key=\"pi-03\"', or 'partition-id=N' "
            "to use a share of the shared data set)"
        )
    partition_id = int(node_config["partition-id"]) if "partition-id" in node_config else None
    return partition_id, client_key(node_config)


def _spec(config: Mapping, node_config: Mapping) -> dict:
    spec = {key: config[key] for key in protocol.CLIENT_SPEC_KEYS}
    for key in ("data-dir", "device"):  # a device may point at its own data folder / accelerator
        if key in node_config:
            spec[key] = node_config[key]
    return spec


def _client_data(config: Mapping, node_config: Mapping) -> ClientData:
    data_path = str(node_config.get("data-path", ""))
    if data_path:  # the device's own files; the shared data set is never loaded
        spec = _spec(config, node_config)
        own = load_device_data(data_path, str(spec["dataset"]), test_fraction=float(spec["test-fraction"]),
                               seed=int(spec["seed"]))
        return ClientData(own.x_train, own.y_train, own.x_test, own.y_test, own.true_group, own.num_classes,
                          own.input_shape)
    partition_id, _ = client_identity(node_config)
    return _load_client_data(tuple(sorted(_spec(config, node_config).items())), partition_id)


@dataclass(frozen=True)
class BuiltinData:
    """What the built-in task's functions get as ``data`` (``clusterfed.client.TaskData``'s
    attributes, plus the spec and key that seed training)."""

    client: ClientData
    spec: dict
    key: str

    @property
    def train(self) -> tuple[np.ndarray, np.ndarray]:
        return self.client.x_train, self.client.y_train

    @property
    def test(self) -> tuple[np.ndarray, np.ndarray]:
        return self.client.x_test, self.client.y_test

    @property
    def labels(self) -> np.ndarray:
        return self.client.y_train

    @property
    def true_group(self) -> int:
        return self.client.true_group

    @property
    def num_train(self) -> int:
        return len(self.client.y_train)

    @property
    def num_test(self) -> int:
        return len(self.client.y_test)


def _seed(*parts: object) -> int:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


@lru_cache(maxsize=8)
def _model(name: str, dataset: str, input_shape: tuple, num_classes: int, seed: int):
    """One model object per process and architecture, reused across messages: every message
    loads its complete state (``load_numpy_state`` refuses a partial one), so nothing of an
    earlier client's training survives into the next (optimizer state lives in ``train``)."""
    return build_model(name, dataset, input_shape, num_classes, seed)


def builtin_data(context: Context, config: Mapping) -> BuiltinData:
    return BuiltinData(_client_data(config, context.node_config), _spec(config, context.node_config),
                       client_identity(context.node_config)[1])


def builtin_model(context: Context, config: Mapping):
    cap_threads()
    spec = _spec(config, context.node_config)
    data = _client_data(config, context.node_config)
    return _model(str(spec["model"]), str(spec["dataset"]), tuple(data.input_shape), data.num_classes,
                  int(spec["seed"]))


def builtin_sgd(data: BuiltinData, config: Mapping) -> LocalSGD:
    """SGD with the spec's batch size and momentum, seeded per client, round and phase."""
    spec = data.spec
    return LocalSGD(data.client.x_train, data.client.y_train, epochs=int(config["local-epochs"]),
                    batch_size=int(spec["batch-size"]), lr=float(config["lr"]), momentum=float(spec["momentum"]),
                    seed=_seed(spec["seed"], data.key, config["server-round"], config.get("phase", "train")),
                    proximal_mu=float(config.get("proximal-mu", 0.0)))


@trains_with(builtin_sgd)
def builtin_train(model, data: BuiltinData, config: Mapping, device) -> float:
    """``builtin_sgd``'s training (the in-process engine may train many such clients together)."""
    return train(model, **vars(builtin_sgd(data, config)), device=device)


def builtin_test_split(data: BuiltinData, config: Mapping) -> tuple[np.ndarray, np.ndarray]:
    return data.client.x_test, data.client.y_test


@evaluates_on(builtin_test_split)
def builtin_evaluate(model, data: BuiltinData, config: Mapping, device) -> dict[str, float]:
    """Loss and accuracy of the model on this client's test split."""
    loss, accuracy = evaluate(model, *builtin_test_split(data, config), device=device)
    return {"eval-loss": float(loss), "eval-accuracy": float(accuracy)}


def builtin_train_loss(model, data: BuiltinData, config: Mapping, device) -> float:
    """Loss on this client's *training* split: IFCA's choice."""
    return evaluate(model, data.client.x_train, data.client.y_train, device=device)[0]


def builtin_key(context: Context) -> str:
    return client_identity(context.node_config)[1]


TASK = ClientTask(
    model_fn=builtin_model,
    data_fn=builtin_data,
    train_fn=builtin_train,
    evaluate_fn=builtin_evaluate,
    train_loss_fn=builtin_train_loss,
    key_fn=builtin_key,
)

# secure_aggregation: the SecAgg+ mod is in place; it passes every message outside a secure
# aggregation round through unchanged (``clusterfed.secagg``)
app = client_app(TASK, mods=[faults.inject_faults], check=check_node_data, secure_aggregation=True)


# The message handlers of ``app``, for apps that wrap the real client (tests).
def _handler(msg: Message, context: Context) -> Message:
    return faults.inject_faults(msg, context, lambda m, c: Message(reply(TASK, m.metadata.message_type, m.content, c),
                                                                   reply_to=m))


profile = do_train = do_evaluate = _handler
