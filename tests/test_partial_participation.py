"""Partial participation (``fraction-train`` < 1) for every registered strategy: each round
trains exactly its sample (the CFL family's top-up of a cluster that may split, and the one-shot
clustering step asking every active client, have tests of their own), no client is ever left in a cluster without a model, clients not
sampled yet are placed when first sampled, the clustered strategies still recover the true
groups, a split assigns the members that sat the split round out, and evaluation with
``fraction-evaluate`` < 1 records what it measured. Short in-process runs on digits plus
hand-made replies for the split rules."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from harness import drive_round, hand, make, reply_to, round_of, trained
from test_cfl import DIM, arrays_of, hierarchical_updates, make_strategy, run_round

from clusterfed.config import parse_config
from clusterfed.core.exchange import Replies
from clusterfed.results import covered, summarize
from clusterfed.runner.driver import RoundDriver
from clusterfed.simulation import simulate
from clusterfed.strategies import MULTI_MODEL, clustered_classes, strategy_class
from clusterfed.strategies.adacfl import AdaCFL
from clusterfed.strategies.base import ClusteredStrategy, steps
from clusterfed.strategies.cfl import CFL
from clusterfed.strategies.hicfl import HiCFL
from clusterfed.strategies.oneshot import OneShotState
from clusterfed.strategies.selection import ClientSelection

CLIENTS = 12
FRACTION = 0.5
SAMPLE = int(CLIENTS * FRACTION)
# three groups of digit pairs, four clients each (test_fedclust.py's structured setting)
BASE = {"num-clients": CLIENTS, "partitioner": "label-groups", "label-groups": "0,1;2,3;4,5", "batch-size": 32,
        "fraction-train": FRACTION, "fraction-evaluate": 1.0, "rounds": 3}
# criteria that always fire (tests/golden/make_golden.py) from round 4, on at least 5 replies
FORCE = {"split-criteria": "absolute", "eps1": 100.0, "eps2": 0.001, "min-split-round": 4, "min-split-size": 5}
# CFL and LayerCFL on the criteria's timing: these 7 rounds check where half the clients go at a
# split, not when evidence allows one (a cluster's 5 to 7 repliers a round meet too rarely for it
# here; test_cfl_evidence.py checks splits on evidence at partial participation)
CRITERIA = {**FORCE, "split-timing": "criteria"}
ROTATION = {"partitioner": "rotation", "rotations": "0,180", "num-groups": 2}
# what a strategy needs to show its groups in these short runs, and the ARI its final
# assignment must then reach; any other registered strategy gets the default run (BASE, no
# groups to check): a new strategy is checked here without an entry
TUNED: dict[str, tuple[dict, float | None]] = {
    "oracle": ({}, 1.0),
    "fedclust": ({"rounds": 4, "cluster-epochs": 5}, 0.9),
    "adacfl": ({"rounds": 4, "cluster-epochs": 5}, 0.9),
    "cfl": ({**CRITERIA, "num-clients": 18, "rounds": 7}, 0.9),
    "layercfl": ({**CRITERIA, "num-clients": 18, "rounds": 7, "skew": "label"}, 0.9),
    # split-min-repliers = 0 and ask-again = false: this run checks that exactly the sample trains
    # (the top-up and the asking again of a deferred split's repliers: their own tests)
    "hicfl": ({**FORCE, **ROTATION, "num-clients": 16, "rounds": 10, "window": 1, "stability-eps": 5.0,
               "split-min-repliers": 0, "ask-again": False}, 0.9),
    "ifca": ({**ROTATION, "num-clusters": 2, "rounds": 5, "local-epochs": 2, "seed": 1}, 0.9),
    "selection": ({"rounds": 4}, None),
}
DEFAULT_RUN: tuple[dict, float | None] = ({}, None)


def run_settings(name: str) -> tuple[dict, float | None]:
    return TUNED.get(name, DEFAULT_RUN)


def placement(cls: type) -> str:
    """Who must hold a cluster after a round, from what the class is: ``sampled``, a
    one-shot clustering, places a client when it is first sampled (placing asks for work);
    ``chosen``, a strategy whose clients choose among K models (``multi-model``), when it
    first trains; any other, every active client."""
    if issubclass(cls.State, OneShotState):
        return "sampled"
    if MULTI_MODEL in cls().requires():
        return "chosen"
    return "active"


def run_logged(tmp_path, monkeypatch, name: str, **values):
    """Run ``name`` in process, logging per round every ask by phase and, after training,
    the active clients, the assignment, the cluster models and the evaluation sample."""
    asks: list[tuple[int, str, list[str], list[str]]] = []
    after: dict[int, dict] = {}
    real_train, real_evaluate = RoundDriver.train, RoundDriver.evaluate
    real_with_reports = ClusteredStrategy.with_reports
    opened = {}  # round -> the Round the strategy ran (its active clients, its sample)

    def with_reports(strategy, rnd, steps):
        opened[rnd.number] = rnd
        return real_with_reports(strategy, rnd, steps)

    def train(driver, server_round, batch):
        replies = real_train(driver, server_round, batch)
        phases = {a.config.get("phase") for a in batch}
        asks.append((server_round, phases.pop() if len(phases) == 1 else "mixed", [a.key for a in batch],
                     [r.key for r in replies]))
        return replies

    def evaluate(driver, server_round, active):
        strategy = driver.strategy
        models = strategy.evaluation_models  # the sample is drawn inside: record what it gave
        drawn = {}

        def recording(r, keys):
            drawn.update(models(r, keys))
            return drawn

        strategy.evaluation_models = recording
        try:
            rows = real_evaluate(driver, server_round, active)
        finally:
            del strategy.evaluation_models
        sampled = opened[server_round].sampled
        assert opened[server_round].active == active
        after[server_round] = {"active": list(active), "assignment": dict(strategy.assignment),
                               "models": set(strategy.cluster_models()), "evaluated": sorted(drawn),
                               "sampled": list(sampled) if sampled is not None else None}
        return rows

    monkeypatch.setattr(RoundDriver, "train", train)
    monkeypatch.setattr(RoundDriver, "evaluate", evaluate)
    monkeypatch.setattr(ClusteredStrategy, "with_reports", with_reports)
    out = tmp_path / name
    config = parse_config({**BASE, "strategy": name, "out-dir": str(out), **values})
    summary = simulate(config, engine="inprocess", stream=None)
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    clusters = json.loads((out / "clusters.json").read_text())
    return summary, rounds, clusters, asks, after


@pytest.mark.parametrize("name", list(clustered_classes()))
@pytest.mark.end_to_end
def test_half_the_clients_train_each_round_and_none_is_orphaned(name, tmp_path, monkeypatch):
    check_partial_participation(name, tmp_path, monkeypatch)


def check_partial_participation(name: str, tmp_path, monkeypatch) -> dict:
    """Run registered strategy ``name`` at half participation (its ``TUNED`` settings or the
    default run) and check every round: exactly the sample trains, no placed client is
    without a model, evaluation covers the placed clients, splits place the absent. Returns
    the run's clusters.json."""
    cls = strategy_class(name)
    overrides, ari = run_settings(name)
    summary, rounds, clusters, asks, after = run_logged(tmp_path, monkeypatch, name, **overrides)
    one_shot, places = issubclass(cls.State, OneShotState), placement(cls)
    sample = int(overrides.get("num-clients", CLIENTS) * FRACTION)
    seen: set[str] = set()  # clients that replied to a clustering / placement (one-shot) or train (IFCA) ask
    # the tree's splits leave a member with no update to compare unplaced until it is next sampled
    unplaced_at = defaultdict(set)
    for split in clusters.get("splits", []):
        unplaced_at[split["round"]].update(split.get("unplaced", []))
    left: set[str] = set()
    for record in rounds:
        r = record["round"]
        state = after[r]
        batches = [(phase, keys, replied) for rr, phase, keys, replied in asks if rr == r]
        left -= {k for _, keys, _ in batches for k in keys}  # sampled again: it descended
        train = [keys for phase, keys, _ in batches if phase == "train"]
        assert len(train) == 1, (name, r, batches)
        trainers = train[0]
        for phase, _, replied in batches:
            if phase == ("cluster" if one_shot else "train"):
                seen.update(replied)
        if issubclass(cls, ClientSelection):
            # the paper's selection decides who trains, among the clients reachable this round
            assert set(trainers) <= set(state["sampled"]) and len(state["sampled"]) == sample
            if record["warmup"]:
                assert len(trainers) == sample
        else:
            assert len(trainers) == sample, (name, r)  # exactly the sample trains
        assert len(set(trainers)) == len(trainers)
        # every placed client's cluster has a model; who must be placed depends on the strategy
        assignment = state["assignment"]
        assert set(assignment.values()) <= state["models"], (name, r)
        left |= unplaced_at[r]
        must = set(state["active"]) - left if places == "active" else seen
        assert must <= set(assignment), (name, r, sorted(must - set(assignment)))
        assert not left & set(assignment), (name, r)
        assert set(trainers) <= set(assignment)
        # evaluation: every placed client (fraction-evaluate = 1), each on its cluster's model
        assert state["evaluated"] == sorted(k for k in state["active"] if k in assignment)
        assert record["clients_evaluated"] == record["clients_to_evaluate"] == len(state["evaluated"])
    # with full participation the assignment would hold every client from round 1; here at
    # least everyone sampled so far, and a placed client never loses its cluster (but at a
    # split it sat out with nothing to compare)
    placed_before: set[str] = set()
    for r in sorted(after):
        placed_now = set(after[r]["assignment"])
        if not (issubclass(cls, AdaCFL) and r == 2):  # its clustering step dissolves the warm-up cluster
            assert placed_before - placed_now <= unplaced_at[r], (name, r)
        placed_before = placed_now
    if ari is not None:
        assert summary["final_ari"] >= ari, (name, summary["final_ari"])
    for split in clusters.get("splits", []):
        # a member that sat the split round out is put on one of the two sides (it then
        # holds a model: checked above), and only the repliers decided the split
        for side, extra in enumerate(split["absent"]):
            assert set(extra) <= set(split["members"][side])
            assert not set(extra) & set(split["similarity"]["keys"])
    if cls.name in ("cfl", "layercfl", "hicfl") and ari is not None:  # tuned so that a split happens
        assert clusters["splits"] and any(s["absent"][0] + s["absent"][1] for s in clusters["splits"])
        # provisional members were placed by descent when sampled again ("replaced")
        assert any(record.get("replaced") for record in rounds)
    if one_shot:  # the clustering step asks every active client (cluster-all-active): no newcomer
        first = [keys for rr, phase, keys, _ in asks if phase == "cluster"][0]
        assert len(first) == overrides.get("num-clients", CLIENTS) == len(clusters["client_order"])
        assert not clusters["newcomers"]
    return clusters


