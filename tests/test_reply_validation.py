"""A malformed train reply is rejected, recorded, and touches no cluster model.

A custom ClientApp wraps the real train handler and corrupts the ArrayRecord of one
client's reply; the run goes through ``simulate`` with the in-process engine. The strategy
object is captured (``RunConfig.build_strategy`` patched, ``harness.capture_algorithms``) to compare cluster models.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from harness import capture_algorithms

from clusterfed import ClientFailureError, protocol
from clusterfed.client_app import do_evaluate, do_train, profile
from clusterfed.config import parse_config
from clusterfed.simulation import simulate

BAD_CLIENT = 0


def corrupt_wrong_shape(arrays):
    name = next(iter(arrays))
    arrays[name] = arrays[name].reshape(-1)[:-1].copy()


def corrupt_nan(arrays):
    name = list(arrays)[-1]
    arrays[name] = arrays[name].copy()
    arrays[name].flat[0] = np.nan


def corrupt_missing(arrays):
    del arrays[list(arrays)[-1]]


def corrupt_extra(arrays):
    arrays["sneaky.weight"] = np.zeros(3, dtype=np.float32)


def corrupt_dtype(arrays):
    name = next(iter(arrays))
    arrays[name] = arrays[name].astype(np.float64)


CORRUPTIONS = {
    "wrong shape": (corrupt_wrong_shape, "shape"),
    "NaN": (corrupt_nan, "NaN"),
    "missing array": (corrupt_missing, "missing ['fc2.bias']"),
    "extra array": (corrupt_extra, "unexpected ['sneaky.weight']"),
    "wrong dtype": (corrupt_dtype, "dtype"),
}


def app_with(handler) -> ClientApp:
    app = ClientApp()
    app.query("profile")(profile)
    app.train()(handler)
    app.evaluate()(do_evaluate)
    return app


def corrupting_app(corrupt, phases=None) -> ClientApp:
    """The real client, except that BAD_CLIENT's train replies are corrupted (in ``phases``, default all)."""

    def train(msg: Message, context: Context) -> Message:
        reply = do_train(msg, context)
        phase = msg.content[protocol.CONFIG].get("phase")
        if int(context.node_config["partition-id"]) == BAD_CLIENT and (phases is None or phase in phases):
            arrays = protocol.from_array_record(reply.content[protocol.ARRAYS])
            corrupt(arrays)
            reply.content[protocol.ARRAYS] = protocol.to_array_record(arrays)
        return reply

    return app_with(train)


def silent_app() -> ClientApp:
    """The real client, except that BAD_CLIENT's training fails (no usable reply)."""

    def train(msg: Message, context: Context) -> Message:
        if int(context.node_config["partition-id"]) == BAD_CLIENT:
            raise RuntimeError("this client sends nothing")
        return do_train(msg, context)

    return app_with(train)


def run(tmp_path, monkeypatch, client_app, **values):
    """simulate() with ``client_app``; returns (the algorithm, rounds.jsonl records)."""
    captured = capture_algorithms(monkeypatch)
    config = parse_config({"num-clients": 4, "rounds": 1, "batch-size": 32, "out-dir": str(tmp_path),
                           "partitioner": "label-groups", "label-groups": "0-4;5-9", **values})
    simulate(config, engine="inprocess", stream=None, client_app=client_app)
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    return captured[0], rounds


@pytest.fixture(scope="module")
def models_without_the_bad_client(tmp_path_factory):
    """FedAvg's model after one round in which BAD_CLIENT sent nothing usable."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        strategy, _ = run(tmp_path_factory.mktemp("silent"), monkeypatch, silent_app())
    return strategy.models


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_malformed_reply_is_rejected_and_touches_no_model(kind, tmp_path, monkeypatch, models_without_the_bad_client):
    corrupt, reason = CORRUPTIONS[kind]
    strategy, rounds = run(tmp_path, monkeypatch, corrupting_app(corrupt))
    assert rounds[0]["rejected"] == 1 and rounds[0]["transmissions"] == 4
    (rejection,) = rounds[0]["rejections"]
    assert rejection["client"] == str(BAD_CLIENT) and reason in rejection["reason"]
    # the cluster model is the average of the three good replies, exactly as if the bad one never came
    assert strategy.models.keys() == models_without_the_bad_client.keys()
    for cluster, model in strategy.models.items():
        for name, value in model.items():
            np.testing.assert_array_equal(value, models_without_the_bad_client[cluster][name])


def test_every_reply_malformed_leaves_the_model_at_theta0_and_stops_the_run(tmp_path, monkeypatch):
    # corrupt all four clients: no valid reply, so the one cluster keeps θ0, and a run in
    # which nothing trained stops saying why
    def train(msg, context):
        reply = do_train(msg, context)
        arrays = protocol.from_array_record(reply.content[protocol.ARRAYS])
        corrupt_nan(arrays)
        reply.content[protocol.ARRAYS] = protocol.to_array_record(arrays)
        return reply

    captured = capture_algorithms(monkeypatch)
    config = parse_config({"num-clients": 4, "rounds": 1, "batch-size": 32, "out-dir": str(tmp_path),
                           "partitioner": "label-groups", "label-groups": "0-4;5-9"})
    with pytest.raises(ClientFailureError, match="contains NaN or infinite values"):
        simulate(config, engine="inprocess", stream=None, client_app=app_with(train))
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert rounds[0]["rejected"] == 4
    strategy = captured[-1]
    for name, value in strategy.models[0].items():
        np.testing.assert_array_equal(value, strategy.theta0[name])


def test_full_model_instead_of_the_requested_layer_is_rejected_in_the_clustering_round(tmp_path, monkeypatch):
    """FedClust under the paper's rule asks for the final layer only; a client that sends more is rejected and
    left out of the clustering (placed later as a newcomer if it behaves)."""

    def add_everything(arrays):
        arrays["conv1.weight"] = np.zeros((16, 1, 3, 3), dtype=np.float32)

    strategy, rounds = run(tmp_path, monkeypatch, corrupting_app(add_everything, phases={"cluster"}),
                           strategy="fedclust", **{"cluster-epochs": 1, "fedclust.cluster-layers": "final"})
    assert rounds[0]["rejected"] == 1 and "unexpected ['conv1.weight']" in rounds[0]["rejections"][0]["reason"]
    assert str(BAD_CLIENT) not in strategy.assignment
    assert str(BAD_CLIENT) not in strategy.state.clustering_state["client_order"]
    assert len(strategy.state.clustering_state["client_order"]) == 3
