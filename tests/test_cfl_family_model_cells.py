"""The CFL family on two model-matrix cells whose right answer is known (12 stock clients,
client i in group i mod 3): CFL must not merge its true groups back once they have
converged, HiCFL must not split a 4-client group in two on noise."""

from __future__ import annotations

from model_matrix.cells import rounds_for, run_cell
from test_model_matrix import one_thread_quiet_flower  # noqa: F401  (autouse: one thread, quiet Flower)
import pytest
pytestmark = pytest.mark.end_to_end


def test_cfl_keeps_converged_true_groups_apart():
    # the round's updates of the two sides were alike at round 18 (cosine 0.61, silhouette
    # -0.01) and merged them back; their drifts since the split disagree
    cell, result = run_cell("gru", "covariate", "cfl", rounds=rounds_for("cfl"))
    assert cell.ari == 1.0 and cell.clusters == 3, (cell.clusters, cell.reason, result.clustering["merges"])


def test_hicfl_does_not_split_four_clients_of_one_group():
    # 2 | 2 cuts of a pure group on the output layer reached min-silhouette (0.46-0.48)
    cell, result = run_cell("mlp", "covariate", "hicfl", rounds=rounds_for("hicfl"))
    assert cell.ari == 1.0 and cell.clusters == 3, (cell.clusters, result.clustering["splits"])
    refused = [n for n in result.clustering["no_split"] if n["code"] == "reference"]
    assert refused and all(n["reference_silhouette"] >= max(n["silhouettes"].values()) for n in refused)
