"""clusterfed compare: the grid's csv and markdown, the best marked, bad input refused before any run."""

from __future__ import annotations

import csv
import json

import pytest

from clusterfed.experiments import grids
from clusterfed.cli import main
from clusterfed.compare import CSV_COLUMNS, markdown_table


@pytest.fixture(scope="module")
def tiny_compare(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    code = main(["compare", "--strategies", "fedavg,oracle", "--seeds", "0,1", "--out", str(out),
                 "--set", "rounds=2", "--set", "num-clients=8", "--set", "partitioner=label-swap",
                 "--set", "num-groups=2", "--set", "checkpoint=false"])
    assert code == 0
    return out


@pytest.mark.end_to_end
def test_csv_has_one_row_per_strategy_and_seed(tiny_compare):
    with (tiny_compare / "comparison.csv").open() as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        rows = list(reader)
    assert [(r["strategy"], r["seed"]) for r in rows] == [("fedavg", "0"), ("fedavg", "1"), ("oracle", "0"), ("oracle", "1")]
    for row in rows:
        assert row["rounds"] == "2"
        assert 0.0 <= float(row["final_accuracy"]) <= float(row["best_accuracy"]) <= 1.0
        assert float(row["mb_up"]) > 0 and float(row["mb_down"]) > 0
        assert int(row["transmissions"]) == 2 * 8  # every client trains every round
    oracle = [r for r in rows if r["strategy"] == "oracle"]
    assert all(float(r["final_ari"]) == 1.0 and r["num_clusters"] == "2" for r in oracle)
    fedavg = [r for r in rows if r["strategy"] == "fedavg"]
    assert all(float(r["final_ari"]) == 0.0 and r["num_clusters"] == "1" for r in fedavg)
    # the partition depends on the data keys and the seed only: same clients for both strategies
    for seed in (0, 1):
        groups = [(tiny_compare / s / f"seed{seed}" / "clusters.json").read_text() for s in ("fedavg", "oracle")]
        assert json.loads(groups[0])["true_groups"] == json.loads(groups[1])["true_groups"]


@pytest.mark.end_to_end
def test_markdown_has_mean_std_and_figures(tiny_compare):
    text = (tiny_compare / "comparison.md").read_text()
    header = text.splitlines()[0]
    for column in ("final acc", "best acc", "acc std over clients", "ARI", "clusters", "rounds to target",
                   "MB to target", "MB up", "MB down", "transmissions", "wall s"):
        assert column in header
    oracle_line = next(line for line in text.splitlines() if line.startswith("| oracle"))
    assert "**1.00 ± 0.00**" in oracle_line  # ARI: the oracle is best
    assert (tiny_compare / "accuracy_vs_round.png").stat().st_size > 0
    assert (tiny_compare / "accuracy_vs_mb.png").stat().st_size > 0


def test_markdown_marks_the_best_per_column():
    def row(strategy, seed, acc, mb, reached):
        return {"strategy": strategy, "seed": seed, "final_accuracy": acc, "best_accuracy": acc, "accuracy_std": 0.1,
                "final_ari": 0.5, "num_clusters": 3, "rounds_to_target": reached, "mb_to_target": reached,
                "mb_up": mb, "mb_down": mb, "transmissions": 10, "wall_seconds": 1.0, "target_accuracy": 0.9}

    rows = [row("a", 0, 0.8, 5.0, 3), row("a", 1, 0.6, 5.0, None),  # a: reached the target on one seed only
            row("b", 0, 0.5, 4.0, 7), row("b", 1, 0.5, 4.0, 9)]
    lines = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in markdown_table(rows).splitlines()[2:4]}
    final_acc, mb_up, rounds_to_target, clusters = 0, 7, 5, 4
    assert lines["a"][final_acc].strip() == "**0.700 ± 0.100**"
    assert lines["b"][final_acc].strip() == "0.500 ± 0.000"
    assert lines["b"][mb_up].strip() == "**4.0 ± 0.0**"  # lower is better
    assert lines["a"][rounds_to_target].strip() == "3.0 (1/2)"  # not ranked: missed on a seed
    assert lines["b"][rounds_to_target].strip() == "**8.0 ± 1.0**"
    assert "**" not in lines["a"][clusters] + lines["b"][clusters]  # no best number of clusters
    assert "**" in lines["a"][3] and "**" in lines["b"][3]  # a tie: both marked


def test_unknown_strategy_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    def no_run(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(grids, "run_one", no_run)
    out = tmp_path / "cmp"
    code = main(["compare", "--strategies", "fedavg,fedclsut,oracle,nope", "--seeds", "0,1", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "'fedclsut', 'nope'" in err and "available:" in err and err.count("\n") == 1
    assert not out.exists()


def test_bad_key_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grids, "run_one", lambda *a, **k: pytest.fail("a run started"))
    code = main(["compare", "--strategies", "fedavg,oracle", "--out", str(tmp_path / "c"), "--set", "rounds=0"])
    assert code == 2
    assert "rounds" in capsys.readouterr().err
