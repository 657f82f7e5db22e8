"""CFL's ``decision-arrays = evidence``: the one array whose updates show the groups is compared
once it leads two successive rounds, every array when none does. Hand-made updates through the
strategy's own ``after_train`` (``test_cfl``'s tiny model: conv1 72 + 8 numbers, fc1 80 + 4)."""

import numpy as np
import pytest
from test_cfl import DIM, SHAPES, make_strategy, run_round

from clusterfed.strategies.array_choice import EVERY, candidates
from clusterfed.strategies.cfl import CFL

KEYS = [str(i) for i in range(12)]
GROUPS = {k: int(k) // 6 for k in KEYS}
EVIDENCE = {"split-timing": "evidence", "min-split-round": 2}
CONV = slice(0, 72)  # conv1.weight's numbers in the flat update
FC = slice(80, 160)  # fc1.weight's


def groups_in_conv_hidden_by_fc(rng, groups=GROUPS, own=None):
    """The groups point two ways in conv1.weight; fc1.weight, ten times larger, holds each
    client's own direction (the same every round, as its own data) and fresh noise."""
    directions = rng.standard_normal((2, 72))
    own = own if own is not None else {k: rng.standard_normal(80) for k in KEYS}

    def updates():
        out = {}
        for k in KEYS:
            v = 0.01 * rng.standard_normal(DIM)  # the biases train a little
            v[CONV] = directions[groups[k]] + 0.1 * rng.standard_normal(72)
            v[FC] = 10.0 * (own[k] + 0.3 * rng.standard_normal(80))
            out[k] = v
        return out
    return updates


def test_candidates_are_each_matrix_array_with_its_bias_and_every_array():
    theta = {k: np.zeros(s) for k, s in SHAPES.items()}
    found = candidates(list(SHAPES), theta)
    assert found == {"conv1.weight": ["conv1.weight", "conv1.bias"], "fc1.weight": ["fc1.weight", "fc1.bias"],
                     EVERY: list(SHAPES)}
    assert candidates(["fc1.weight", "fc1.bias"], theta) == {}  # one candidate holding every array: no choice
    named = {"lightweight.weight": np.zeros((2, 2)), "lightweight.bias": np.zeros(2), "out.weight": np.zeros((2, 2))}
    assert candidates(list(named), named)["lightweight.weight"] == ["lightweight.weight", "lightweight.bias"]


def test_the_array_that_shows_the_groups_is_chosen_and_the_split_follows_it():
    rng = np.random.default_rng(3)
    updates = groups_in_conv_hidden_by_fc(rng)
    strategy = make_strategy(CFL, GROUPS, **EVIDENCE)
    said = [run_round(strategy, r, updates()).get("decision") or "" for r in range(1, 6)]
    assert strategy.state.chosen_arrays == ("conv1.weight", "conv1.bias")
    assert "CFL: compares conv1.weight (chosen by evidence in rounds 1 and 2: best-cut silhouette" in said[1]
    assert "every array together no structure (" in said[1] and "; next fc1.weight " in said[1]
    # the partitions of every array are forgotten: the split waits for two rounds on conv1.weight
    assert "rounds 1 and 2" not in said[1].split("needed")[-1] and strategy.state.splits[0]["round"] == 3
    recorded = strategy.cluster_state()["array_choice"]
    assert recorded["chosen"] == "conv1.weight" and recorded["chosen_arrays"] == ["conv1.weight", "conv1.bias"]
    sides = sorted((sorted(s, key=int) for s in strategy.state.splits[0]["members"]), key=lambda s: int(s[0]))
    assert sides == [KEYS[:6], KEYS[6:]]


def test_where_the_whole_update_shows_the_groups_it_is_kept():
    """The groups in conv1 and in fc1 alike: every array together shows them, so nothing is chosen
    (one array alone may show a coarser partition, or a cut of one group's own data)."""
    rng = np.random.default_rng(4)
    directions = rng.standard_normal((2, DIM))

    def updates():
        return {k: directions[GROUPS[k]] + 0.1 * rng.standard_normal(DIM) for k in KEYS}

    strategy = make_strategy(CFL, GROUPS, **EVIDENCE)
    for r in range(1, 4):
        run_round(strategy, r, updates())
    assert strategy.state.chosen_arrays == () and strategy.state.array_choice["leader"] is None
    assert next(s for s in strategy.state.array_choice["scores"] if s["layer"] == EVERY)["clusters"] == 2
    sides = sorted((sorted(s, key=int) for s in strategy.state.splits[0]["members"]), key=lambda s: int(s[0]))
    assert sides == [KEYS[:6], KEYS[6:]]


def test_on_every_array_the_same_clients_are_not_split():
    """The control: the paper's comparison of whole updates sees only each client's own
    fc1 direction, and never splits."""
    rng = np.random.default_rng(3)
    updates = groups_in_conv_hidden_by_fc(rng)
    strategy = make_strategy(CFL, GROUPS, **EVIDENCE, decision_arrays="every")
    for r in range(1, 6):
        run_round(strategy, r, updates())
    assert strategy.state.chosen_arrays == () and strategy.state.splits == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clients_of_one_group_choose_nothing_and_stay_one_cluster(seed):
    rng = np.random.default_rng(seed)
    updates = groups_in_conv_hidden_by_fc(rng, groups={k: 0 for k in KEYS})
    strategy = make_strategy(CFL, GROUPS, **EVIDENCE)
    said = [run_round(strategy, r, updates()).get("decision") or "" for r in range(1, 7)]
    assert strategy.state.splits == [] and len(set(strategy.assignment.values())) == 1
    assert strategy.state.chosen_arrays == () and "chosen by evidence" not in " ".join(said)


def test_the_paper_preset_compares_every_array():
    assert CFL.PAPER["decision_arrays"] == "every"


def test_a_model_of_many_arrays_scores_its_first_and_last_ones():
    """Beyond MAX_CANDIDATES arrays of two or more dimensions the first and the last half of them
    are the candidates (each with its bias), with every array together."""
    from clusterfed.strategies.array_choice import EVERY, MAX_CANDIDATES, candidates

    theta0 = {}
    for i in range(MAX_CANDIDATES + 6):
        theta0[f"l{i}.weight"], theta0[f"l{i}.bias"] = np.zeros((3, 2)), np.zeros(3)
    found = candidates(list(theta0), theta0)
    half = MAX_CANDIDATES // 2
    kept = [f"l{i}.weight" for i in [*range(half), *range(MAX_CANDIDATES + 6 - half, MAX_CANDIDATES + 6)]]
    assert list(found) == [*kept, EVERY] and found["l0.weight"] == ["l0.weight", "l0.bias"]
    assert found[EVERY] == list(theta0)


def test_when_the_choice_is_made_each_vector_keeps_its_chosen_part_once():
    """With similarity-decay, a client's vector is decay × its earlier vector + this round's update;
    the choice round's vectors are cut to the chosen arrays, this round's update counted once
    (not decay² × earlier + (1 + decay) × now), and a client absent from the choice round keeps
    its earlier evidence on the chosen arrays."""
    rng = np.random.default_rng(3)
    updates = groups_in_conv_hidden_by_fc(rng)
    strategy = make_strategy(CFL, GROUPS, **{**EVIDENCE, "similarity-decay": 0.5, "min-split-round": 10})
    first = updates()
    run_round(strategy, 1, first)
    second = {k: v for k, v in updates().items() if k != "0"}  # "0" sits the choice round out
    run_round(strategy, 2, second)
    assert strategy.state.chosen_arrays == ("conv1.weight", "conv1.bias")
    chosen = np.r_[0:80]  # conv1.weight and conv1.bias lead the flat update
    kept = strategy.state.last_vector
    assert np.allclose(kept["1"], 0.5 * first["1"][chosen] + second["1"][chosen], atol=1e-5)
    assert np.allclose(kept["0"], first["0"][chosen], atol=1e-6)


def own_data_sorted_beside_groups(seed):
    """12 clients in 2 groups, ``a.weight`` holding the groups (two opposite directions and
    noise); ``b.weight`` each client's own direction, the same every round, in one plane (an
    auxiliary head's update: its cut by angle scores a higher silhouette than the groups' and
    rotations of its rows score as high); ``c.weight``, ten times larger, each client's own
    noise, so that every array together shows nothing."""
    rng = np.random.default_rng(seed)
    n, groups = 12, np.arange(12) // 6
    direction = rng.standard_normal(20)
    direction /= np.linalg.norm(direction)
    plane = np.linalg.qr(rng.standard_normal((20, 2)))[0]
    angles = rng.uniform(0, 2 * np.pi, n)
    own_b, own_c = np.c_[np.cos(angles), np.sin(angles)] @ plane.T, rng.standard_normal((n, 60))
    theta0 = {"a.weight": np.zeros((2, 10)), "b.weight": np.zeros((2, 10)), "c.weight": np.zeros((6, 10))}

    def updates():
        return [{"a.weight": ((1 if groups[i] else -1) * direction + 0.27 * rng.standard_normal(20)).reshape(2, 10),
                 "b.weight": (own_b[i] + 0.05 * rng.standard_normal(20)).reshape(2, 10),
                 "c.weight": (10 * (own_c[i] + 0.3 * rng.standard_normal(60))).reshape(6, 10)} for i in range(n)]
    return theta0, updates


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_array_whose_cut_only_sorts_each_clients_own_data_is_passed_over(seed):
    """The most structured array leads only when its cut beats group-free rotations of its rows,
    the test a split on evidence must pass: here ``b.weight`` leads on silhouette and fails it,
    and the groups' array is chosen; the round's words say why."""
    from clusterfed.clustering.layer_evidence import LayerScore
    from clusterfed.strategies.array_choice import leader_of, score_round, words

    theta0, updates = own_data_sorted_beside_groups(seed)
    choice = {}
    chosen = [score_round(choice, r, updates(), list(theta0), theta0, min_silhouette=0.3, reference_draws=19,
                          max_clusters=None, seed=0) for r in (1, 2)]
    scores = {s["layer"]: s for s in choice["scores"]}
    untested = leader_of([LayerScore(**{k: v for k, v in s.items() if k != "taken"}) for s in scores.values()],
                         {EVERY})
    assert untested == "b.weight" and scores["b.weight"]["taken"] is False
    assert scores["b.weight"]["silhouette"] > scores["a.weight"]["silhouette"]
    assert chosen == [None, ["a.weight"]] and choice["chosen"] == "a.weight"
    said = words(choice)
    assert ("compares a.weight (chosen by evidence in rounds 1 and 2: best-cut silhouette" in said
            and "among the arrays whose cut beats group-free rotations (b.weight separated more, but its cut does "
                "not)" in said and "next b.weight" not in said)
