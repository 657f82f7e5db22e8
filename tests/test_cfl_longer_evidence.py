"""The CFL family's longer evidence (``strategies/longer_evidence.py``, ``evidence-trainings``):
a split refused because one training's updates show no structure is judged again, in the same
round, on a chain of trainings of the cluster's repliers, each request from the client's own last
reply, for evidence only; reproduced on the chain's halves."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from harness import hand, round_of

from clusterfed.config import parse_config
from clusterfed.core.exchange import ClientInfo, Replies, TrainReply
from clusterfed.strategies.base import steps
from clusterfed.strategies.cfl import CFL
from clusterfed.strategies.layercfl import LayerCFL

DIM = 400
KEYS = [str(i) for i in range(12)]
GROUP = {k: i % 3 for i, k in enumerate(KEYS)}  # 3 groups of 4, interleaved in key order
# each training moves a client along the task's shared direction, its group's (too weak to show in
# one training's updates, clear in four's) and fresh noise
SHARED, SIGNAL, NOISE = 0.3, 0.25, 1.0


def make(cls=CFL, **config):
    values = {"num-clients": len(KEYS), "out-dir": "/tmp/unused", "strategy": cls.name, "seed": 0,
              f"{cls.name}.min-split-round": 2}
    values.update({f"{cls.name}.{k.replace('_', '-')}": v for k, v in config.items()})
    strategy = parse_config(values).build_strategy()
    given = hand(strategy)
    given.train_config = {"lr": 0.05, "local-epochs": 1}
    strategy.init({"w": np.zeros(DIM, dtype=np.float32)}, given.train_config)
    for key in KEYS:
        given.clients[key] = ClientInfo(key, 50, GROUP[key])
    given.active = list(KEYS)
    assert list(steps(strategy.admit(round_of(strategy, 1), list(KEYS)))) == []
    return strategy


class Clients:
    """Every training's update: ``SHARED`` along one direction, ``signal`` along its group's, and
    fresh noise of norm ``NOISE``; ``groups`` False: one task (no group direction)."""

    def __init__(self, seed: int, signal: float = SIGNAL, groups: bool = True, failing: set[str] = frozenset()):
        rng = np.random.default_rng(seed)
        self.rng, self.signal, self.groups, self.failing = rng, signal, groups, failing
        self.directions = rng.standard_normal((4, DIM)) / np.sqrt(DIM)
        self.trainings: dict[str, int] = {}
        self.chain_asks: list[list] = []

    def update(self, key: str) -> np.ndarray:
        self.trainings[key] = self.trainings.get(key, 0) + 1
        group = self.directions[1 + GROUP[key]] if self.groups else 0.0
        return (SHARED * self.directions[0] + self.signal * np.sqrt(DIM) * group * 0.1
                + NOISE * self.rng.standard_normal(DIM) / np.sqrt(DIM)).astype(np.float32)

    def reply(self, strategy, key: str, sent) -> TrainReply:
        return TrainReply(key=key, cluster=strategy.assignment[key], arrays={"w": self.update(key)}, sent=sent,
                          num_examples=50, train_loss=0.0, metrics={}, is_update=True)

    def round(self, strategy, server_round: int, **changes) -> dict:
        """One round: every client trains its cluster's model, then whatever ``after_train`` asks."""
        replies = [self.reply(strategy, k, strategy.models[strategy.assignment[k]]) for k in KEYS]
        found = strategy.after_train(round_of(strategy, server_round, **changes), replies)
        if not isinstance(found, Iterator):
            return found or {}
        try:
            asks = next(found)
            while True:
                self.chain_asks.append(asks)
                asks = found.send(Replies([self.reply(strategy, a.key, a.model) for a in asks if a.key not in self.failing],
                                          bytes_up=4 * DIM * len(asks)))
        except StopIteration as done:
            return done.value


def truth(strategy) -> float:
    from sklearn.metrics import adjusted_rand_score

    return adjusted_rand_score([GROUP[k] for k in KEYS], [strategy.assignment[k] for k in KEYS])


@pytest.mark.parametrize("cls", [CFL, LayerCFL])
def test_groups_one_training_cannot_show_are_split_on_a_chain_of_four(cls):
    off, clients = make(cls, evidence_trainings=1), Clients(0)
    for server_round in range(1, 7):
        clients.round(off, server_round)
    assert off.state.splits == [] and clients.chain_asks == []  # one training's updates never show the groups
    assert {r["reason"] for r in off.state.refused} == {"silhouette"}

    on, clients = make(cls), Clients(0)
    clients.round(on, 1)
    found = clients.round(on, 2)
    assert truth(on) == 1.0 and len(on.state.splits) == 2  # the root, then its mixed child, on the same chain
    assert len(clients.chain_asks) == 3  # trainings 2, 3 and 4 of the chain
    for split in on.state.splits:
        assert split["trainings"] == 4 and split["reproduction"]["source"].startswith("the chain's halves")
        assert split["reproduction"]["agreement"] >= on.params.split_agreement
    assert found["evidence_chains"] == [{"clusters": [0], "trainings": 4, "clients": 12, "lost": [],
                                         "bytes_up": 3 * 4 * DIM * 12}]
    assert "asked 3 more trainings in a row of its 12 repliers" in found["decision"]
    assert "split into" in found["decision"]


