"""The default split rules of CFL, LayerCFL and HiCFL: relative ε and the median timing,
HiCFL's complete-linkage split, leaf merging and the one-cluster reason — on hand-made
updates with known answers, then short whole runs with every default."""

import io
import json

import numpy as np
import pytest
from harness import hand, round_of
from test_cfl import DIM, make_strategy, run_round

from clusterfed.clustering.layer_split import EVIDENCE_DRAWS, evidence_reference
from clusterfed.clustering.null_reference import shared_draws
from clusterfed.clustering.split_rules import pick_best, ready_layers
from clusterfed.simulation import simulate
from clusterfed.strategies.base import steps
from clusterfed.strategies.cfl import CFL
from clusterfed.strategies import hicfl_stability
from clusterfed.strategies.hicfl import HiCFL
from clusterfed.strategies.layercfl import LayerCFL

# ----------------------------------------------------------------------------- pure rules


def test_ready_layers_median_member_ignores_one_noisy_member():
    rel = {"conv": {"a": 0.5, "b": 0.6, "c": 9.0}, "fc": {"a": 2.0, "b": 2.0, "c": 0.1}}
    assert ready_layers(rel, 1.5, "all") == []
    assert ready_layers(rel, 1.5, "median") == ["conv"]
    with pytest.raises(ValueError):
        ready_layers(rel, 1.5, "mean")


def test_pick_best_refuses_below_the_minimum():
    assert pick_best({"a": 0.2, "b": 0.5}, 0.45).layer == "b"
    assert pick_best({"a": 0.2, "b": 0.4}, 0.45).layer is None
    assert pick_best({"a": 0.2, "b": 0.4}, 0.40).layer == "b"  # the bar itself passes
    assert pick_best({}, 0.1).layer is None


# ----------------------------------------------------------------------------- HiCFL, hand-made

def groups_moving_apart(seed, groups, settle_after, noise=0.05):
    """Clients of ``groups`` (key -> group) whose update is their group's direction plus
    noise; until ``settle_after`` every group's direction changes every round (unstable),
    after it the directions hold (stable)."""
    rng = np.random.default_rng(seed)
    fixed = {g: rng.standard_normal(DIM) for g in set(groups.values())}

    def updates(server_round):
        out = {}
        for key, g in groups.items():
            d = fixed[g] if server_round > settle_after else rng.standard_normal(DIM)
            out[key] = d / np.linalg.norm(d) + noise * rng.standard_normal(DIM) / np.sqrt(DIM)
        return out

    return updates


def test_relative_epsilon_fires_once_stability_falls_below_its_own_scale():
    """Relative ε: the scale is each layer's median stability at the cluster's first full
    window (round 6 here, while the directions still change every round); ε = 0.5 × scale
    is met only once the directions have settled, whatever the layer's absolute scale. The
    linkage split then makes a first cut of the three groups with no group cut in two."""
    groups = {str(i): i % 3 for i in range(9)}
    updates = groups_moving_apart(0, groups, settle_after=8)
    hicfl = make_strategy(HiCFL, groups, window=3, xi=1e-9, min_split_round=1, stability_eps_rel=0.5,
                          merge=False)
    for server_round in range(1, 16):
        run_round(hicfl, server_round, updates(server_round))
        if hicfl.state.splits:
            break
    (split,) = hicfl.state.splits
    scale = hicfl.state.scales[0]
    assert set(scale) == set(hicfl.state.layers) and all(v > 0 for v in scale.values())
    assert split["round"] > 8 and split["relative"] and split["rule"] == "linkage"
    sides = [{groups[k] for k in side} for side in split["members"]]
    assert not sides[0] & sides[1] and sides[0] | sides[1] == {0, 1, 2}
    assert split["silhouettes"][split["layer"]] >= hicfl.params.min_silhouette


def test_structure_test_refuses_noise_and_reports_why():
    """One distribution, noise only: the timing fires but no layer's split shows structure,
    so HiCFL keeps one cluster and says so."""
    groups = {str(i): 0 for i in range(8)}
    updates = groups_moving_apart(1, groups, settle_after=0, noise=1.0)
    # hicfl-min-side 1: every proposal reaches the structure test, which is what is tested here
    hicfl = make_strategy(HiCFL, groups, window=3, xi=1e-9, min_split_round=1, hicfl_min_side=1)
    for server_round in range(1, 12):
        run_round(hicfl, server_round, updates(server_round))
    assert hicfl.state.splits == [] and hicfl.state.no_split
    assert {n["code"] for n in hicfl.state.no_split} == {"silhouette"}
    assert "structure test" in hicfl.one_cluster_reason()


