"""A ``ClientTask`` answering clusterfed's message contract, and the ClientApp around it.

``reply(task, message_type, content, context)`` is the whole client: a message's content and
the node's Flower ``Context`` in, the reply's content out. ``client_app(task)`` registers it
for ``train`` and ``evaluate`` (an evaluate message of phase ``profile`` is the server's
profile probe, answered with the profile) and for the ``query.profile`` query of earlier servers. Given a task's import path
(``"package.module:name"``) instead of the task, the ClientApp imports nothing of the task
in its own process when that is one of Flower's one-message ``flwr-clientapp`` processes:
it hands each message to a warm worker (``clusterfed.client_worker``) that keeps the task,
torch and the data loaded. This module imports only flwr, numpy and clusterfed.secagg (built
on flwr's primitives), never torch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clusterfed import protocol
from clusterfed.client.identity import client_key
from clusterfed.client.task import (
    HOW_TO_GIVE,
    LABEL_STATS,
    MULTI_MODEL,
    ClientTask,
    as_task_data,
    count_examples,
    load_task,
)
from clusterfed.client.worker_link import DEFAULT_IDLE_SECONDS, request
from clusterfed.label_stats import label_entropy, num_classes_present
from clusterfed.protocol import CHOICE, CHOICES, unpack_model
from clusterfed.secagg import secagg_mod

# imported by Flower's `flwr-clientapp` process (one message, then exit), not by simulations
_ONE_MESSAGE_PROCESS = "flwr.supernode.runtime.run_clientapp"


KEY_TAG = "[client-key "  # how an error names its client: [client-key "pi-03"] <message>
# what this helper's clients can do beyond a stock ClientApp (the names of
# clusterfed.strategies.base.CAPABILITIES); each task's profile lists those it gives
# (``ClientTask.capabilities``) and, under MISSING_KEY, how to give the others
HELPER_CAPABILITIES = (LABEL_STATS, MULTI_MODEL)
PROFILE = "profile"  # listed first in every helper profile: it answers the profile with a stable key
# in the profile's client record: "<capability>: how to give it", for each one the task lacks
MISSING_KEY = protocol.CAPABILITIES_MISSING_KEY


def _key_or_none(task: ClientTask | str, context: Context) -> str | None:
    try:
        if isinstance(task, ClientTask):
            return str(task.key(context))

        return client_key(context.node_config)
    except Exception:  # noqa: BLE001 - a node config without a key: the server names the node only
        return None


def name_client(task: ClientTask | str, context: Context, error: Exception) -> None:
    """Prefix the exception's message with ``[client-key "<key>"]`` (its type is kept): Flower's
    error reply carries only the type and this text, and the server names the device from it."""
    key = _key_or_none(task, context)
    if key is None or str(error).startswith(KEY_TAG):
        return
    tag = f"{KEY_TAG}{json.dumps(key)}] "
    if error.args and isinstance(error.args[0], str):
        error.args = (tag + error.args[0], *error.args[1:])
    elif not error.args:
        error.args = (tag.rstrip(),)


def _config(content: RecordDict) -> dict[str, Any]:
    return dict(content[protocol.CONFIG]) if protocol.CONFIG in content else {}


def _identity(task: ClientTask, context: Context, data) -> ConfigRecord:
    return ConfigRecord({"client-key": task.key(context), "true-group": int(getattr(data, "true_group", -1))})


def label_stats(labels) -> dict[str, float]:
    """``num-classes`` (classes present) and ``label-entropy`` (bits) of the training labels."""
    _, counts = np.unique(np.asarray(labels).ravel(), return_counts=True)
    return {"num-classes": num_classes_present(counts), "label-entropy": float(label_entropy(counts))}


def _with_label_stats(metrics: dict, config: Mapping, data) -> dict:
    labels = getattr(data, "labels", None)
    if bool(config.get("label-stats", False)) and labels is not None:
        metrics.update(label_stats(labels))
    return metrics


def _count(metrics: Mapping, data, split: str) -> int:
    """``num-examples`` as the task's function reported it, else counted from the data."""
    return int(metrics["num-examples"]) if "num-examples" in metrics else count_examples(data, split)