# ----------------------------------------------------------------------------- split rules


def test_cfl_member_that_never_replied_is_left_unplaced_and_descends_to_its_group_when_sampled():
    """A member that sat out every round up to its cluster's split has no update to place it by:
    it joins neither side (where it used to be put on the larger one, a cluster claimed without
    evidence), leaves the assignment, and descends the tree, as a newcomer does, when next sampled."""
    code_of, vectors = hierarchical_updates(2)
    strategy = make_strategy(CFL, {k: t for k, (t, _, _) in code_of.items()})
    silent = sorted(code_of, key=int)[0]
    said = run_round(strategy, 1, {k: v for k, v in vectors.items() if k != silent})["decision"]
    (split,) = strategy.state.splits[:1]
    assert split["unplaced"] == [silent] and silent not in strategy.assignment
    assert all(silent not in side for side in split["members"] + split["absent"])
    assert "clients; 1 absent with no update to place them by, unplaced until sampled)" in said
    for reply in (False, True):  # a lost placement reply leaves it unplaced; the next one places it
        admission = iter(steps(strategy.admit(round_of(strategy, 2), [silent])))
        try:
            asks = next(admission)
            while True:
                asks = admission.send(Replies([reply_to(ask, arrays_of(vectors[silent])) for ask in asks if reply]))
        except StopIteration:
            pass
        assert (silent in strategy.assignment) == reply
    home = {strategy.assignment[k] for k in code_of if k != silent and code_of[k][0] == code_of[silent][0]}
    assert strategy.assignment[silent] in home and strategy.assignment[silent] in strategy.models