@pytest.mark.parametrize("seed", [1, 2])
def test_hicfl_takes_close_groups_that_its_earlier_bar_refused(seed):
    """Two groups of 6 clients, their directions fixed, under noise that keeps the best layer's
    split under 0.45: on evidence (the default timing: rotation test at the level the
    layers share, two rounds agreeing) HiCFL's default structure test (CFL's 0.30) takes the two
    groups, where the earlier default 0.45 kept one cluster for 8 rounds; one group under the
    same noise is never split."""
    groups = {str(i): i % 2 for i in range(12)}
    runs = {}
    for bar in (None, 0.45):
        updates = groups_moving_apart(seed, groups, settle_after=0, noise=1.2)
        extra = {} if bar is None else {"hicfl_min_silhouette": bar}
        hicfl = make_strategy(HiCFL, groups, split_timing="evidence", min_split_round=1, **extra)
        for server_round in range(1, 9):
            run_round(hicfl, server_round, updates(server_round))
        runs[bar] = hicfl
    default = runs[None]
    assert default.params.min_silhouette == 0.30
    (split,) = default.state.splits
    assert 0.30 <= split["silhouettes"][split["layer"]] < 0.45
    assert sorted(sorted({groups[k] for k in side}) for side in split["members"]) == [[0], [1]]
    assert runs[0.45].state.splits == []
    one = {key: 0 for key in groups}
    updates = groups_moving_apart(seed, one, settle_after=0, noise=1.2)
    hicfl = make_strategy(HiCFL, one, split_timing="evidence", min_split_round=1)
    for server_round in range(1, 9):
        run_round(hicfl, server_round, updates(server_round))
    assert hicfl.state.splits == []


def test_hicfl_tests_its_best_layers_split_at_the_level_its_layers_share(monkeypatch):
    """On evidence HiCFL proposes a split on every layer and tests the best-scored one against
    group-free rotations: that is the best of as many tests as layers scored, so the rotations
    it must beat are theirs together (``shared_draws``), as FedClust's layer choice does."""
    asked = []

    def recorded(*args, **kwargs):
        asked.append(kwargs["draws"])
        return evidence_reference(*args, **kwargs)

    monkeypatch.setattr(hicfl_stability, "evidence_reference", recorded)
    groups = {str(i): i % 2 for i in range(12)}
    updates = groups_moving_apart(1, groups, settle_after=0, noise=1.2)
    hicfl = make_strategy(HiCFL, groups, split_timing="evidence", min_split_round=1)
    for server_round in range(1, 4):
        run_round(hicfl, server_round, updates(server_round))
    scored = [len(entry["silhouettes"]) for entry in hicfl.state.splits + hicfl.state.no_split if entry.get("silhouettes")]
    assert asked and scored and max(scored) == 2  # the tiny model's two layers, conv1 and fc1
    assert set(asked) == {shared_draws(EVIDENCE_DRAWS, 2)} == {39}


# ----------------------------------------------------------------------------- merging, hand-made

def test_a_split_of_one_group_is_merged_back_with_models_averaged_by_size():
    """CFL forced to split one distribution (criteria always fire, no structure test): the
    two halves keep moving the same way, so the next round merges them."""
    groups = {str(i): 0 for i in range(6)}
    rng = np.random.default_rng(2)
    direction = rng.standard_normal(DIM)
    cfl = make_strategy(CFL, groups, split_min_silhouette=-1, merge=True)
    round_updates = lambda: {k: direction + 0.3 * rng.standard_normal(DIM) for k in groups}  # noqa: E731
    run_round(cfl, 1, round_updates())
    (split,) = cfl.state.splits
    a, b = split["children"]
    cfl.models[a] = {n: np.full_like(v, 1.0) for n, v in cfl.models[a].items()}
    cfl.models[b] = {n: np.full_like(v, 4.0) for n, v in cfl.models[b].items()}
    size_a, size_b = (len(cfl.state.tree.members(c)) for c in (a, b))
    cfl.params = cfl.params.model_copy(update={"split_criteria": "absolute", "eps1": 1e-9})  # no new split
    extra = run_round(cfl, 2, round_updates())
    (merge,) = cfl.state.merges
    merged = merge["into"]
    assert merge["merged"] == [a, b] and merge["cosine"] >= 0.6 and merge["silhouette"] <= 0.5
    assert extra["merges"] == [{"merged": [a, b], "into": merged, "cosine": merge["cosine"],
                                "silhouette": merge["silhouette"], "drift_cosine": merge["drift_cosine"]}]
    assert merge["drift_cosine"] >= 0.6  # both halves moved the same way since the split
    assert set(cfl.assignment.values()) == {merged} and set(cfl.models) == {merged}
    assert cfl.state.tree.leaves() == [merged] and cfl.state.final_clustering_round == 2
    # every client has 50 examples: averaged by member count (aggregation happens in round(), not here)
    want = (1.0 * size_a + 4.0 * size_b) / (size_a + size_b)
    assert all(np.allclose(v, want) for v in cfl.models[merged].values())
    # a newcomer descends through the split node and follows the merge without being asked
    hand(cfl).clients["new"] = hand(cfl).clients["0"]
    hand(cfl).active = [*groups, "new"]
    gen = cfl.admit(round_of(cfl, 3), ["new"])
    asks = next(gen)  # the split node asks it to train once
    assert [a.key for a in asks] == ["new"]


