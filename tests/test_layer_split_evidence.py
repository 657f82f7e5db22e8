"""The test a CFL-family split must pass on evidence (``clustering/layer_split.evidence_reference``):
from 12 members, the members' best cut against group-free rotations in parts' separation as well
as silhouette; below, the silhouette alone; and what the refusal says."""

from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest

from clusterfed.clustering.layer_split import (EVIDENCE_DRAWS, EVIDENCE_TEST_MIN_ROWS, SMALL_SIDE_RANK, best_cut_score,
                                              evidence_reference, small_side_reference)
from clusterfed.clustering.null_reference import reference_score, same_level, shared_draws
from clusterfed.clustering.split_scores import best_cut_silhouette, cosine_similarity_matrix
from clusterfed.explain.bipartition import cfl_refusal_numbers, hicfl_refusal_numbers
from clusterfed.explain.numbers import false_comparisons
from clusterfed.strategies.cfl import CFLParams
from clusterfed.strategies.hicfl import HiCFLParams

TEST = {"rule": "linkage", "small_draws": 19, "min_split_size": 3, "max_k": 5, "seed": 0}


def one_task(clients: int, seed: int) -> np.ndarray:
    """One task's clients: the task's direction, each client's own direction in a few
    dimensions (its own data, as real updates clump) and a little noise."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(60, 60)))[0].T
    own = rng.standard_normal((clients, 3)) @ basis[10:13]
    return 2.0 * basis[5] + own + 0.05 * rng.standard_normal((clients, 60))


def groups(sizes: list[int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(sizes), 60))
    labels = np.repeat(np.arange(len(sizes)), sizes)
    return rng.normal(size=60) + centres[labels] + 0.4 * rng.normal(size=(len(labels), 60))


@pytest.mark.parametrize("seed", [25, 59, 72])
def test_one_tasks_members_whose_silhouette_beats_rotations_are_refused_on_their_separation(seed):
    """The cut the rotations' silhouette alone took (it beats theirs), refused: its parts are no
    further apart than the rotations' parts."""
    rows = one_task(15, seed)
    tested = evidence_reference(rows, 5, **TEST, members=len(rows))
    assert tested.test == "group_free" and tested.groups is not None
    assert tested.groups.silhouette > tested.groups.rotated_silhouette  # the silhouette alone passed it
    assert not tested.passes(tested.groups.silhouette)
    said = tested.words(tested.groups.silhouette, 5)
    assert said.startswith(f"its members' updates cut into {tested.parts} parts, but ") and "one task" in said
    assert not false_comparisons(said)


def test_four_groups_split_in_two_pass_on_their_best_cut():
    """A split of several groups into two holds whole groups on each side, whose spread is not
    the members' own: tested as two parts (split-silhouette-max-k 2) it does not pass; the
    members' best cut (the groups) is what is tested, and it passes."""
    rows = groups([4, 4, 4, 4], seed=3)
    two_sided = evidence_reference(rows, 8, **{**TEST, "max_k": 2}, members=len(rows))
    assert two_sided.parts == 2 and not two_sided.passes(two_sided.groups.silhouette)
    tested = evidence_reference(rows, 8, **TEST, members=len(rows))
    assert tested.groups is not None and tested.parts == 4
    assert tested.passes(tested.groups.silhouette)
    assert not false_comparisons(tested.groups.words())


def test_below_twelve_members_the_rotations_silhouette_decides():
    rows = one_task(EVIDENCE_TEST_MIN_ROWS - 1, seed=22)
    tested = evidence_reference(rows, 5, **TEST, members=len(rows))
    assert tested.groups is None and tested.test == "group_free" and tested.reference is not None
    # the reference the family used before the group test: the rotations' best-cut silhouette
    old = reference_score(rows.astype(np.float64), lambda R: float(best_cut_silhouette(cosine_similarity_matrix(R), 5)[0]),
                          draws=EVIDENCE_DRAWS, seed=0, method="rotation")
    assert tested.reference == old
    assert tested.passes(old + 0.01) and not tested.passes(old)
    small = evidence_reference(rows, 2, **TEST, members=len(rows))  # a side below min-split-size: the small-side test
    assert small.test == "small" and small.groups is None