HICFL_UNIT = {"window": 2, "stability_eps": 0.5, "xi": 1e-9, "min_split_round": 1,
              "hicfl_timing": "all", "hicfl_split": "reference", "hicfl_min_silhouette": -1, "merge": False}


def test_hicfl_times_and_splits_on_the_repliers_and_places_the_absent_by_their_last_update():
    """Client ``late`` trains in the first two rounds only, ``never`` not at all; the others
    every round. The split comes once the repliers' windows are full (the absent ones'
    are not); ``late`` follows its last update to its group's side and keeps a model;
    ``never`` is left unplaced until it is sampled."""
    code_of, vectors = hierarchical_updates(0)
    groups = {k: t for k, (t, _, _) in code_of.items()}
    strategy = make_strategy(HiCFL, groups, **HICFL_UNIT)
    keys = sorted(code_of, key=int)
    late, never = keys[0], keys[1]
    rng = np.random.default_rng(0)
    for server_round in range(1, 12):
        present = {k: v + 0.001 * rng.standard_normal(DIM) for k, v in vectors.items()
                   if k != never and (k != late or server_round <= 2)}
        run_round(strategy, server_round, present)
        if strategy.state.splits:
            break
    split = strategy.state.splits[0]
    assert late not in split["similarity"]["keys"] and never not in split["similarity"]["keys"]
    assert set(split["stability"]) == set(keys) - {late, never}
    side_of = {k: s for s, side in enumerate(split["members"]) for k in side}
    assert {groups[k] for k in split["members"][side_of[late]] if k != never} == {groups[late]}
    assert {groups[k] for k in split["members"][1 - side_of[late]] if k != never} == {1 - groups[late]}
    assert split["unplaced"] == [never] and never not in strategy.assignment  # nothing to place it by
    assert strategy.assignment[late] in strategy.models