def test_each_request_of_the_chain_starts_from_the_clients_own_last_reply_for_evidence_only():
    strategy, clients = make(), Clients(1)
    clients.round(strategy, 1)
    sent = strategy.models[0]["w"].copy()
    replies = []
    original = clients.reply

    def recording(strategy_, key, model):
        reply = original(strategy_, key, model)
        replies.append(reply)
        return reply

    clients.reply = recording
    clients.round(strategy, 2)
    first = {r.key: r for r in replies[:len(KEYS)]}
    asks = clients.chain_asks[0]
    assert sorted(a.key for a in asks) == sorted(KEYS) and all(a.evidence for a in asks)
    for ask in asks:  # the round's model plus the client's own update, not the cluster's model
        np.testing.assert_allclose(ask.model["w"], sent + first[ask.key].arrays["w"], rtol=1e-6)
    for later, earlier in zip(clients.chain_asks[1:], clients.chain_asks):
        assert [a.key for a in later] == [a.key for a in earlier]
        assert not any(np.array_equal(a.model["w"], b.model["w"]) for a, b in zip(later, earlier))


def test_one_task_is_asked_once_and_stays_one_cluster():
    strategy, clients = make(), Clients(0, groups=False)
    for server_round in range(1, 7):
        found = clients.round(strategy, server_round)
    assert strategy.state.splits == [] and set(strategy.assignment.values()) == {0}
    assert len(clients.chain_asks) == 3  # one chain, in round 2, never again for that cluster
    chained = [r for r in strategy.state.refused if r.get("trainings") == 4]
    assert len(chained) == 1 and chained[0]["round"] == 2
    assert "evidence_chains" not in found  # round 6: no chain
    reason = strategy.one_cluster_reason()
    assert "judged again on 4 trainings in a row (round 2, cluster 0): best-cut silhouette" in reason
    # the closest refusal it quotes is one training's, not the chain's again
    closest = max((r for r in strategy.state.refused if not r.get("trainings")),
                  key=lambda r: r["best_cut_silhouette"] - r["required_silhouette"])
    assert f"closest refusal: round {closest['round']}, cluster 0" in reason


def test_a_client_lost_on_the_chain_is_left_out_and_the_others_judged():
    strategy, clients = make(), Clients(0, failing={"0"})
    clients.round(strategy, 1)
    found = clients.round(strategy, 2)
    chain = found["evidence_chains"][0]
    assert chain["lost"] == ["0"] and chain["clients"] == 11
    assert all(a.key != "0" for a in clients.chain_asks[1])  # not asked again once it failed
    assert "1 lost on the way" in found["decision"]
    first = strategy.state.splits[0]
    # not compared: placed as a member absent from the split is, by its one training's update
    assert "0" in first["absent"][0] + first["absent"][1]
    assert truth(strategy) == 1.0


@pytest.mark.parametrize("config", [{"evidence_trainings": 1}, {"split_timing": "criteria"}])
def test_off_and_under_the_papers_timing_nothing_more_is_asked(config):
    strategy, clients = make(**config), Clients(0)
    for server_round in range(1, 5):
        clients.round(strategy, server_round)
    assert clients.chain_asks == []


def test_a_round_driven_by_flowers_single_phase_hooks_asks_no_chain():
    strategy, clients = make(), Clients(0)
    clients.round(strategy, 1)
    replies = [clients.reply(strategy, k, strategy.models[0]) for k in KEYS]
    found = strategy.after_train(round_of(strategy, 2, one_exchange=True), replies)
    assert not isinstance(found, Iterator)
    assert strategy.state.splits == [] and strategy.state.chained == set()


def test_the_papers_presets_train_once():
    assert CFL.paper().params.evidence_trainings == 1 and LayerCFL.paper().params.evidence_trainings == 1
    assert CFL().params.evidence_trainings == 4


@pytest.mark.end_to_end
def test_a_whole_run_asks_its_chain_through_the_driver_and_counts_its_bytes(small_config, tmp_path):
    """Digits, 20 identically distributed clients: the split refused in round 5 (min-split-round)
    is judged again on a chain of 4 trainings through the round driver; the round uploads its
    training and the chain's 3 requests, 4 times a training round's bytes; one cluster at the end,
    and the reason says what the chain found."""
    import json

    from clusterfed.simulation import simulate

    config = small_config(strategy="cfl", partitioner="iid", num_clients=20, rounds=6, batch_size=16)
    simulate(config, engine="inprocess", stream=None)
    rounds = [json.loads(line) for line in open(f"{config.out_dir}/rounds.jsonl")]
    chained = [r for r in rounds if r.get("evidence_chains")]
    assert [r["round"] for r in chained] == [5]
    chain = chained[0]["evidence_chains"][0]
    assert chain["clusters"] == [0] and chain["trainings"] == 4 and chain["clients"] == 20 and chain["lost"] == []
    assert rounds[4]["bytes_up"] == 4 * rounds[3]["bytes_up"] == 4 * rounds[5]["bytes_up"]
    assert chain["bytes_up"] == 3 * rounds[3]["bytes_up"]
    assert "CFL on longer evidence: cluster 0 asked 3 more trainings in a row of its 20 repliers" in \
        chained[0]["decision"]
    clusters = json.load(open(f"{config.out_dir}/clusters.json"))
    assert clusters["splits"] == []
    assert "judged again on 4 trainings in a row (round 5, cluster 0)" in clusters["one_cluster_reason"]