def test_the_closing_reason_quotes_the_group_tests_numbers():
    rows = one_task(15, 22)
    tested = evidence_reference(rows, 5, **TEST, members=len(rows))
    record = {"round": 7, "cluster": 0, "reason": "group_free", "best_cut_silhouette": tested.groups.silhouette,
              "required_silhouette": tested.reference, "members": [["a"], ["b"]], **tested.as_record()}
    said = cfl_refusal_numbers(SimpleNamespace(refused=[record]), CFLParams())  # a state of refusals only
    assert said == f"closest refusal by the group test: round 7, cluster 0: {tested.groups.words()}"
    assert "separation" in said and not false_comparisons(said)
    entry = {"round": 8, "cluster": 1, "layer": "fc1", "code": "group_free",
             "silhouettes": {"fc1": tested.groups.silhouette}, "reference_silhouette": tested.reference,
             **tested.as_record()}
    said = hicfl_refusal_numbers(SimpleNamespace(no_split=[entry]), HiCFLParams())
    assert said.endswith(f"cluster 1, fc1: {tested.groups.words()}") and not false_comparisons(said)


def test_the_closest_group_test_refusal_is_the_nearest_to_the_rotations_separation():
    def refused(cluster, own, rotated):
        return {"round": 5, "cluster": cluster, "reason": "group_free", "best_cut_silhouette": 0.5,
                "required_silhouette": 0.3, "members": [["a"], ["b"]], "group_words": f"words {cluster}",
                "group_test": {"separation": own, "rotated_separation": rotated}}

    state = SimpleNamespace(refused=[refused(0, 1.0, 2.0), refused(1, 1.8, 2.0), refused(2, 3.0, math.inf)])  # infinitely far from passing
    assert cfl_refusal_numbers(state, CFLParams()).endswith("cluster 1: words 1")



def noisy_pairs(separation: float, seed: int, rows: int = 4) -> np.ndarray:
    """Two groups (2 | rows - 2 clients) whose centres lie ``separation`` apart against unit noise
    per coordinate, about a shared direction; 0 draws one task."""
    rng = np.random.default_rng(seed)
    centres = separation * rng.normal(size=(2, 400))
    labels = np.array([0, 0] + [1] * (rows - 2))
    return rng.normal(size=400) + centres[labels] + rng.normal(size=(rows, 400))


def rotations(rows: np.ndarray, draws: int, seed: int, rank: int = 1) -> float:
    return reference_score(rows, partial(best_cut_score, max_k=TEST["max_k"]), draws=draws, seed=seed,
                           method="rotation", rank=rank)


def small_reference(rows: np.ndarray, draws: int, seed: int = 0) -> float:
    """The small-side test's reference at the level of ``draws`` rotations' largest: the
    ``SMALL_SIDE_RANK``-th largest of that many times more."""
    many, rank = same_level(draws, SMALL_SIDE_RANK)
    return rotations(rows, many, seed, rank=rank)


def small_side_passes(rows: np.ndarray, seed: int) -> bool:
    tested = evidence_reference(rows, 2, **{**TEST, "small_draws": 99, "seed": seed}, members=len(rows))  # the family's 99
    assert tested.test == "small"
    return tested.passes(best_cut_score(rows, max_k=TEST["max_k"]))


