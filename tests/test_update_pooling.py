"""benchmarks/update_pooling.py: the pooled views of a client's updates and how they are scored."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from update_pooling import main, pooled_views, summary, view_scores  # noqa: E402


def test_views_are_the_latest_and_means_of_unit_updates():
    history = [np.array([2.0, 0.0]), np.array([0.0, 3.0]), np.array([0.0, -1.0])]
    views = pooled_views(history)
    assert np.allclose(views["latest"], [0.0, -1.0])
    assert np.allclose(views["last two"], [0.0, 0.0])  # two unit updates pointing apart cancel
    assert np.allclose(views["all"], [1 / 3, 0.0])


def test_a_known_grouping_is_recovered_and_a_shuffled_one_is_not():
    rng = np.random.default_rng(0)
    centres = np.eye(3, 20) * 5
    groups = [g for g in range(3) for _ in range(5)]
    rows = np.stack([centres[g] + rng.normal(0, 0.3, 20) for g in groups])
    found = view_scores(rows, groups, 3)
    assert found["ari"] == 1.0 and found["silhouette"] > 0.5
    assert view_scores(rows, list(rng.permutation(groups)), 3)["silhouette"] < 0.2


def test_summary_counts_gains_and_losses_against_the_latest_update():
    def record(seed, latest, last_two, every):
        return {"seed": seed, "views": {"latest": {"ari": latest, "silhouette": 0.0},
                                        "last two": {"ari": last_two, "silhouette": 0.0},
                                        "all": {"ari": every, "silhouette": 0.0}}}
    totals = summary([record(1, 0.5, 1.0, 1.0), record(2, 1.0, 1.0, 0.4), record(3, 0.2, 0.3, 0.95)])
    assert totals["latest"]["recovered"] == 1 and totals["latest"]["gains"] == []
    assert totals["last two"] == {**totals["last two"], "recovered": 2, "gains": [1], "losses": []}
    assert totals["all"]["gains"] == [1, 3] and totals["all"]["losses"] == [2]


def test_held_out_seeds_are_refused_before_any_work(tmp_path):
    with pytest.raises(SystemExit):
        main(["--seeds", "1200", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
