"""Flower's single-phase hooks (``configure_train`` / ``aggregate_train`` /
``configure_evaluate``) for a clustered strategy driven by Flower's own ``Strategy.start``
loop or a user's: they run the strategy's own round (``round_steps``, the generator the
driver runs in ``start``), one exchange of it per Flower round.

``configure_train`` starts the round and sends its first exchange, which must be training
(each placed trainer its own cluster's model); ``aggregate_train`` validates the replies and
hands them back to the round, which aggregates per cluster and returns. Those hooks have one
exchange per round, so a round whose first exchange is not training (a clustering or
placement step asking clients for work) is refused before any message is sent, and a round
that asks for a second exchange (IFCA's restarts) is refused when it asks: both with one
``StrategyParamsError`` naming ``strategy.start``, which runs such rounds. A strategy that
needs more than a stock ClientApp refuses stock clients here as ``start`` does
(``CapabilityError``). The round's diagnostics are logged at DEBUG level: Flower's loop
keeps no rounds.jsonl.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, Message, MessageType, MetricRecord
from flwr.supercore import log

from clusterfed.runner.scoring import weighted_metrics
from clusterfed.core.contract import StrategyParamsError
from clusterfed.core.exchange import TRAINING_PHASES, Ask, natural, SecureTrain

if TYPE_CHECKING:
    from clusterfed.runner.driver import OpenRound, RoundDriver

START_INSTEAD = "call strategy.start(grid=..., initial_arrays=..., num_rounds=...) instead"


@dataclass
class PendingRound:
    """A round between ``configure_train`` and ``aggregate_train``: the round the driver opened,
    paused at its first exchange, and that exchange's asks by client key."""

    opened: OpenRound
    asks: dict[str, Ask] = field(default_factory=dict)


def train_messages(driver: RoundDriver, server_round: int, config: dict[str, Any]) -> list[Message]:
    """The train messages of ``Strategy.configure_train``: the round's first exchange, each
    placed trainer its cluster's model; StrategyParamsError, before anything is sent, when
    that exchange is not training."""
    strategy = driver.strategy
    driver.set_configs(config, driver.evaluate_config)
    opened = driver.open_round(server_round, check_capabilities=True, one_exchange=True)
    driver.pending = None
    started = time.perf_counter()
    try:
        asks = next(opened.steps)
    except StopIteration as done:  # a round that asks nothing: it is over already
        log(logging.DEBUG, "round %s diagnostics: %s", server_round, driver.close_round(opened, done.value))
        return []
    finally:
        driver.strategy_seconds += time.perf_counter() - started
    if isinstance(asks, SecureTrain):
        opened.steps.close()
        raise StrategyParamsError(
            f"{strategy.name}: secure_aggregation runs four exchanges per training step (SecAgg+'s setup, "
            f"share-keys, collect, unmask), which Flower's single-phase configure_train/aggregate_train cannot "
            f"run (nothing was sent); {START_INSTEAD}")
    phases = sorted({str(ask.config.get("phase", "train")) for ask in asks} - set(TRAINING_PHASES))
    if phases:
        opened.steps.close()
        raise StrategyParamsError(
            f"{strategy.name}: round {server_round} first asks {len(asks)} client(s) for {' and '.join(phases)} work "
            f"before training (a clustering or placement step), which Flower's single-phase configure_train/"
            f"aggregate_train cannot run (nothing was sent); {START_INSTEAD}")
    driver.pending = PendingRound(opened, {ask.key: ask for ask in asks})
    return driver.link.messages(server_round, driver.plan(asks), MessageType.TRAIN)[0]


def aggregate_train_messages(driver: RoundDriver | None, server_round: int,
                             replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """The replies to ``train_messages`` validated and handed back to the round, which
    aggregates them; the largest cluster's model and the train metrics averaged by num-examples."""
    pending = driver.pending if driver is not None else None
    if pending is None:
        raise StrategyParamsError("aggregate_train before configure_train: call configure_train first, or use start()")
    driver.pending = None
    strategy, asks, steps = driver.strategy, pending.asks, pending.opened.steps
    good = driver.accept(server_round, list(asks.values()), received_contents(driver, server_round, asks, replies))
    started = time.perf_counter()
    try:
        more = steps.send(good)
    except StopIteration as done:
        result = done.value
    else:
        steps.close()
        raise StrategyParamsError(
            f"{strategy.name}: round {server_round} asks {len(more)} client(s) for a second exchange after its first "
            f"(a round that tries several starts, say), which Flower's single-phase configure_train/aggregate_train "
            f"cannot run; {START_INSTEAD}")
    finally:
        driver.strategy_seconds += time.perf_counter() - started
    log(logging.DEBUG, "round %s diagnostics: %s", server_round, driver.close_round(pending.opened, result))
    return driver.largest_cluster_record(), weighted_metrics([(r.key, r.num_examples, r.metrics) for r in good
                                                              if not asks[r.key].evidence])  # what was averaged


def received_contents(driver: RoundDriver, server_round: int, asks: dict[str, Ask],
                      replies: list[Message]) -> dict[str, Any]:
    """The contents of the replies to ``asks`` by client key; error replies and asks with no
    reply are counted as the driver's link counts them (the driver validates the rest)."""
    members, received = driver.members, {}
    for message in replies:
        key = members.key_of_node.get(message.metadata.src_node_id)
        if key not in asks or key in received:
            continue
        if message.has_error():
            driver.link.fail(server_round, "error", message.error.reason, key, message.metadata.src_node_id)
            received[key] = None
            continue
        received[key] = message.content
    for key in sorted(set(asks) - set(received), key=natural):  # Flower's loop hands over the replies it got in time
        driver.link.fail(server_round, "timeout", "no reply within the ServerApp loop's timeout", key,
                         members.node_of_key.get(key))
    return {key: content for key, content in received.items() if content is not None}


def evaluate_messages(driver: RoundDriver, server_round: int, config: dict[str, Any]) -> list[Message]:
    """The evaluate messages of ``Strategy.configure_evaluate``: each sampled placed client its cluster's model."""
    models = driver.strategy.evaluation_models(server_round, driver.round_active)
    return driver.link.messages(server_round, driver.evaluate_plan(server_round, models, config),
                                MessageType.EVALUATE)[0]