def test_distinct_clusters_are_not_merged():
    groups = {str(i): i % 2 for i in range(8)}
    updates = groups_moving_apart(3, groups, settle_after=0)
    cfl = make_strategy(CFL, groups, merge=True)
    for server_round in range(1, 5):
        run_round(cfl, server_round, updates(server_round))
    assert len(cfl.state.splits) == 1 and cfl.state.merges == [] and len(set(cfl.assignment.values())) == 2


# ----------------------------------------------------------------------------- whole runs, defaults

ROTATION = {"partitioner": "rotation", "rotations": "0,180", "num_clients": 12, "rounds": 12, "batch_size": 32}
# three digit-pair groups: CFL's heterogeneity criterion (max norm > 3 × mean norm) needs ≥ 3 groups
PAIRS = {"partitioner": "label-groups", "label_groups": "0,1;2,3;4,5", "num_clients": 12, "rounds": 8, "batch_size": 32}


@pytest.mark.parametrize(("strategy", "setting", "groups"),
                         [("cfl", PAIRS, 3), ("layercfl", PAIRS, 3), ("hicfl", ROTATION, 2)])
@pytest.mark.end_to_end
def test_defaults_recover_known_groups(small_config, strategy, setting, groups):
    config = small_config(strategy=strategy, **setting)
    summary = simulate(config, engine="inprocess", stream=None)
    assert summary["final_ari"] == 1.0 and summary["num_clusters"] == groups
    assert "one_cluster_reason" not in summary


@pytest.mark.parametrize("strategy", ["cfl", "layercfl", "hicfl"])
@pytest.mark.end_to_end
def test_defaults_do_not_split_iid_and_say_why(small_config, strategy):
    config = small_config(strategy=strategy, **{**ROTATION, "partitioner": "iid", "rounds": 10})
    stream = io.StringIO()
    summary = simulate(config, engine="inprocess", stream=stream)
    assert summary["num_clusters"] == 1
    written = json.load(open(f"{config.out_dir}/summary.json"))
    assert written["one_cluster_reason"] == summary["one_cluster_reason"] and summary["one_cluster_reason"]
    assert f"one cluster: {summary['one_cluster_reason']}" in stream.getvalue()


def test_layercfl_defaults_record_the_check_and_compare_every_layer():
    strategy = make_strategy(LayerCFL, {str(i): i % 2 for i in range(6)})
    assert strategy.state.layer_rule == "all" and not strategy.params.correct_clustering_check
    assert strategy.state.candidates == {}  # an unknown skew: no layer choice, the whole update as the paper
    assert list(steps(None)) == []


@pytest.mark.parametrize(("min_side", "splits"), [(1, True), (2, False)])
def test_hicfl_min_side_keeps_one_outlier_client_in_its_cluster(min_side, splits):
    """Seven clients share a direction, one points elsewhere: with ``hicfl-min-side = 1`` the
    outlier is split off alone; with 2 a one-client side is not a group and nothing splits."""
    groups = {**{str(i): 0 for i in range(7)}, "7": 1}
    updates = groups_moving_apart(2, groups, settle_after=3)
    hicfl = make_strategy(HiCFL, groups, window=3, xi=1e-9, min_split_round=1, hicfl_min_side=min_side)
    for server_round in range(1, 12):
        run_round(hicfl, server_round, updates(server_round))
    assert bool(hicfl.state.splits) is splits
    if splits:
        assert sorted(map(len, hicfl.state.splits[0]["members"])) == [1, 7]
