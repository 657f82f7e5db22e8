"""``benchmarks/longer_evidence.py``'s scoring: a cut beats its group-free reference where the rows
hold groups and not where they are one population; counts read per cell and length."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.append(str(ROOT / "benchmarks"))

import longer_evidence  # noqa: E402


def rows(groups: list[int], spread: float, seed: int = 0) -> np.ndarray:
    """One row per client: its group's direction (none when ``spread`` alone) plus noise."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(groups) + 1, 200))
    return np.stack([centres[g] + spread * rng.normal(size=200) for g in groups])


def test_three_groups_beat_their_reference_and_the_cut_recovers_them():
    groups = [0, 1, 2] * 6
    found = longer_evidence.structure(rows(groups, spread=0.5), groups, draws=19, seed=0)
    assert longer_evidence.shows(found) and found["ari"] == pytest.approx(1.0) and found["clusters"] == 3


def test_one_population_does_not_beat_its_reference():
    groups = [0] * 18
    U = np.random.default_rng(1).normal(size=(18, 200))
    found = longer_evidence.structure(U, groups, draws=19, seed=0)
    assert found["reference"] is not None and not longer_evidence.shows(found)


def test_counts_take_a_grouped_cell_as_shown_only_with_the_groups_recovered():
    def at(silhouette, reference, ari):
        return {"silhouette": silhouette, "reference": reference, "ari": ari, "clusters": 2}

    evidence = {
        "1": {"grouped": True, "r1": {"E": at(0.2, 0.3, 0.2), "4E": at(0.5, 0.3, 1.0)},
              "r5": {"E": at(0.4, 0.3, 0.5), "4E": at(0.5, 0.3, 1.0)}},  # shown after 4E only (E's cut is wrong)
        "2": {"grouped": False, "r1": {"E": at(0.4, 0.3, 0.0), "4E": at(0.2, 0.3, 0.0)},
              "r5": {"E": at(0.2, 0.3, 0.0), "4E": at(0.2, 0.3, 0.0)}},  # an IID control cut at E
    }
    assert longer_evidence.counts(evidence, 4) == {"grouped": 1, "grouped_shown_E": 0, "grouped_shown_long": 1,
                                                   "iid": 1, "iid_shown_E": 1, "iid_shown_long": 0}