def test_hicfl_stability_windows_count_participations_not_rounds():
    """A client that skips rounds keeps its window: it fills after as many participations
    as a client that trains every round, whatever the gaps."""
    code_of, vectors = hierarchical_updates(1)
    strategy = make_strategy(HiCFL, {k: 0 for k in code_of}, **{**HICFL_UNIT, "min_split_round": 100})
    steady, gappy = sorted(code_of, key=int)[:2]
    layer = strategy.state.layers[0]
    for server_round in range(1, 11):
        present = {k: vectors[k] for k in (steady, gappy) if k == steady or server_round % 2 == 0}
        run_round(strategy, server_round, present)
        if server_round == 5:  # 5 participations fill a window of 2 (one to select, two more to score)
            assert strategy.state.tracker.windowed(steady, layer) is not None
            assert strategy.state.tracker.windowed(gappy, layer) is None
    assert strategy.state.tracker.windowed(gappy, layer) is not None  # its 5th participation, in round 10


# ----------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("name", ["cfl", "layercfl", "hicfl"])
def test_a_cluster_that_may_split_trains_enough_of_its_members(name):
    """``split-min-repliers`` (8): 16 clients at a quarter participation (4 a round), two groups;
    from the round before ``min-split-round`` each cluster that may split trains at least 8 of
    its placed members, last round's first, so two rounds share at least 4 of its clients; the
    round before that, and with the setting 0 (and ``ask-again`` off, which asks more), exactly the sample."""
    groups = {str(i): i % 2 for i in range(16)}
    rng = np.random.default_rng(0)

    def respond(ask):
        sign = 1.0 if groups[ask.key] == 0 else -1.0
        return {n: np.float32(sign) + rng.normal(0, 0.3, ask.model[n].shape).astype(np.float32)
                for n in ask.upload or list(ask.model)}

    for need in (8, 0):
        algorithm = make(clustered_classes()[name], groups, fraction_train=0.25, min_split_round=3,
                         split_min_repliers=need, ask_again=bool(need))
        earlier: list[str] = []
        for server_round in range(1, 7):
            placed: dict[int, list[str]] = {}  # each cluster as the round starts
            for key, cluster in algorithm.assignment.items():
                placed.setdefault(cluster, []).append(key)
            trainers = [a.key for a in drive_round(algorithm, server_round, respond)[-1]]
            if need == 0 or server_round == 1:
                assert len(trainers) == 4, (need, server_round)
                continue
            for members in placed.values():
                assert len(set(members) & set(trainers)) >= min(8, len(members)) or len(members) < 3
            if server_round == 3:  # the first round after one topped up: 4 of its clients asked again
                assert len(set(earlier) & set(trainers)) >= 4
            earlier = trainers
    assert strategy_class(name).paper().params.split_min_repliers == 0