def _device(context: Context, config: Mapping):
    """Node config ``device`` (a device's own accelerator), else the message's, else ``auto``."""
    from clusterfed.training import pick_device

    return pick_device(str(context.node_config.get("device", config.get("device", "auto"))))


def receive(task: ClientTask, content: RecordDict, context: Context):
    """The message's config, this client's data, the model loaded with what it was sent, the
    device, the arrays received (for IFCA, the chosen model's) and IFCA's choice (or None)."""
    from clusterfed.training import load_numpy_state

    config = _config(content)
    if protocol.ARRAYS not in content:
        raise ValueError(f"the message has no {protocol.ARRAYS!r} record (the model to train or evaluate)")
    data = as_task_data(task.data_fn(context, config))
    model = task.model_fn(context, config)
    device = _device(context, config)
    received = protocol.from_array_record(content[protocol.ARRAYS], copy=False)  # read only: loaded, subtracted
    choices = int(config.get(CHOICES, 0) or 0)
    if not choices:
        load_numpy_state(model, received)
        return config, data, model, device, received, None
    # a multi-model (IFCA) message: keep the model of lowest loss on the *training* data
    # (the test split never decides)
    losses = []
    for k in range(choices):
        load_numpy_state(model, unpack_model(received, k))
        losses.append(task.train_loss(model, data, config, device))
    choice = int(np.argmin(losses))
    chosen = unpack_model(received, choice)
    load_numpy_state(model, chosen)
    return config, data, model, device, chosen, choice


def profile_reply(task: ClientTask, content: RecordDict, context: Context) -> RecordDict:
    """Who am I: the stable key, the data size and (if asked) label statistics."""
    config = _config(content)
    data = as_task_data(task.data_fn(context, config))
    metrics = _with_label_stats({"num-examples": count_examples(data, "train")}, config, data)
    identity = _identity(task, context, data)
    given = task.capabilities(data)
    # "profile" first, which every helper client gives (a stable key): the list is never
    # empty (Flower's ConfigRecord cannot count the bytes of an empty list or string)
    identity[protocol.CAPABILITIES_KEY] = [PROFILE, *given]
    missing = [f"{name}: {HOW_TO_GIVE[name]}" for name in HELPER_CAPABILITIES if name not in given]
    if missing:
        identity[MISSING_KEY] = missing
    return RecordDict({protocol.METRICS: MetricRecord(metrics), protocol.CLIENT: identity})


def train_reply(task: ClientTask, content: RecordDict, context: Context) -> RecordDict:
    """Train the model sent on this client's data; return exactly the arrays the config asks
    for (``upload``), as weights or as the update trained - received (``return``); an evidence
    ask (``protocol.EVIDENCE_SKETCH``): the named arrays' updates, projected."""
    from clusterfed.training import state_to_numpy

    config, data, model, device, received, choice = receive(task, content, context)
    if config.get("phase") == protocol.CHOOSE_PHASE and choice is not None:  # the choice only: no training, no arrays
        metrics = {"num-examples": count_examples(data, "train"), CHOICE: choice,
                   "train-loss": float(task.train_loss(model, data, config, device))}
        return RecordDict({protocol.METRICS: MetricRecord(metrics), protocol.CLIENT: _identity(task, context, data)})
    trained_metrics = task.train(model, data, config, device)
    trained = state_to_numpy(model, copy=False)  # copied once, into the reply's bytes
    return trained_content(task, context, config, data, received, choice, trained, trained_metrics)


