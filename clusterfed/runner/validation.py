"""Every reply is checked here before an algorithm sees it: a bad reply is rejected with
a reason and a kind, and never reaches a cluster model, a distance matrix or a statistic."""

from __future__ import annotations

import math

import numpy as np
from flwr.app import RecordDict

from clusterfed import protocol
from clusterfed.core.exchange import Arrays, Ask, ClientInfo, TrainReply

# what ``rejected`` faults are counted as, per round (rounds.jsonl "faults")
REJECTION_KINDS = ("names", "shape", "dtype", "non_finite", "decode", "metrics", "identity")


class ReplyRejected(ValueError):
    def __init__(self, reason: str, kind: str):
        super().__init__(reason)
        self.kind = kind


def validate_arrays(arrays: Arrays, expected: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
    """Names, shapes, dtypes and finite values, or ReplyRejected saying what is wrong."""
    missing = sorted(set(expected) - set(arrays))
    extra = sorted(set(arrays) - set(expected))
    if missing or extra:
        raise ReplyRejected(f"array names differ: missing {missing}, unexpected {extra}", "names")
    for name, (shape, dtype) in expected.items():
        value = arrays[name]
        if tuple(value.shape) != tuple(shape):
            raise ReplyRejected(f"{name}: shape {tuple(value.shape)} != expected {tuple(shape)}", "shape")
        if value.dtype != dtype:
            raise ReplyRejected(f"{name}: dtype {value.dtype} != expected {dtype}", "dtype")
        if not np.all(np.isfinite(value)):
            raise ReplyRejected(f"{name}: contains NaN or infinite values", "non_finite")


def _record(content: RecordDict, name: str, kind: str):
    try:
        return content[name]
    except (KeyError, TypeError):
        raise ReplyRejected(f"reply lacks its {name!r} record", kind) from None


def _positive_int(metrics, key: str) -> int:
    value = metrics.get(key) if hasattr(metrics, "get") else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ReplyRejected(f"{key} must be a positive integer, got {value!r}", "metrics")
    return value


def _check_key(content: RecordDict, key: str) -> None:
    client = content.get(protocol.CLIENT) if hasattr(content, "get") else None
    if client is not None and str(client.get("client-key")) != key:
        raise ReplyRejected(f"reply names client-key {client.get('client-key')!r}, expected {key!r}", "identity")


def parse_train_reply(content: RecordDict, ask: Ask, shapes: dict[str, tuple[tuple[int, ...], np.dtype]],
                      *, stock: bool = False) -> TrainReply:
    """The validated reply to ``ask``: exactly the arrays it asked for, finite, right shapes.

    ``stock``: the client is a stock Flower ClientApp, which returns its full weights
    whatever was asked: the arrays asked for are taken from them (the reply must hold the
    whole model), and they are weights, never an update."""
    if ask.config.get("phase") == protocol.CHOOSE_PHASE:
        return parse_choice_reply(content, ask)
    record = _record(content, protocol.ARRAYS, "names")
    metrics = _record(content, protocol.METRICS, "metrics")
    names = ask.upload or list(shapes)
    unknown = [n for n in names if n not in shapes]
    if unknown:
        raise ReplyRejected(f"the server asked for unknown arrays {unknown}", "names")
    try:
        arrays = protocol.from_array_record(record)
    except Exception as error:  # a corrupt Array cannot be decoded
        raise ReplyRejected(f"arrays could not be decoded: {type(error).__name__}: {error}", "decode") from None
    # an evidence ask: the named arrays' updates, projected (a stock ClientApp with
    # ``clusterfed.client.evidence_mod`` sends them too; one without sends its whole model)
    projected = protocol.evidence_shapes(ask.config, shapes)
    if projected is not None and stock and not protocol.is_projected(arrays, projected, shapes):
        projected = None  # a stock app without the mod: its whole model, projected on the server
    if projected is not None:
        validate_arrays(arrays, projected)
    elif stock:
        validate_arrays(arrays, shapes)
        arrays = {n: arrays[n] for n in names}
    else:
        validate_arrays(arrays, {n: shapes[n] for n in names})
    num_examples = _positive_int(metrics, "num-examples")
    loss = metrics.get("train-loss", metrics.get("train_loss"))
    if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss)):
        raise ReplyRejected(f"train-loss must be a finite number, got {loss!r}", "metrics")
    if loss is None and not stock:
        raise ReplyRejected("reply lacks its train-loss metric", "metrics")
    _check_key(content, ask.key)
    try:  # a multi-model ask (IFCA): the model the client chose, by the index it reports
        cluster, sent = ask.chosen(metrics)
    except ValueError as error:
        raise ReplyRejected(str(error), "metrics") from None
    return TrainReply(
        key=ask.key,
        cluster=cluster,
        arrays=arrays,
        sent={n: sent[n] for n in arrays},
        num_examples=num_examples,
        train_loss=None if loss is None else float(loss),
        metrics={k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
        is_update=projected is not None or (not stock and ask.config.get("return") == protocol.RETURN_UPDATE),
    )


CHOICE_METRIC = protocol.CHOICE


def parse_choice_reply(content: RecordDict, ask: Ask) -> TrainReply:
    """The reply to a choice-only ask (IFCA's choice step under secure aggregation): the
    model index the client chose and that model's train loss, no arrays (a reply that carries
    arrays is refused unread: the step must not reveal a model)."""
    if any(hasattr(record, "to_numpy_ndarrays") and len(record) for record in content.values()):
        raise ReplyRejected("a choice-only reply carried arrays: the choice step uploads none", "names")
    metrics = _record(content, protocol.METRICS, "metrics")
    num_examples = _positive_int(metrics, "num-examples")
    loss = metrics.get("train-loss")
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss):
        raise ReplyRejected(f"train-loss must be a finite number, got {loss!r}", "metrics")
    _check_key(content, ask.key)
    try:
        cluster, _ = ask.chosen(metrics)
    except ValueError as error:
        raise ReplyRejected(str(error), "metrics") from None
    return TrainReply(key=ask.key, cluster=cluster, arrays={}, sent={}, num_examples=num_examples,
                      train_loss=float(loss), metrics={CHOICE_METRIC: float(cluster)})