@pytest.mark.parametrize("name", ["cfl", "layercfl", "hicfl"])
def test_a_cluster_that_never_splits_averages_what_fedavg_averages(name):
    """The top-up's clients train for the split test's evidence only: on one task (each client
    its own small spread around one update, no groups) the cluster trains 8 of 16 clients a
    round where FedAvg's sample is 4, yet its model stays FedAvg's at the same seed, round by
    round: the same sample, averaged alone."""
    keys = [str(i) for i in range(16)]
    rng = np.random.default_rng(3)
    shapes = {n: v.shape for n, v in make(strategy_class("fedavg"), {k: 0 for k in keys}).state.theta0.items()}
    common = {n: rng.normal(0, 1, shape).astype(np.float32) for n, shape in shapes.items()}
    deltas = {k: {n: common[n] + rng.normal(0, 0.05, shape).astype(np.float32) for n, shape in shapes.items()}
              for k in keys}

    def respond(ask):
        delta = deltas[ask.key]
        if ask.config.get("return") == "update":
            return {n: delta[n] for n in ask.upload or list(ask.model)}, {}, float(ask.key)  # each its own loss
        return {n: ask.model[n] + delta[n] for n in ask.upload or list(ask.model)}, {}, float(ask.key)

    fedavg = make(strategy_class("fedavg"), {k: 0 for k in keys}, fraction_train=0.25)
    clustered = make(strategy_class(name), {k: 0 for k in keys}, fraction_train=0.25, min_split_round=3)
    assert clustered.params.split_min_repliers == 8
    for server_round in range(1, 7):
        reference = drive_round(fedavg, server_round, respond)
        averaged = [a.key for a in reference[-1]]
        batches = drive_round(clustered, server_round, respond)
        assert batches.diagnostics["train_loss"] == pytest.approx(reference.diagnostics["train_loss"])
        trainers = [a.key for a in batches[-1]]
        assert set(averaged) <= set(trainers)
        assert batches.round.evidence_only == set(trainers) - set(averaged)
        assert len(trainers) == (4 if server_round == 1 else 8), server_round
        assert len(clustered.state.models) == 1  # no groups: nothing splits
        (model,) = clustered.state.models.values()
        for n, value in fedavg.state.models[0].items():
            np.testing.assert_allclose(model[n], value, rtol=1e-5, atol=1e-5)  # float32: weights or updates


@pytest.mark.parametrize("name", ["fedclust", "adacfl"])
@pytest.mark.parametrize("warmup", [0, 2])
def test_one_shot_clustering_asks_every_active_client_and_trains_the_sample(name, warmup):
    """The clustering step asks all 8 active clients for the partial upload (the papers'
    clustering round); the round's training is its half sample, and later rounds ask nobody
    to place (everyone was placed)."""
    groups = {str(i): i % 2 for i in range(8)}
    stats = {k: {"num-classes": 2, "label-entropy": 1.0} for k in groups}
    algorithm = make(clustered_classes()[name], groups, stats=stats, fraction_train=0.5, warmup_rounds=warmup,
                     cluster_epochs=1)

    def respond(ask):
        return trained(ask, 1.0 if groups[ask.key] == 0 else -1.0)

    step = 1 if name == "fedclust" else warmup + 1
    for server_round in range(1, step + 3):
        batches = drive_round(algorithm, server_round, respond)
        *placing, train = batches
        assert len(train) == 4 and all(a.config["phase"] == "train" for a in train)
        if server_round == step:
            (cluster,) = placing
            assert [a.config["phase"] for a in cluster] == ["cluster"] * 8
            assert {a.key for a in cluster} == set(groups) == set(algorithm.assignment)
        else:
            assert not placing
    by_cluster = {}
    for key, cluster_id in algorithm.assignment.items():
        by_cluster.setdefault(cluster_id, set()).add(groups[key])
    assert sorted(map(sorted, by_cluster.values())) == [[0], [1]]


@pytest.mark.parametrize("name", ["fedclust", "adacfl"])
def test_one_shot_clustering_asks_only_the_sample_and_places_the_rest_when_sampled(name):
    """16 clients in two groups, half of them a round: the clustering step asks its sample only
    (and finds the two groups), the others are placed when sampled, and the clusters hold one
    group each."""
    groups = {str(i): i % 2 for i in range(16)}
    stats = {k: {"num-classes": 2, "label-entropy": 1.0} for k in groups}
    algorithm = make(clustered_classes()[name], groups, stats=stats, fraction_train=0.5, warmup_rounds=0,
                     cluster_epochs=1, cluster_all_active=False)

    def respond(ask):
        return trained(ask, 1.0 if groups[ask.key] == 0 else -1.0)

    batches = drive_round(algorithm, 1, respond)
    cluster, train = batches
    assert [a.config["phase"] for a in cluster] == ["cluster"] * 8 and len(train) == 8
    assert {a.key for a in cluster} == {a.key for a in train} == set(algorithm.assignment)
    placed = set(algorithm.assignment)
    for server_round in range(2, 8):
        batches = drive_round(algorithm, server_round, respond)
        train = batches[-1]
        assert len(train) == 8 and {a.key for a in train} <= set(algorithm.assignment)
        newcomers = [a.key for batch in batches[:-1] for a in batch]
        assert not set(newcomers) & placed  # only clients not placed yet are asked to place
        placed = set(algorithm.assignment)
    assert placed == set(groups)  # 7 rounds of half-samples reached everyone (seed 0)
    by_cluster = {}
    for key, cluster_id in algorithm.assignment.items():
        by_cluster.setdefault(cluster_id, set()).add(groups[key])
    assert all(len(g) == 1 for g in by_cluster.values())