def trained_content(task: ClientTask, context: Context, config: Mapping, data, received: Mapping[str, np.ndarray],
                    choice: int | None, trained: Mapping[str, np.ndarray], trained_metrics: Mapping) -> RecordDict:
    """A train reply's content from the trained state (``train_reply``'s, or the batched client
    executor's, which trains many clients together)."""
    names = protocol.parse_upload(str(config.get("upload", protocol.UPLOAD_FULL)))
    if names is None:
        names = list(trained)
    unknown = [name for name in names if name not in trained]
    if unknown:
        raise ValueError(f"upload asks for arrays this model does not have: {unknown}; it has {list(trained)}")
    if protocol.parse_evidence(config) is not None:  # a clustering ask: the updates, projected
        out = protocol.project_evidence(trained, received, config)
    elif config.get("return", protocol.RETURN_WEIGHTS) == protocol.RETURN_UPDATE:
        out = {name: protocol.difference(trained[name], received[name]) for name in names}
    else:
        out = {name: trained[name] for name in names}
    metrics = {"num-examples": _count(trained_metrics, data, "train"), **trained_metrics}
    if choice is not None:
        metrics[CHOICE] = choice
    _with_label_stats(metrics, config, data)
    return RecordDict({
        protocol.ARRAYS: protocol.to_array_record(out),
        protocol.METRICS: MetricRecord(metrics),
        protocol.CLIENT: _identity(task, context, data),
    })


def evaluate_reply(task: ClientTask, content: RecordDict, context: Context) -> RecordDict:
    """The task's evaluation metrics of the model sent, on this client's test data."""
    config, data, model, device, *_ = receive(task, content, context)
    return evaluated_content(task, context, data, task.evaluate(model, data, config, device))


def evaluated_content(task: ClientTask, context: Context, data, evaluated: Mapping) -> RecordDict:
    """An evaluate reply's content from the evaluation metrics."""
    metrics = {"num-examples": _count(evaluated, data, "test"), **evaluated}
    return RecordDict({protocol.METRICS: MetricRecord(metrics), protocol.CLIENT: _identity(task, context, data)})


@dataclass(frozen=True)
class HelperParts:
    """What ``client_app`` built a ClientApp from."""

    task: ClientTask | str
    mods: tuple
    check: Callable[[Context], None] | None
    requires: tuple[str, ...] = ()


_REPLIES = {MessageType.TRAIN: train_reply, MessageType.EVALUATE: evaluate_reply,
            protocol.PROFILE_QUERY: profile_reply}


def reply(task: ClientTask | str, message_type: str, content: RecordDict, context: Context) -> RecordDict:
    """The reply content to one message (``task``: a ClientTask or its import path)."""
    if message_type not in _REPLIES:
        raise ValueError(f"a clusterfed client answers {list(_REPLIES)} messages, not {message_type!r}")
    answer = _REPLIES[message_type]
    if message_type == MessageType.EVALUATE and _config(content).get("phase") == protocol.PROFILE_PHASE:
        answer = profile_reply
    return answer(load_task(task) if isinstance(task, str) else task, content, context)


def uses_warm_worker(node_config: Mapping) -> bool:
    """Node config ``warm-worker``: ``"auto"`` (default: exactly in Flower's one-message
    ``flwr-clientapp`` processes), ``true`` or ``false``."""
    setting = node_config.get("warm-worker", "auto")
    if isinstance(setting, bool):
        return setting
    if str(setting).lower() in ("true", "false"):
        return str(setting).lower() == "true"
    if str(setting) != "auto":
        raise ValueError(f"node config warm-worker={setting!r}: use \"auto\", true or false")
    return _ONE_MESSAGE_PROCESS in sys.modules


def needed_capabilities(requires: Any) -> tuple[str, ...]:
    """Capability names from ``requires``: names (one or several), or a strategy (anything
    with a ``requires()`` method, e.g. ``clusterfed.IFCA()``)."""
    if callable(getattr(requires, "requires", None)):
        requires = requires.requires()
    if isinstance(requires, str):
        requires = (requires,)
    names = tuple(sorted({str(name) for name in requires or ()}))
    unknown = [name for name in names if name not in HELPER_CAPABILITIES]
    if unknown:
        raise ValueError(f"client_app(requires=...): unknown capabilities {unknown}; the helper's are "
                         f"{list(HELPER_CAPABILITIES)} (a strategy's requires() names them)")
    return names


