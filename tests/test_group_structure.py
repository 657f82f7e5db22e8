"""The test that tells a cut into groups from one task's spread: the cut against group-free
rotations of the same rows (``clustering/group_structure.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfed.clustering.agglomerative import cluster_auto
from clusterfed.clustering import group_structure
from clusterfed.clustering.group_structure import (CLEAR_SEPARATION, GROUP_TEST_RANK, MIN_ROWS, RANKED_MAX_ROWS,
                                                 SMALL_ROWS, GroupTest, group_test, separation)
from clusterfed.clustering.null_reference import MAX_REFERENCE_ROWS, reference_draws
from clusterfed.clustering.oneshot import cut_into
from clusterfed.explain.numbers import false_comparisons

TEST = {"metric": "cosine", "linkage": "average", "max_clusters": 10, "draws": 19, "seed": 0}


def best_cut(X: np.ndarray) -> np.ndarray:
    return np.asarray(cluster_auto(X, metric="cosine", linkage="average", min_silhouette=-1.0, max_clusters=10).labels)


def one_task(clients: int, seed: int) -> np.ndarray:
    """The task's direction plus each client's own data (exchangeable rows)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=60) + rng.normal(size=(clients, 60))


def groups(sizes: list[int], spread: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The task's direction, each group's own, each client's own data."""
    rng = np.random.default_rng(seed)
    task, centres = rng.normal(size=60), rng.normal(size=(len(sizes), 60))
    labels = np.repeat(np.arange(len(sizes)), sizes)
    return task + centres[labels] + spread * rng.normal(size=(len(labels), 60)), labels


@pytest.mark.parametrize("seed", range(5))
def test_the_best_cut_of_one_tasks_clients_does_not_pass(seed):
    X = one_task(12, seed)
    tested = group_test(X, best_cut(X), **TEST)
    assert not tested.passes
    assert not false_comparisons(tested.words())


@pytest.mark.parametrize("sizes", [[4, 4, 4], [6, 7], [3, 3, 3]])
def test_groups_pass_and_their_words_say_so(sizes):
    X, labels = groups(sizes, spread=0.5, seed=1)
    tested = group_test(X, labels, **TEST)
    assert tested.passes and tested.separation > tested.rotated_separation
    assert tested.words().startswith(("it beats group-free rotations", "its parts are clearly further apart"))
    assert not false_comparisons(tested.words())


def test_the_test_is_read_at_its_level_from_more_draws_than_the_level_needs():
    """Beating the largest of 19 rotations and beating the fifth largest of 99 are tests at one
    level (one time in 20), but the largest of 19 is one draw's luck, which the seeded reference
    repeats round after round. Read from 99 draws, groups near the edge of what the rotations
    reach pass more often (11 more of 40 here), and the best cut of one task's clients no more
    often (none of 60 here, against one beating the largest of 19)."""
    assert GROUP_TEST_RANK == 5
    near = [groups([4, 4, 4], spread=1.6, seed=seed) for seed in range(40)]
    largest = sum(group_test(X, labels, **TEST, rank=1).passes for X, labels in near)
    taken = sum(group_test(X, labels, **TEST).passes for X, labels in near)
    assert taken >= largest + 6, (taken, largest)
    chance = sum(group_test(X, best_cut(X), **TEST).passes for X in (one_task(12, seed) for seed in range(60))) / 60
    assert chance <= 0.05, chance
    # the reference is the fifth largest of the 99 rotations' separations (rank 1: the largest of 19)
    X, labels = near[0]
    rotated = [separation(R, cut_into(R, 3, metric="cosine", linkage="average"))
               for R in reference_draws(X, 99, TEST["seed"], MAX_REFERENCE_ROWS, "rotation")]
    assert group_test(X, labels, **TEST).rotated_separation == pytest.approx(sorted(rotated, reverse=True)[4])
    assert group_test(X, labels, **TEST, rank=1).rotated_separation == pytest.approx(max(rotated[:19]))
    # beyond RANKED_MAX_ROWS rows the largest of the draws themselves (the cost of five times the draws)
    many, labels = groups([34, 34, 33], spread=3.0, seed=0)
    assert len(many) == RANKED_MAX_ROWS + 1
    assert group_test(many, labels, **TEST) == group_test(many, labels, **TEST, rank=1)
    assert group_test(many[1:], labels[1:], **TEST) != group_test(many[1:], labels[1:], **TEST, rank=1)  # 100 rows: ranked


def test_no_test_without_parts_draws_or_enough_rows():
    """Below MIN_ROWS rows the rotations fall into parts about as well as groups: not asked."""
    X, labels = groups([4, 4], spread=0.5, seed=4)
    assert group_test(X, np.zeros(8, int), **TEST) is None
    assert group_test(X, labels, **{**TEST, "draws": 0}) is None
    assert group_test(X[1:6], labels[1:6], **TEST) is None and MIN_ROWS == 6
    assert group_test(X[1:7], labels[1:7], **TEST) is not None


def unequal_norms(X: np.ndarray, seed: int) -> np.ndarray:
    """Each client's update scaled as clients of one task scale theirs (0.4 to 1.9 times)."""
    return X * np.random.default_rng(100 + seed).uniform(0.4, 1.9, size=(len(X), 1))


@pytest.mark.parametrize("seed", range(5))
def test_a_federation_of_seven_is_tested_on_unit_rows(seed, monkeypatch):
    """Seven clients whose update norms differ: one task's best cut does not pass; groups of 3
    and 4 pass on the rows as unit vectors (the cosine cut's geometry), and would not on the
    raw rows, whose norms' spread hides them."""
    X = unequal_norms(one_task(7, seed), seed)
    assert not group_test(X, best_cut(X), **TEST).passes
    grouped, labels = groups([3, 4], spread=0.5, seed=seed)
    grouped = unequal_norms(grouped, seed)
    assert group_test(grouped, labels, **TEST).passes
    monkeypatch.setattr(group_structure, "SMALL_ROWS", 7)  # seven rows tested as they are
    assert not group_test(grouped, labels, **TEST).passes and SMALL_ROWS == 8


def test_separation_is_the_squared_mean_gap_over_what_the_spread_gives_it():
    X = np.array([[0.0, 0.0], [2.0, 0.0], [10.0, 0.0], [12.0, 0.0]])
    # means 1 and 11 (gap² 100); pooled within variance (1+1+1+1)/(4-2) = 2; 2·(1/2 + 1/2) = 2
    assert separation(X, np.array([0, 0, 1, 1])) == pytest.approx(50.0)
    assert separation(X, np.zeros(4, int)) == 0.0
    tight = np.array([[0.0, 0.0], [0.0, 0.0], [10.0, 0.0], [10.0, 0.0]])  # no spread within the parts
    assert separation(tight, np.array([0, 0, 1, 1])) == np.inf


@pytest.mark.parametrize("numbers", [(0.3, 0.4, 1.2, 1.3), (0.5, 0.4, 1.2, 1.1), (0.3, 0.4, 2.5, 1.1),
                                     (0.3, 0.4, 1.5, 1.1)])
def test_the_words_compare_their_numbers_truly(numbers):
    """Beaten on separation: no; beaten on both, or on separation CLEAR_SEPARATION times: yes."""
    tested = GroupTest(*numbers)
    silhouette, rotated_silhouette, own, rotated = numbers
    assert tested.passes == (own > rotated and (silhouette > rotated_silhouette or own >= CLEAR_SEPARATION * rotated))
    assert not false_comparisons(tested.words())
    assert tested.passes == tested.words().startswith(("it beats", "its parts are clearly"))
