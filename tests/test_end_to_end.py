"""Whole runs: Flower's simulation engine (Ray), the in-process engine, the CLI."""

import json

import pytest

from clusterfed.cli import main as cli_main
from clusterfed.config import ConfigError
from clusterfed.results import ROUND_FIELDS
from clusterfed.server_app import run_server
from clusterfed.runner.inprocess import InProcessGrid
from clusterfed.simulation import simulate
pytestmark = pytest.mark.end_to_end

SUMMARY_FIELDS = ("final_accuracy", "best_accuracy", "rounds_to_target", "mb_to_target", "total_mb", "final_ari",
                  "num_clusters", "wall_seconds", "config")


def _rounds(out_dir):
    return [json.loads(line) for line in open(f"{out_dir}/rounds.jsonl")]


def test_flower_simulation_engine_writes_results_and_matches_inprocess(small_config, tmp_path):
    config = small_config(strategy="oracle", rounds=3, num_clients=4)
    summary = simulate(config, engine="flower", stream=None)
    rounds = _rounds(config.out_dir)
    assert [r["round"] for r in rounds] == [1, 2, 3]
    for record in rounds:
        assert set(ROUND_FIELDS) <= set(record)
        assert len(record["client_accuracy"]) == 4
    assert set(SUMMARY_FIELDS) <= set(summary)
    written = json.loads(open(f"{config.out_dir}/summary.json").read())
    assert written["final_accuracy"] == rounds[-1]["accuracy"] and written["final_ari"] == 1.0
    assert written["config"]["strategy"] == "oracle"
    assert json.loads(open(f"{config.out_dir}/config.json").read())["num-clients"] == 4
    for figure in ("accuracy.png", "traffic.png"):
        assert (tmp_path / "out" / figure).stat().st_size > 0

    # the same apps on the in-process grid give the same numbers (clients one after another, as
    # in Flower's engine; trained together they agree to float rounding: tests/test_batched_clients.py)
    again = small_config(strategy="oracle", rounds=3, num_clients=4, out_dir=str(tmp_path / "inprocess"),
                         client_batching="off")
    simulate(again, engine="inprocess", stream=None)
    inprocess = _rounds(again.out_dir)
    assert [r["client_accuracy"] for r in inprocess] == [r["client_accuracy"] for r in rounds]
    assert [r["cum_bytes_up"] for r in inprocess] == [r["cum_bytes_up"] for r in rounds]


def test_federation_size_mismatch_is_a_clear_error(small_config):
    from clusterfed.client_app import app

    config = small_config(num_clients=4)
    with pytest.raises(ConfigError, match="num-clients = 4 but the federation has 5 SuperNodes"):
        run_server(InProcessGrid(app, 5), config, stream=None, node_wait_seconds=0)


def test_our_fedavg_matches_flowers_fedavg(small_config, tmp_path):
    ours = small_config(strategy="fedavg", rounds=3, num_clients=4, out_dir=str(tmp_path / "ours"))
    flowers = small_config(strategy="flwr-fedavg", rounds=3, num_clients=4, out_dir=str(tmp_path / "flower"))
    simulate(ours, engine="inprocess", stream=None)
    simulate(flowers, engine="inprocess", stream=None)
    a, b = _rounds(ours.out_dir), _rounds(flowers.out_dir)
    for x, y in zip(a, b):
        assert x["accuracy"] == pytest.approx(y["accuracy"], abs=1e-6)
        assert x["bytes_up"] == y["bytes_up"] and x["bytes_down"] == y["bytes_down"]


def test_strategies_learn_and_oracle_beats_fedavg_on_concept_shift(small_config, tmp_path):
    common = {"rounds": 6, "num_clients": 8, "partitioner": "label-swap", "num_groups": 2, "local_epochs": 2}
    fedavg = simulate(small_config(strategy="fedavg", out_dir=str(tmp_path / "a"), **common), engine="inprocess", stream=None)
    oracle = simulate(small_config(strategy="oracle", out_dir=str(tmp_path / "b"), **common), engine="inprocess", stream=None)
    assert oracle["final_ari"] == 1.0 and fedavg["final_ari"] == 0.0
    assert oracle["final_accuracy"] > fedavg["final_accuracy"] + 0.2


def test_cli_partition_report(tmp_path, capsys):
    png = tmp_path / "p.png"
    assert cli_main(["partition-report", "--png", str(png), "--set", "num-clients=10", "--set", "partitioner=rotation"]) == 0
    out = capsys.readouterr().out
    assert "rotation" in out and png.stat().st_size > 0


def test_cli_missing_dataset_names_the_layout(tmp_path, capsys):
    code = cli_main(["run", "--engine", "inprocess", "--out", str(tmp_path / "o"),
                     "--set", "dataset=mnist", "--set", f"data-dir={tmp_path}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "MNIST/raw/train-images-idx3-ubyte" in err and "Traceback" not in err
