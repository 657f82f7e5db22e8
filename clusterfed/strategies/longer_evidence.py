"""Longer evidence for the CFL family's splits (beyond the papers, ``evidence-trainings``).

Sattler et al.'s split compares one local training's updates. Where a cluster's groups differ
little within one training (a few epochs from a model that has not yet learnt them), those updates
show no more structure than group-free updates of the same shape, and the structure test rightly
refuses the split. A longer training shows the groups where one does not (measured on spent
held-out cells: ``benchmarks/results/model-fuzz/dev-longer-evidence``). So a cluster whose split
was refused for want of structure (``STRUCTURE_REASONS``) has its repliers asked, in the same
round, to train ``k − 1`` more times in a row, each request starting from the client's own last
reply: a stock ClientApp trains its own epochs and returns what it was asked for, so the chain asks
nothing new of it (FedClust's clustering exchange chains the same way). These trainings are for
the decision's evidence only, never averaged. The split is then judged again on each client's
update over the ``k`` trainings by the same tests (``cfl.decide_on_chain``), its reproduction on
the chain's two halves (trainings ``1..k/2`` and ``k/2+1..k``: independent SGD draws from
different starts) in place of two rounds'.

Once per cluster (a split's children have their own try, unless the chain already judged them):
a federation with no groups pays ``k − 1`` trainings of each replier once, when its first split is
refused. Off at ``evidence-trainings = 1``, under ``split-timing = criteria``, and with compact
(sketched) update storage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clusterfed.core.exchange import Arrays, Diagnostics, Steps, TrainReply, natural

# the refusals a longer training may overturn: the cut scored no better than noise
STRUCTURE_REASONS = frozenset({"silhouette", "group_free", "reference"})


@dataclass
class Chain:
    """The chained trainings of one cluster's repliers (``keys``, those that answered every
    request): ``first``, their replies to the round's own training (what they were sent, the
    cluster's model); ``halves``, each one's update over the first ``trainings // 2`` trainings
    and over the rest (summed as they arrive: two arrays per client, whatever the length)."""

    trainings: int
    keys: list[str]
    first: dict[str, TrainReply]
    halves: tuple[dict[str, Arrays], dict[str, Arrays]] = field(default_factory=lambda: ({}, {}))
    lost: list[str] = field(default_factory=list)  # repliers that failed a request of the chain
    bytes_up: int = 0

    @property
    def source(self) -> str:
        h = self.trainings // 2
        return f"the chain's halves (trainings 1–{h} and {h + 1}–{self.trainings})"

    def total(self, key: str) -> Arrays:
        """``key``'s update over all the trainings."""
        return add(self.halves[0][key], self.halves[1][key])


def due(strategy: Any, rnd: Any, replies: list[TrainReply], refused: list[dict[str, Any]]) -> dict[int, list[TrainReply]]:
    """The clusters to chain this round, each with its repliers: refused for want of structure
    (``refused_splits``), still leaves, never chained, with at least ``min-split-size`` repliers.
    Empty when the setting is off, splits are not on evidence, vectors are sketched, the round may
    not ask a further exchange (Flower's single-phase hooks drive it) or the layer choice waits."""
    state, params = strategy.state, strategy.params
    wait = strategy.chain_rules().get("wait")
    if (params.evidence_trainings < 2 or rnd.one_exchange or not strategy.bipartition.evidence(state)
            or state.sketched or (wait is not None and wait(state))):
        return {}
    groups: dict[int, list[TrainReply]] = {}
    for reply in replies:
        if state.assignment.get(reply.key) == reply.cluster:
            groups.setdefault(reply.cluster, []).append(reply)
    refused_clusters = dict.fromkeys(r.get("cluster") for r in refused if r.get("reason") in STRUCTURE_REASONS)
    return {c: groups[c] for c in refused_clusters
            if c in groups and c not in state.chained and c in state.models and state.tree.node(c).is_leaf
            and len(groups[c]) >= params.min_split_size}


def add(a: Arrays, b: Arrays) -> Arrays:
    return {k: a[k] + b[k] for k in a}


def chain(train_asks: Callable[..., list], rnd: Any, replies: list[TrainReply], trainings: int) -> Steps:
    """Ask the ``replies``' clients to train ``trainings − 1`` more times, each request from its
    own last weights, for evidence only; returns the ``Chain`` of those that answered all."""
    first = {r.key: r for r in sorted(replies, key=lambda r: natural(r.key))}
    found = Chain(trainings, [], first)
    h = trainings // 2
    found.halves[0].update({k: r.update for k, r in first.items()})
    weights = {k: r.weights for k, r in first.items()}
    for link in range(1, trainings):
        keys = [k for k in first if k in weights]
        if not keys:
            break
        received = yield train_asks(rnd, keys, models=weights, evidence=True)
        found.bytes_up += received.bytes_up
        weights = {}
        half = found.halves[0 if link < h else 1]
        for reply in received:
            half[reply.key] = add(half[reply.key], reply.update) if reply.key in half else reply.update
            weights[reply.key] = reply.weights
    for key in first:
        if key in weights:  # it answered the last request, and so every one
            found.keys.append(key)
        else:
            found.lost.append(key)
            found.halves[0].pop(key, None)
            found.halves[1].pop(key, None)
    return found


def after_refusals(strategy: Any, rnd: Any, groups: dict[int, list[TrainReply]], diagnostics: Diagnostics,
                   decide_on_chain: Callable[..., Diagnostics | None]) -> Steps:
    """The clusters ``due`` this round (``groups``: each with its repliers) judged again on a chain
    of ``evidence-trainings`` trainings (``decide_on_chain(strategy, rnd, cluster, chain)``); the
    round's diagnostics with what the chain found (``evidence_chains``, splits, words). The
    clusters share one chain: ``evidence-trainings − 1`` exchanges, whatever their number."""
    state, params = strategy.state, strategy.params
    clusters = list(groups)
    state.chained.update(clusters)
    asked = [r for cluster in clusters for r in groups[cluster]]
    found = yield from chain(strategy.train_asks, rnd, asked, params.evidence_trainings)  # one chain for all
    words = []
    for cluster in clusters:
        decided = decide_on_chain(strategy, rnd, cluster, found) or {}
        for key, records in decided.items():
            if key != "words":
                diagnostics.setdefault(key, []).extend(records)
        lost = [r.key for r in groups[cluster] if r.key in found.lost]
        lost_words = f", {len(lost)} lost on the way" if lost else ""
        said = "; ".join(decided.get("words", [])) or "nothing to judge"
        words.append(f"cluster {cluster} asked {found.trainings - 1} more trainings in a row of its "
                     f"{len(groups[cluster])} repliers{lost_words}: {said}")
    chains = [{"clusters": clusters, "trainings": found.trainings, "clients": len(found.keys), "lost": found.lost,
               "bytes_up": found.bytes_up}]
    diagnostics["evidence_chains"] = chains
    said = f"{type(strategy).__name__} on longer evidence: " + "; ".join(words)
    diagnostics["decision"] = "; ".join(t for t in (diagnostics.get("decision"), said) if t)
    diagnostics["last_split_round"] = state.final_clustering_round
    return diagnostics
