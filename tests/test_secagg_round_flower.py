"""Secure aggregation through Flower's simulation engine (Ray): the built-in ServerApp and
ClientApp (which carries ``clusterfed.secagg.secagg_mod``) run FedClust with SecAgg+ per
cluster after its clustering round, and end as the in-process engine does."""

import json

import pytest

from clusterfed.simulation import simulate

pytestmark = pytest.mark.end_to_end


def _rounds(out_dir):
    return [json.loads(line) for line in open(f"{out_dir}/rounds.jsonl")]


def test_fedclust_secure_through_flowers_simulation_engine(small_config, tmp_path):
    keys = {"strategy": "fedclust", "rounds": 3, "num_clients": 6, "secure_aggregation": "secaggplus"}
    config = small_config(**keys)
    summary = simulate(config, engine="flower", stream=None)
    rounds = _rounds(config.out_dir)
    assert summary["final_ari"] == 1.0
    for record in rounds:  # every round's training summed per cluster: two clusters of three
        sums = record["secure_aggregation"]
        assert sorted(sums) == ["0", "1"] and all(s["members"] == 3 and not s["dropped"] for s in sums.values())
    # the in-process engine, clients one after another as in Flower's engine, gives the same run
    again = small_config(**keys, out_dir=str(tmp_path / "inprocess"), client_batching="off")
    simulate(again, engine="inprocess", stream=None)
    inprocess = _rounds(again.out_dir)
    for here, there in zip(inprocess, rounds):  # the same clients, within the quantization's effect on accuracy
        assert here["client_accuracy"].keys() == there["client_accuracy"].keys()
        assert list(here["client_accuracy"].values()) == pytest.approx(list(there["client_accuracy"].values()),
                                                                       abs=0.02)
    assert json.loads(open(f"{config.out_dir}/clusters.json").read())["assignment"] == \
        json.loads(open(f"{again.out_dir}/clusters.json").read())["assignment"]
