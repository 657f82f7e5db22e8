"""benchmarks/cluster_count_reasons.py: each grid's reasons.json, its purity, and rows of runs
run elsewhere kept when more seeds are added."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("cluster_count_reasons", ROOT / "benchmarks" / "cluster_count_reasons.py")
reasons = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reasons)


def test_purity_is_the_share_of_clients_in_a_cluster_whose_majority_group_is_theirs():
    groups = {"a": 0, "b": 0, "c": 1, "d": 1}
    assert reasons.purity({"a": 0, "b": 1, "c": 2, "d": 3}, groups) == 1.0  # an over-split of pure clusters
    assert reasons.purity({"a": 0, "b": 0, "c": 0, "d": 1}, groups) == 0.75
    assert reasons.purity({"a": 0}, {}) is None


def write_run(grid: Path, label: str, seed: int, ari: float, assignment: dict, groups: dict) -> None:
    run = grid / label / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"final_ari": ari, "num_clusters": len(set(assignment.values()))}))
    (run / "clusters.json").write_text(json.dumps({"assignment": assignment, "true_groups": groups,
                                                   "cluster_count_basis": "1 splits accepted"}))


def test_reasons_json_keeps_the_rows_of_runs_whose_folders_are_gone(tmp_path):
    grid = tmp_path / "grid"
    groups = {"a": 0, "b": 1}
    write_run(grid, "cfl", 0, 1.0, {"a": 0, "b": 1}, groups)
    reasons.main(str(tmp_path))
    (grid / "cfl" / "seed0" / "summary.json").unlink()  # not committed: gone on the next machine
    write_run(grid, "cfl", 1, 0.0, {"a": 0, "b": 0}, groups)
    reasons.main(str(tmp_path))
    rows = json.loads((grid / "reasons.json").read_text())["cfl"]
    assert sorted(rows) == ["seed0", "seed1"]
    assert rows["seed0"]["purity"] == 1.0 and rows["seed1"]["purity"] == 0.5
    assert rows["seed1"]["cluster_count_basis"] == "1 splits accepted"
