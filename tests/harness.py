"""Drive an algorithm without Flower: hand it clients, answer its asks with arrays."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from clusterfed.config import parse_config
from clusterfed.core.exchange import CHOICE, Arrays, Ask, ClientInfo, Replies, Round, TrainReply, natural, unpack_model

# a tiny "model": conv, fc1 (the smallest fc) and a final fc2 layer
SHAPES = {"conv1.weight": (2, 1, 3, 3), "conv1.bias": (2,), "fc1.weight": (3, 4), "fc1.bias": (3,),
          "fc2.weight": (4, 3), "fc2.bias": (4,)}


def theta0(value: float = 0.0) -> Arrays:
    return {name: np.full(shape, value, dtype=np.float32) for name, shape in SHAPES.items()}


@dataclass
class Hand:
    """What a driver hands a hand-driven strategy each round (``round_of``): the client table,
    the active client keys and the train config. A test changes them between rounds."""

    clients: dict[str, ClientInfo] = field(default_factory=dict)
    active: list[str] = field(default_factory=list)
    train_config: dict = field(default_factory=dict)


_HANDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def hand(algorithm) -> Hand:
    """The ``Hand`` of ``algorithm`` (a new, empty one the first time)."""
    if algorithm not in _HANDS:
        _HANDS[algorithm] = Hand()
    return _HANDS[algorithm]


def round_of(algorithm, server_round: int, **changes) -> Round:
    """The ``Round`` a driver would hand ``algorithm`` in ``server_round``: its hand's active keys,
    train config and client table (read-only), ``changes`` (a Round's fields) on top."""
    given = hand(algorithm)
    values = {"active": list(given.active), "train_config": dict(given.train_config),
              "clients": MappingProxyType(given.clients), **changes}
    return Round(server_round, **values)


def make(cls, groups: dict[str, int], *, examples: dict[str, int] | None = None, stats=None, lr: float = 0.05,
         **config):
    """An initialised algorithm knowing ``groups`` (key -> true group) as active clients.
    ``config``: run-config keys in snake case, flat (today's) or the strategy's own."""
    values = {"num-clients": len(groups), "out-dir": "/tmp/unused", "strategy": cls.name}
    values.update({k.replace("_", "-"): v for k, v in config.items()})
    algorithm = parse_config(values).build_strategy()
    assert type(algorithm) is cls
    given = hand(algorithm)
    given.train_config = {"lr": lr, "local-epochs": 1}
    algorithm.init(theta0(), given.train_config)
    for key, group in groups.items():
        given.clients[key] = ClientInfo(key, (examples or {}).get(key, 50), group, dict((stats or {}).get(key, {})))
    given.active = list(groups)
    return algorithm


def choice_of(ask: Ask) -> int:
    """The model a harness client picks from a multi-model (IFCA) ask: its key modulo K
    (keys 0..5 of two groups pick their group)."""
    return natural(ask.key)[0] % ask.choices


def reply_to(ask: Ask, arrays: Arrays, num_examples: int = 50, metrics: dict | None = None,
             train_loss: float = 1.0) -> TrainReply:
    metrics = dict(metrics or {})
    if ask.choices and CHOICE not in metrics:
        metrics[CHOICE] = choice_of(ask)
    cluster, sent = ask.chosen(metrics)
    return TrainReply(key=ask.key, cluster=cluster, arrays=arrays, sent={n: sent[n] for n in arrays},
                      num_examples=num_examples, train_loss=train_loss, metrics=metrics,
                      is_update=ask.config.get("return") == "update")


Respond = Callable[[Ask], "Arrays | None"]


class Batches(list):
    """Every batch of asks a round made, in order, the ``diagnostics`` the round returned and
    the ``round`` (its ``Round``: the sample, the reports)."""

    diagnostics: dict = {}
    round: Round | None = None


def drive_round(algorithm, server_round: int | Round, respond: Respond,
                examples: dict[str, int] | None = None) -> Batches:
    """Run one round (``server_round``: its number, the Round built by ``round_of``, or a Round);
    ``respond(ask)`` gives the arrays a client returns (None: no reply). Returns every batch of
    asks the algorithm made, in order, with the round's diagnostics and its Round."""
    batches = Batches()
    rnd = server_round if isinstance(server_round, Round) else round_of(algorithm, server_round)
    batches.round = rnd
    steps = algorithm.round(rnd)
    try:
        asks = next(steps)
        while True:
            batches.append(asks)
            replies = Replies()
            for ask in asks:
                arrays = respond(ask)
                metrics, loss = {}, 1.0
                if isinstance(arrays, tuple):  # (arrays, metrics[, train loss])
                    arrays, metrics, *rest = arrays
                    loss = rest[0] if rest else loss
                if arrays is not None:
                    replies.append(reply_to(ask, arrays, (examples or {}).get(ask.key, 50), metrics, loss))
                    replies.bytes_up += sum(a.nbytes for a in arrays.values())
            asks = steps.send(replies)
    except StopIteration as done:
        batches.diagnostics = done.value
    return batches


def trained(ask: Ask, shift: float) -> Arrays:
    """What a client returns: the asked arrays of its model moved by ``shift`` (weights or update)."""
    model = unpack_model(ask.model, choice_of(ask)) if ask.choices else ask.model
    names = ask.upload or list(model)
    if ask.config.get("return") == "update":
        return {n: np.full_like(model[n], shift) for n in names}
    return {n: model[n] + np.float32(shift) for n in names}


def capture_algorithms(monkeypatch) -> list:
    """Make ``run_server`` hand every algorithm it builds to the returned list."""
    from clusterfed.config import RunConfig

    build = RunConfig.build_strategy
    captured = []

    def capture(config, recorder=None):
        strategy = build(config, recorder)
        captured.append(strategy)
        return strategy

    monkeypatch.setattr(RunConfig, "build_strategy", capture)
    return captured
