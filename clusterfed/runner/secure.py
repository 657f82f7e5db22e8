"""The driver's side of a securely aggregated training step (``SecureTrain``): one SecAgg+
instance per cluster (``clusterfed.secagg.GroupProtocol``), all clusters side by side, each
stage one exchange of train messages over the driver's ``Link``. The collect stage carries
the member's usual train content (its cluster's model and train config) beside the
protocol's record. What the strategy gets back (``SecureSums``) is each cluster's unmasked
weighted mean: no member's arrays are parsed, validated or kept here, since none arrive;
a reply that carries arrays in the clear is rejected unread.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.app import MessageType, RecordDict

from clusterfed import protocol
from clusterfed.core.exchange import Arrays, GroupSum, SecureSums, SecureTrain
from clusterfed.runner.validation import ReplyRejected
from clusterfed.secagg import GroupProtocol, GroupResult, SecAggError, run_groups, wire


# ``driver`` below is the run's ``clusterfed.runner.driver.RoundDriver`` (its link, counters and
# reply validation); typed Any because the driver imports this module
def secure_exchange(driver: Any, server_round: int, request: SecureTrain) -> SecureSums:
    """Run ``request``'s groups to their sums (or failures)."""
    link = driver.link
    ask_of = {ask.key: ask for ask in request.asks}
    driver.round_asked += len(request.asks)
    driver.round_trainers.update(ask_of)
    protocols = {cluster: GroupProtocol(members, request.settings, session=f"{request.session}/{cluster}")
                 for cluster, members in request.groups.items()}
    encoded: dict[int, Any] = {}  # a cluster's model is encoded once per step
    losses: dict[str, float] = {}

    def train_content(key: str) -> RecordDict:
        ask = ask_of[key]
        if id(ask.model) not in encoded:
            encoded[id(ask.model)] = protocol.to_array_record(ask.model)
        return RecordDict({protocol.CONFIG: protocol.config_record({**driver.train_config, **ask.config}),
                           protocol.ARRAYS: encoded[id(ask.model)]})

    def exchange(stage: str, asks: dict[Any, dict[str, dict[str, object]]]) -> dict[Any, dict[str, Any]]:
        contents = {key: wire.ask_content(ask, train_content(key) if stage == wire.COLLECT else None)
                    for by_member in asks.values() for key, ask in by_member.items()}
        received = link.send_contents(server_round, contents, MessageType.TRAIN,
                                      phase=f"secure aggregation ({stage})")
        out: dict[Any, dict[str, Any]] = {}
        for group, by_member in asks.items():
            out[group] = {}
            for key in by_member:
                if key in received:
                    out[group][key] = _protocol_reply(driver, server_round, key, stage, received[key], losses)
        return out

    outcome = run_groups(protocols, exchange)
    sums = SecureSums()
    for cluster, result in outcome.items():
        ledger = protocols[cluster].ledger
        down = sum(sum(by.values()) for by in ledger.down.values())
        up = sum(sum(by.values()) for by in ledger.up.values())
        if isinstance(result, SecAggError):
            sums[cluster] = str(result)
            continue
        sent = ask_of[result.members[0]].model if result.members else {}
        try:
            mean = _model_mean(result, driver.shapes)
        except ValueError as error:
            sums[cluster] = f"secure aggregation of cluster {cluster}: {error}; its model is kept"
            continue
        members = [str(m) for m in result.members]
        sums[cluster] = GroupSum(cluster, members, mean, sent, result.total_weight, result.clipped,
                                 {str(k): v for k, v in result.dropped.items()},
                                 {k: losses[k] for k in members if k in losses}, down, up)
        driver.round_accepted += len(members)
        driver.accepted_train += len(members)
        driver.round_train_metrics.extend((k, 1, {"train-loss": losses[k]}) for k in members if k in losses)
    return sums


def _protocol_reply(driver: Any, server_round: int, key: str, stage: str, content: RecordDict,
                    losses: dict[str, float]) -> dict[str, object] | None:
    """The protocol's part of a reply (None: rejected, the member drops). A reply that
    carries arrays in the clear is rejected without reading them."""
    clear = [name for name, record in content.items() if name != wire.MASKED and hasattr(record, "to_numpy_ndarrays")
             and len(record)]
    if clear or wire.RECORD not in content:
        why = (f"it carries arrays in the clear ({', '.join(clear)}): is clusterfed.secagg.secagg_mod among the "
               f"ClientApp's mods?" if clear else "it has no secure-aggregation record: is "
               "clusterfed.secagg.secagg_mod among the ClientApp's mods?")
        driver.link.reject(server_round, key, ReplyRejected(f"secure aggregation {stage} reply refused: {why}",
                                                            "secagg"))
        return None
    if stage == wire.COLLECT and protocol.METRICS in content:
        loss = content[protocol.METRICS].get("train-loss", content[protocol.METRICS].get("train_loss"))
        if isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss):
            losses[key] = float(loss)
    return wire.reply_from_content(content)


def _model_mean(result: GroupResult, shapes: dict[str, tuple[tuple[int, ...], Any]]) -> Arrays:
    """The group's mean as the model's arrays, each in the model's dtype (integers rounded,
    bools by weighted majority, True on a tie); ValueError when the members returned other
    arrays than the model's."""
    means = result.means.get(protocol.ARRAYS, {})
    if set(means) != set(shapes):
        raise ValueError(f"the members returned arrays {sorted(means)[:5]}, not the model's {sorted(shapes)[:5]}")
    out = {}
    for name, (shape, dtype) in shapes.items():
        mean = np.asarray(means[name]).reshape(shape)
        dtype = np.dtype(dtype)
        if dtype == np.bool_:
            out[name] = np.asarray(mean >= 0.5)
        elif dtype.kind in "iu":
            out[name] = np.rint(mean).astype(dtype)
        else:
            out[name] = mean.astype(dtype)
    return out