def half_sampled_adacfl(revisit_rounds: int) -> tuple[Any, dict[str, int]]:
    """AdaCFL's clustering step on a sample of 4 of 8 clients (two groups), which sets one
    client apart and is deferred; then 6 rounds each training 4 of the cluster's 8 members."""
    groups = {str(i): i % 2 for i in range(8)}
    stats = {k: {"num-classes": 2, "label-entropy": 1.0} for k in groups}
    algorithm = make(clustered_classes()["adacfl"], groups, stats=stats, fraction_train=0.5, warmup_rounds=0,
                     cluster_epochs=1, cluster_all_active=False, revisit_rounds=revisit_rounds)
    for server_round in range(1, 8):
        drive_round(algorithm, server_round, lambda ask: trained(ask, 1.0 if groups[ask.key] == 0 else -1.0))
    return algorithm, groups


def test_a_one_shot_cluster_too_few_of_whose_members_train_says_so_and_what_would_help():
    """Revisits on one round's repliers (``revisit-rounds = 1``): 4 of the cluster's 8 members
    a round, fewer than the 8 a revisit is judged on: one cluster at the end, its reason naming
    the wait and the advice a higher fraction-train."""
    algorithm, _ = half_sampled_adacfl(revisit_rounds=1)
    assert len(set(algorithm.assignment.values())) == 1 and len(algorithm.assignment) == 8
    reason = algorithm.one_cluster_reason()
    assert reason.startswith("the clustering step's cut was deferred (it only set ")
    assert ("the revisits have not judged the cluster since round 2: at most 4 of its 8 members trained in one "
            "round, fewer than the 8 they need (fraction-train 0.5)") in reason
    assert algorithm.one_cluster_advice().startswith("a higher fraction-train")


def test_a_one_shot_cluster_half_of_whose_members_train_is_split_on_their_updates_of_rounds_running():
    """The same run with the default ``revisit-rounds`` (3): each member's latest update over
    the rounds that hold all 8 is cut, and the cut reproduces on rounds before it: the two
    groups end as two clusters."""
    algorithm, groups = half_sampled_adacfl(revisit_rounds=3)
    clusters = {}
    for key, cluster in algorithm.assignment.items():
        clusters.setdefault(cluster, set()).add(groups[key])
    assert len(clusters) == 2 and all(len(g) == 1 for g in clusters.values())
    assert algorithm.one_cluster_reason() is None


def fedclust_on_a_growing_sample(groups_after_first: list[int], rounds: int, checkpoint_after: int = 0,
                                 tmp_path=None, **params):
    """FedClust at a quarter participation, 16 clients whose first sample holds one group only;
    the clients met later hold ``groups_after_first`` in turn. A client's clustering upload is
    its group's direction of change, group 1's with a little noise of its own (group 0's are
    equal: its clients alone show no groups)."""
    from clusterfed.strategies.fedclust import FedClust

    keys = [str(i) for i in range(16)]
    params.setdefault("cluster_all_active", False)  # the clients met later stand for late joiners

    def build():
        return make(FedClust, {k: 0 for k in keys}, fraction_train=0.25, cluster_epochs=1, **params)

    algorithm = build()
    size = sum(v.size for v in algorithm.theta0.values())
    directions = [np.ones(size), np.resize([1.0, -1.0], size)]
    groups: dict[str, int] = {}

    def respond(ask):
        if ask.config["phase"] != "cluster":
            return trained(ask, 0.0)
        if ask.key not in groups:  # the first sample is group 0, later clients as given
            groups[ask.key] = 0 if ask.config["server-round"] == 1 else groups_after_first[len(groups) % len(groups_after_first)]
            hand(algorithm).clients[ask.key].true_group = groups[ask.key]
        noise = np.random.default_rng(int(ask.key)).normal(0, 0.05, size) * (groups[ask.key] == 1)
        change, offset = directions[groups[ask.key]] + noise, 0
        out = {}
        for name in ask.upload:
            n = ask.model[name].size
            out[name] = ask.model[name] + change[offset:offset + n].reshape(ask.model[name].shape).astype(np.float32)
            offset += n
        return out

    for server_round in range(1, rounds + 1):
        drive_round(algorithm, server_round, respond)
        if server_round == checkpoint_after:  # resume from a checkpoint, as a restarted server would
            from clusterfed.runner.checkpoint import load_checkpoint, save_checkpoint

            save_checkpoint(tmp_path, {"round": server_round, "algorithm": algorithm.get_state()})
            algorithm = build()
            algorithm.set_state(load_checkpoint(tmp_path)["algorithm"])
            for key, group in groups.items():
                hand(algorithm).clients[key].true_group = group
    return algorithm, groups