def parse_eval_reply(content: RecordDict, key: str) -> tuple[dict[str, float], int]:
    """(the numeric metrics, number of test examples) of a validated evaluate reply: every
    metric finite, an accuracy in [0, 1]."""
    metrics = _record(content, protocol.METRICS, "metrics")
    num_examples = _positive_int(metrics, "num-examples")
    values = {}
    for name, value in metrics.items():
        if name == "num-examples" or isinstance(value, (list, str)):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ReplyRejected(f"evaluate reply's {name!r} must be a finite number, got {value!r}", "metrics")
        if "acc" in name and not 0.0 <= value <= 1.0:
            raise ReplyRejected(f"evaluate reply out of range: {name} {value}", "metrics")
        values[name] = float(value)
    if not values:
        raise ReplyRejected("evaluate reply has no metric besides num-examples", "metrics")
    _check_key(content, key)
    return values, num_examples


def parse_profile_reply(content: RecordDict) -> ClientInfo:
    """Who a node is: its stable key, data size, true group (metrics only), label stats."""
    client = _record(content, protocol.CLIENT, "identity")
    metrics = _record(content, protocol.METRICS, "metrics")
    key = client.get("client-key") if hasattr(client, "get") else None
    if not isinstance(key, (str, int)) or isinstance(key, bool) or str(key).strip() == "":
        raise ReplyRejected(f"profile has no usable client-key (got {key!r})", "identity")
    group = client.get("true-group", -1)
    if isinstance(group, bool) or not isinstance(group, int):
        raise ReplyRejected(f"profile's true-group must be an integer, got {group!r}", "identity")
    num_examples = _positive_int(metrics, "num-examples")
    stats = {}
    for name in ("num-classes", "label-entropy"):
        if name in metrics:
            value = metrics[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ReplyRejected(f"profile's {name} must be a finite non-negative number, got {value!r}", "metrics")
            stats[name] = float(value)
    return ClientInfo(str(key), num_examples, group, stats)
