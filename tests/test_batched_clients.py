"""Runs that do not depend on the order replies arrive in, and the in-process engine's batched
client executor (clients of one round trained together with torch.func) against the clients
trained one after another."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from clusterfed.strategies.exchange import TrainReply, difference, weighted_average

import harness


def _replies(seed: int, count: int = 7, update: bool = False, dtype=np.float32) -> list[TrainReply]:
    rng = np.random.default_rng(seed)
    sent = {n: rng.standard_normal(s).astype(dtype) for n, s in harness.SHAPES.items()}
    out = []
    for i in range(count):
        trained = {n: (a + rng.standard_normal(a.shape) * 10.0 ** -rng.integers(1, 7)).astype(dtype)
                   for n, a in sent.items()}
        arrays = {n: difference(trained[n], sent[n]) for n in trained} if update else trained
        out.append(TrainReply(key=str(i), cluster=0, arrays=arrays, sent=sent, num_examples=int(rng.integers(1, 90)),
                              train_loss=float(rng.random()), metrics={}, is_update=update))
    return out


def _aggregate(replies: list[TrainReply]) -> dict[str, np.ndarray]:
    from clusterfed import FedAvg

    algorithm = harness.make(FedAvg, {r.key: 0 for r in replies})
    algorithm.models[0] = dict(replies[0].sent)
    algorithm.aggregate_clusters(replies)
    return algorithm.models[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_clusters_aggregate_is_bit_identical_whatever_order_its_replies_arrive_in(dtype):
    replies = _replies(0, dtype=dtype)
    want = _aggregate(replies)
    for seed in range(5):
        shuffled = list(replies)
        random.Random(seed).shuffle(shuffled)
        got = _aggregate(shuffled)
        assert all(np.array_equal(got[n], want[n]) and got[n].dtype == want[n].dtype for n in want)
    if dtype is np.float32:
        return
    # float64 models: summed in list order, the same replies give other last bits (float32 ones
    # seldom do, being summed in float64): the fixed order is what makes them equal
    counts = [r.num_examples for r in replies]
    reversed_sum = weighted_average([r.arrays for r in replies[::-1]], counts[::-1])
    assert any(not np.array_equal(reversed_sum[n], weighted_average([r.arrays for r in replies], counts)[n])
               for n in want)


def test_replies_of_updates_and_of_weights_aggregate_to_the_same_bits():
    """CFL asks for updates, FedAvg for weights: the same training gives the same model, though
    sent + update rounded back to float32 is not always the trained weight."""
    weights, updates = _replies(1), _replies(1, update=True)
    assert any(not np.array_equal(a.arrays[n], b.weights[n]) for a, b in zip(weights, updates) for n in a.arrays)
    got, want = _aggregate(updates), _aggregate(weights)
    assert all(np.array_equal(got[n], want[n]) for n in want)


def test_a_run_is_bit_identical_when_its_replies_come_shuffled(small_config, tmp_path, monkeypatch):
    """Every round's validated replies are handed to the strategy shuffled (the order a
    SuperLink delivers them in is not fixed), and every recorded number stays the same."""
    from clusterfed.runner.driver import RoundDriver
    from clusterfed.simulation import simulate

    def rows(out):
        return [{k: v for k, v in json.loads(line).items() if "second" not in k}
                for line in (out / "rounds.jsonl").read_text().splitlines()]

    train, order = RoundDriver.train, random.Random(3)

    def shuffled_train(self, server_round, asks):
        replies = train(self, server_round, asks)
        order.shuffle(replies)
        return replies

    runs = {}
    for label in ("in order", "shuffled"):
        if label == "shuffled":
            monkeypatch.setattr(RoundDriver, "train", shuffled_train)
        config = small_config(strategy="fedavg", num_clients=8, rounds=3, out_dir=str(tmp_path / label),
                              client_batching="off")
        simulate(config, engine="inprocess", stream=None)
        runs[label] = rows(tmp_path / label)
    assert runs["in order"] == runs["shuffled"]