def test_fedclust_cuts_again_when_the_first_sample_showed_no_groups():
    from sklearn.metrics import adjusted_rand_score

    algorithm, groups = fedclust_on_a_growing_sample([0, 1], rounds=12)
    first = algorithm.state.recuts[0]
    assert first["clients"] == 8 and first["clusters"] == 2  # cut again once the 4 became 8
    assert algorithm.state.recut_at == 0 and not algorithm.state.unclustered  # done: later clients are newcomers
    assert set(algorithm.assignment) == set(groups) and len(set(algorithm.assignment.values())) == 2
    assert set(algorithm.models) == set(algorithm.assignment.values())  # the one cluster's model is gone
    keys = sorted(groups)
    assert adjusted_rand_score([groups[k] for k in keys], [algorithm.assignment[k] for k in keys]) == 1.0
    state = algorithm.final_clusters()
    assert state["clustering_round"] == 1 and state["final_clustering_round"] == first["round"] > 1
    assert state["one_cluster_reason"] is None and state["recuts"][0]["clients"] == 8
    assert first["max_clusters"] == 2  # sqrt(8 / 2)


def _tight_triples() -> tuple[np.ndarray, list[int]]:
    """96 rows of 4 groups, each made of 8 tight triples (clients of a few images that train
    alike), and each row's group."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1, (4, 50))
    rows, truth = [], []
    for group in range(4):
        for _ in range(8):
            triple = centres[group] + rng.normal(0, 0.6, 50)
            rows += [triple + rng.normal(0, 0.05, 50) for _ in range(3)]
            truth += [group] * 3
    return np.array(rows), truth


def test_fedclust_recut_does_not_take_tight_handfuls_of_clients_for_groups():
    """Rows of 4 groups, each made of tight triples (clients of a few images that train
    alike): the unbounded best-silhouette cut takes the 32 triples; the re-cut's bound,
    sqrt(96 / 2) = 6 clusters, finds the 4 groups."""
    from sklearn.metrics import adjusted_rand_score

    from clusterfed.strategies.fedclust import FedClust, recut_max_clusters

    X, truth = _tight_triples()
    algorithm = make(FedClust, {str(i): 0 for i in range(4)})
    unbounded, _ = algorithm.cut(X)
    assert len(np.unique(unbounded)) == 32
    assert recut_max_clusters(len(X)) == 6
    bounded, info = algorithm.cut(X, max_clusters=recut_max_clusters(len(X)))
    assert adjusted_rand_score(truth, bounded) == 1.0 and info["auto_best_silhouette"] > 0.25


def test_fedclust_recut_bound_reaches_a_sampled_cut():
    """With cluster-sample set, the re-cut's bound reaches the sampled clustering: 4 groups
    of 24 rows, each 8 tight triples; a sample of 60 rows cut unbounded takes the triples
    apart from their groups, the bound of 6 clusters finds the 4 groups."""
    from sklearn.metrics import adjusted_rand_score

    from clusterfed.strategies.fedclust import FedClust, recut_max_clusters

    X, truth = _tight_triples()
    algorithm = make(FedClust, {str(i): 0 for i in range(4)}, cluster_sample=60)
    unbounded, info = algorithm.cut(X)
    assert info["cluster_sample"] == 60 and len(np.unique(unbounded)) > 6
    bounded, _ = algorithm.cut(X, max_clusters=recut_max_clusters(len(X)))
    assert adjusted_rand_score(truth, bounded) == 1.0


def test_fedclust_recut_false_keeps_the_papers_single_cut():
    # the paper's single cut: no re-cut of the grown sample, and the step not run again (retry-after)
    algorithm, _ = fedclust_on_a_growing_sample([0, 1], rounds=12, recut=False, retry_after=0)
    assert algorithm.state.recuts == [] and len(set(algorithm.assignment.values())) == 1


def test_fedclust_kept_partial_weights_survive_a_checkpoint(tmp_path):
    straight, _ = fedclust_on_a_growing_sample([0, 1], rounds=12)
    resumed, _ = fedclust_on_a_growing_sample([0, 1], rounds=12, checkpoint_after=1, tmp_path=tmp_path)
    assert resumed.state.recuts == straight.state.recuts and resumed.assignment == straight.assignment


def test_fedclust_one_group_stays_one_cluster_and_says_how_many_clients_it_last_cut():
    algorithm, groups = fedclust_on_a_growing_sample([0], rounds=20)
    assert [r["clients"] for r in algorithm.state.recuts] == [8, 16]  # each time the sample doubled
    assert len(set(algorithm.assignment.values())) == 1 and set(algorithm.assignment) == set(groups)
    assert "last on 16 clients" in algorithm.final_clusters()["one_cluster_reason"]
    # every known client was in the last cut: nothing left to grow, the kept rows are dropped
    assert algorithm.state.unclustered == {} and algorithm.state.recut_at == 0


def test_selection_reads_fraction_train_as_availability():
    groups = {str(i): i % 2 for i in range(8)}
    algorithm = make(clustered_classes()["selection"], groups, fraction_train=0.5, warmup_rounds=1)
    respond = lambda ask: trained(ask, 1.0 if groups[ask.key] == 0 else -1.0)  # noqa: E731
    for server_round in range(1, 6):
        batches = drive_round(algorithm, server_round, respond)
        (train,) = batches
        keys, sampled = {a.key for a in train}, batches.round.sampled
        assert len(sampled) == 4 and keys <= set(sampled)
        if server_round == 1:
            assert len(keys) == 4  # warm-up: every reachable client


# ----------------------------------------------------------------------------- evaluation


def test_fraction_evaluate_coverage_is_judged_against_the_evaluation_sample(tmp_path):
    config = parse_config({**BASE, "strategy": "fedavg", "fraction-evaluate": 0.5, "target-accuracy": 0.01,
                           "rounds": 2, "out-dir": str(tmp_path)})
    summary = simulate(config, engine="inprocess", stream=None)
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    for record in rounds:
        assert record["clients_to_evaluate"] == record["clients_evaluated"] == SAMPLE
        assert record["clients_known"] == CLIENTS and record["accuracy"] is not None
        assert record["ari"] == 0.0 and len(record["client_accuracy"]) == SAMPLE
    assert summary["rounds_to_target"] == 1
    # a row missing one of its sampled clients does not count; a file without the field
    # (written before it existed) is judged against every known client as before
    assert not covered({"clients_to_evaluate": 6, "clients_evaluated": 5, "clients_known": 12}, 1.0)
    old = {"round": 1, "accuracy": 0.9, "cum_bytes_up": 0, "cum_bytes_down": 0, "clients_evaluated": 6,
           "clients_known": 12}
    assert summarize([old], target=0.5)["rounds_to_target"] is None


# ----------------------------------------------------------------------------- checkpoints


def test_provisional_members_round_trip_a_checkpoint_and_are_placed_after_resuming(tmp_path):
    """The provisional placements (new state) survive a checkpoint; the resumed strategy
    places the member by descent when it is sampled, as the uninterrupted one does."""
    from test_state_codec import assert_same

    from clusterfed.runner.checkpoint import load_checkpoint, save_checkpoint
    from clusterfed.core.exchange import TrainReply

    code_of, vectors = hierarchical_updates(1)
    groups = {k: t for k, (t, _, _) in code_of.items()}
    strategy = make_strategy(CFL, groups, min_split_round=2)
    run_round(strategy, 1, vectors)
    absent = "5"
    run_round(strategy, 2, {k: v for k, v in vectors.items() if k != absent})
    assert strategy.state.provisional == {absent: 0}
    save_checkpoint(tmp_path, {"round": 2, "algorithm": strategy.get_state()})
    state = load_checkpoint(tmp_path)["algorithm"]
    assert_same(strategy.get_state(), state)
    resumed = make_strategy(CFL, groups, min_split_round=2)
    resumed.set_state(state)

    def place(algorithm):
        steps = algorithm.before_train(round_of(algorithm, 3, sampled=[absent]))
        (ask,) = next(steps)
        assert ask.key == absent and ask.config["phase"] == "placement"
        names = ask.upload
        update = arrays_of(vectors[absent])
        reply = TrainReply(key=absent, cluster=ask.config["cluster-id"], arrays={n: update[n] for n in names},
                           sent={n: ask.model[n] for n in names}, num_examples=50, train_loss=0.0, metrics={},
                           is_update=True)
        with pytest.raises(StopIteration):
            steps.send([reply])
        return algorithm.assignment[absent], algorithm.state.provisional

    assert place(strategy) == place(resumed)
    assert resumed.state.provisional == {}
    side = [s for s, members in enumerate(resumed.state.splits[0]["members"]) if absent in members][0]
    # the descent put it with its own group
    assert {code_of[k][0] for k in resumed.state.tree.members(resumed.assignment[absent])} == {code_of[absent][0]}
    assert side in (0, 1)