def client_app(task: ClientTask | str, *, mods: Sequence | None = None,
               check: Callable[[Context], None] | None = None, requires: Any = (),
               secure_aggregation: bool = False) -> ClientApp:
    """A Flower ClientApp answering clusterfed's full message contract with ``task``.

    ``task``: a ``ClientTask``, answered in this process; or its import path
    ``"package.module:name"``, which is imported on the first message, and which a warm worker
    answers where node config ``warm-worker`` says so (``warm-worker-idle``: seconds it waits
    for the next message, default 900). ``mods``: Flower mods around every message.
    ``check(context)``: a cheap test of the node (its data file, say) run in this process
    before each message; what it raises is the error reply, and no warm worker is started.
    Every error names the client key at the start of its message (``[client-key "<key>"]``).

    ``requires``: what the strategy the server runs needs from its clients — its
    ``requires()`` (``requires=IFCA().requires()``), the strategy itself (``requires=IFCA()``)
    or capability names (``"multi-model"``). A ``ClientTask`` that cannot give one is refused
    here, before any message, with ``TaskCapabilityError`` saying what to pass (IFCA with an
    own ``train_fn``: ``loss_fn`` or ``train_loss_fn``); an import path is checked when this
    process first loads the task (a warm worker's task: by the server, from the profile).
    Without ``requires`` the client cannot know the strategy: its profile lists what the task
    gives (``ClientTask.capabilities``) and how to give the rest, for the server to check.

    ``secure_aggregation=True``: ``clusterfed.secagg.secagg_mod`` is put around every message,
    outside ``mods`` (a clipping mod among them clips before the mod masks): train messages of a
    secure aggregation round run SecAgg+'s stages; any other message passes through unchanged.
    Nothing else changes. For a client that never sends an unmasked update, pass
    ``mods=[clusterfed.secagg.secagg_client_mod(require=True)]`` instead.
    """
    if isinstance(task, str):
        if task.count(":") != 1 or not all(task.split(":")):
            raise ValueError(f"client task {task!r}: write it as \"package.module:name\"")
    elif not isinstance(task, ClientTask):
        raise TypeError(f"client_app takes a ClientTask or its import path, got {type(task).__name__}")
    needed = needed_capabilities(requires)
    if isinstance(task, ClientTask):
        task.require(needed)
    if not isinstance(secure_aggregation, bool):
        raise TypeError(f"client_app(secure_aggregation=...) takes True or False, got {secure_aggregation!r}")
    all_mods = list(mods or [])
    if secure_aggregation:
        all_mods = [secagg_mod, *(mod for mod in all_mods if mod is not secagg_mod)]

    def answer(msg: Message, context: Context) -> Message:
        message_type = msg.metadata.message_type
        try:
            if check is not None:
                check(context)
            if isinstance(task, str) and uses_warm_worker(context.node_config):
                idle = float(context.node_config.get("warm-worker-idle", DEFAULT_IDLE_SECONDS))
                content = request(task, message_type, msg.content, context, idle_seconds=idle)
            else:
                if isinstance(task, str) and needed:
                    load_task(task).require(needed)
                content = reply(task, message_type, msg.content, context)
        except Exception as error:
            name_client(task, context, error)
            raise
        return Message(content, reply_to=msg)

    app = ClientApp(mods=all_mods)
    # what the in-process engine's batched client executor reads to answer for this app
    app.clusterfed_parts = HelperParts(task, tuple(all_mods), check, needed)
    app.query("profile")(answer)
    app.train()(answer)
    app.evaluate()(answer)
    return app