def test_a_cluster_too_small_for_two_full_sides_tests_its_small_side_at_every_splits_level():
    """Below 2 × min-split-size members every split leaves a small side: its rotations are held to
    EVIDENCE_DRAWS (a 5 % test, as every other split's), so true 2 | 2 groups pass where 99 draws
    refused most of them (three in four here), while one task's 4 clients pass about one time in
    22 here (a 5 % test; bound 0.1); from 2 × min-split-size members of the cluster (whether or
    not all are compared) a small side keeps its 99 draws, and so does any small side on
    Sattler's timing."""
    pairs = [noisy_pairs(0.6, seed) for seed in range(60)]
    at_99 = sum(best_cut_score(rows, max_k=TEST["max_k"]) > rotations(rows, 99, seed) for seed, rows in enumerate(pairs))
    taken = sum(small_side_passes(rows, seed) for seed, rows in enumerate(pairs))
    assert taken >= at_99 + 12, (taken, at_99)
    assert evidence_reference(pairs[0], 2, **{**TEST, "small_draws": 99}, members=4).reference == small_reference(pairs[0], EVIDENCE_DRAWS)
    # four repliers of a cluster of six members: a balanced split of the cluster was possible
    assert evidence_reference(pairs[0], 2, **{**TEST, "small_draws": 99}, members=6).reference == small_reference(pairs[0], 99)
    six = noisy_pairs(0.6, 3, rows=6)
    assert evidence_reference(six, 2, **{**TEST, "small_draws": 99}, members=6).reference == small_reference(six, 99)
    # Sattler's timing (no agreement of two rounds) keeps 99 draws whatever the cluster's size
    assert small_side_reference(pairs[0], 2, rule="linkage", draws=99, min_split_size=3, max_k=TEST["max_k"],
                                seed=0) == small_reference(pairs[0], 99)
    chance = sum(small_side_passes(noisy_pairs(0.0, seed), seed) for seed in range(200)) / 200
    assert chance <= 0.1, chance


def test_a_small_side_is_tested_at_its_level_on_more_draws_than_the_level_needs():
    """Beating the largest of 19 rotations and beating the fifth largest of 99 are tests at one
    level (one time in 20), but the largest of 19 is one draw's luck: where a draw of the
    rotations happens to clump the rows it refuses true groups, and the same draw refuses them
    round after round (the reference is seeded). The fifth of 99 sits near the rotations' own 95th
    percentile, so true 2 | 2 groups pass more often (13 more of 60 here) and one task's 4 clients
    no more often (9 of 200 here, against 14 of 200 beating the largest of 19)."""
    assert same_level(19, 5) == (99, 5) and same_level(99, 5) == (499, 5) and same_level(19, 1) == (19, 1)
    pairs = [noisy_pairs(0.6, seed) for seed in range(60)]
    largest = sum(best_cut_score(rows, max_k=TEST["max_k"]) > rotations(rows, 19, seed) for seed, rows in enumerate(pairs))
    taken = sum(best_cut_score(rows, max_k=TEST["max_k"]) > small_reference(rows, 19, seed)
                for seed, rows in enumerate(pairs))
    assert taken >= largest + 8, (taken, largest)
    one_task_rows = [noisy_pairs(0.0, seed) for seed in range(200)]
    chance = sum(best_cut_score(rows, max_k=TEST["max_k"]) > small_reference(rows, 19, seed)
                 for seed, rows in enumerate(one_task_rows)) / 200
    assert chance <= 0.08, chance
    # the rank-th largest: the fifth of five draws is their smallest
    scores = [rotations(pairs[0], 5, 0, rank=r) for r in range(1, 6)]
    assert scores == sorted(scores, reverse=True) and scores[0] == rotations(pairs[0], 5, 0)


@pytest.mark.parametrize("seed", [133, 211, 227])
def test_a_split_chosen_among_several_layers_must_beat_their_shared_rotations(seed):
    """One task's 15 clients whose best cut beats group-free rotations at the level of 19 by
    chance (about one draw in 60 of these): asked as the best of 5 layers' cuts, it must beat
    them at the level of the 99 the 5 tests share (``shared_draws``; read as the fifth largest
    of 499), and it does not; two groups of 6 still do."""
    rows = one_task(15, seed)
    alone = evidence_reference(rows, 5, **TEST, members=len(rows))
    assert alone.passes(alone.groups.silhouette)
    shared = evidence_reference(rows, 5, **TEST, members=len(rows), draws=shared_draws(EVIDENCE_DRAWS, 5))
    assert shared_draws(EVIDENCE_DRAWS, 5) == 99 and not shared.passes(shared.groups.silhouette)
    two = groups([6, 6], seed)
    tested = evidence_reference(two, 6, **TEST, members=len(two), draws=shared_draws(EVIDENCE_DRAWS, 5))
    assert tested.parts == 2 and tested.passes(tested.groups.silhouette)
