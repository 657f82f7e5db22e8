"""Evidence without the bytes: FedClust's and AdaCFL's clustering round (cluster-layers = auto)
uploads each candidate layer's update projected by a seeded CountSketch shared with the server,
at most the paper layer's bytes; the distances survive within the stated error."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict

from clusterfed import protocol
from clusterfed.clustering.evidence_sketch import (
    cosine_error_bound, decode, encode, encoded_bytes, in_space, plan, plan_bytes, project, sketch)
from clusterfed.strategies import evidence_upload


# ----------------------------------------------------------------------------- the math
def test_the_plan_keeps_the_upload_within_the_paper_layers_bytes():
    shapes = {"conv.weight": ((32, 16, 3, 3), np.float32), "conv.bias": ((32,), np.float32),
              "fc1.weight": ((128, 512), np.float32), "fc1.bias": ((128,), np.float32),
              "fc2.weight": ((10, 128), np.float32), "fc2.bias": ((10,), np.float32)}
    layers = {"conv": ["conv.weight", "conv.bias"], "fc1": ["fc1.weight", "fc1.bias"], "fc2": ["fc2.weight", "fc2.bias"]}
    budget = (10 * 128 + 10) * 4
    p = plan(shapes, layers, budget, seed=3)
    assert plan_bytes(p) <= budget and set(p["sizes"]) == set(shapes)
    assert p["sizes"]["fc2.bias"] == 10 and p["sizes"]["conv.bias"] == 32  # small arrays travel whole
    assert sum(p["sizes"].values()) > 2 * (budget // 4)  # 4-bit numbers: more than 2x float32's
    # a budget the arrays fit in: no projection
    assert plan(shapes, {"fc2": ["fc2.weight", "fc2.bias"]}, budget, seed=3) == {}
    # more arrays than numbers: one number each at most the budget allows
    tiny = plan(shapes, layers, 4 * 6, seed=0)
    assert plan_bytes(tiny) <= 4 * 6


def test_client_and_server_build_the_same_map():
    rng = np.random.default_rng(0)
    update = rng.normal(size=(64, 40)).astype(np.float32)
    sent = project(update, "fc.weight", 100, seed=7)
    assert sent.dtype == np.uint8 and sent.shape == (encoded_bytes(100),) == (54,)
    p = {"seed": 7, "sizes": {"fc.weight": 100}, "dims": {"fc.weight": update.size}, "budget_bytes": 54}
    # the server projects a whole update the same way, and decodes a projected one
    assert np.array_equal(in_space(update, "fc.weight", update.size, p), decode(sent, 100))
    assert np.array_equal(in_space(sent, "fc.weight", update.size, p), decode(sent, 100))
    # another array name, another map
    assert not np.array_equal(project(update, "fc2.weight", 100, seed=7), sent)
    with pytest.raises(ValueError, match="neither"):
        in_space(sent[:50], "fc.weight", update.size, p)


def test_the_4_bit_encoding_keeps_each_number_within_half_a_level():
    values = np.random.default_rng(3).normal(size=101)
    back = decode(encode(values), 101)
    scale = min(np.max(np.abs(values)), 3 * np.sqrt(np.mean(values ** 2)))
    inside = np.abs(values) <= scale
    assert np.max(np.abs(back - values)[inside]) <= scale / 7 / 2 + 1e-6
    assert not decode(encode(np.zeros(4)), 4).any()


def test_cosines_of_projected_updates_stay_within_the_stated_error():
    """Updates of 12 clients in 4 groups (a shared direction per group plus each client's own):
    every pairwise cosine after the projection to k numbers is within 3 x sqrt(2 / k) of the
    true one, and the typical error within the bound itself."""
    rng = np.random.default_rng(1)
    d, k = 20_000, 650
    groups = rng.normal(size=(4, d))
    X = np.stack([groups[i // 3] + 0.8 * rng.normal(size=d) for i in range(12)])
    P = np.stack([sketch(x, "layer.weight", k, seed=5) for x in X])
    Q = np.stack([decode(project(x, "layer.weight", 4 * k, seed=5), 4 * k) for x in X])  # the same bytes, 4-bit

    def cosines(A):
        A = A / np.linalg.norm(A, axis=1, keepdims=True)
        return (A @ A.T)[np.triu_indices(len(A), 1)]

    errors = np.abs(cosines(P) - cosines(X))
    bound = cosine_error_bound(k)
    assert errors.max() <= 3 * bound
    assert float(np.sqrt(np.mean(errors ** 2))) <= bound
    # 4-bit numbers: 4k of them in about the bytes of k float32 ones (2k + 4 bytes), within half the error
    quantized = np.abs(cosines(Q) - cosines(X))
    assert float(np.sqrt(np.mean(quantized ** 2))) <= bound / 2


def test_rows_input_puts_whole_and_projected_replies_in_one_space():
    from clusterfed.core.exchange import TrainReply

    rng = np.random.default_rng(2)
    start = {"w": rng.normal(size=(30, 20)).astype(np.float32), "b": np.zeros(5, np.float32)}
    trained = {n: (v + rng.normal(size=v.shape)).astype(np.float32) for n, v in start.items()}
    p = {"seed": 1, "sizes": {"w": 50, "b": 5}, "dims": {"w": 600, "b": 5}, "budget_bytes": 40}
    config = protocol.evidence_config(p["sizes"], p["seed"])
    projected = protocol.project_evidence(trained, start, config)
    as_client = TrainReply("0", 0, projected, {n: start[n] for n in projected}, 10, 0.1, {}, is_update=True)
    as_stock = TrainReply("1", 0, trained, start, 10, None, {})
    rows, origin = evidence_upload.rows_input([as_client, as_stock], start, ["w", "b"], p)
    for name in ("w", "b"):
        assert np.array_equal(rows[0][name], rows[1][name])
        assert origin[name].shape == rows[0][name].shape and not origin[name].any()
    assert evidence_upload.projected_on_server([as_client, as_stock], p) == ["1"]


def test_a_chained_stock_reply_is_compared_from_the_start_model_and_its_halves_in_the_same_space():
    """A stock client's chained request is sent its own previous reply: its row is what the
    whole chain changed from the start model (not the last request's change), and the chain's
    halves (requests 1..h, h+1..k) are each projected into the same space as that row."""
    from clusterfed.core.exchange import TrainReply

    rng = np.random.default_rng(3)
    start = {"w": rng.normal(size=(30, 20)), "b": np.zeros(5)}
    middle = {n: v + rng.normal(size=v.shape) for n, v in start.items()}
    last = {n: v + rng.normal(size=v.shape) for n, v in middle.items()}
    p = {"seed": 1, "sizes": {"w": 200, "b": 5}, "dims": {"w": 600, "b": 5}, "budget_bytes": 120}
    chained = TrainReply("1", 0, last, middle, 10, None, {})  # sent its reply to the request before
    rows, _ = evidence_upload.rows_input([chained], start, ["w", "b"], p)
    whole, _ = evidence_upload.spans_in_space([last], [start], ["w", "b"], p)
    first, _ = evidence_upload.spans_in_space([middle], [start], ["w", "b"], p)
    second, _ = evidence_upload.spans_in_space([last], [middle], ["w", "b"], p)
    for name in ("w", "b"):
        assert np.array_equal(rows[0][name], decode(project(last[name] - start[name], name, p["sizes"][name], 1),
                                                    p["sizes"][name]))
        assert np.array_equal(rows[0][name], whole[0][name])
        assert np.array_equal(first[0][name], decode(project(middle[name] - start[name], name, p["sizes"][name], 1),
                                                     p["sizes"][name]))
        # the map is linear; only the 4-bit rounding of each half keeps their sum from being the row exactly
        total = first[0][name] + second[0][name]
        cosine = total @ rows[0][name] / (np.linalg.norm(total) * np.linalg.norm(rows[0][name]))
        assert cosine > 0.97


# --------------------------------------------------------------------- the message contract
def test_evidence_config_round_trips_and_validation_expects_the_projected_shapes():
    from clusterfed.core.exchange import Ask
    from clusterfed.runner.validation import ReplyRejected, parse_train_reply

    config = protocol.evidence_config({"fc.weight": 8, "fc.bias": 10}, seed=4)
    assert protocol.parse_evidence(config) == ({"fc.weight": 8, "fc.bias": 10}, 4)
    assert protocol.parse_evidence({}) is None
    shapes = {"fc.weight": ((10, 6), np.dtype(np.float32)), "fc.bias": ((4,), np.dtype(np.float32)),
              "other": ((3,), np.dtype(np.float32))}
    assert protocol.evidence_shapes(config, shapes) == {"fc.weight": ((8,), np.dtype(np.uint8)),
                                                        "fc.bias": ((6,), np.dtype(np.uint8))}
    start = {n: np.zeros(s, np.float32) for n, (s, _) in shapes.items()}
    ask = Ask("0", start, {"cluster-id": 0, "upload": "fc.weight,fc.bias", "return": "weights", **config})
    good = {"fc.weight": np.ones(8, np.uint8), "fc.bias": np.ones(6, np.uint8)}

    def content(arrays, loss=True):
        metrics = {"num-examples": 5, **({"train-loss": 0.5} if loss else {"train_loss": 0.5})}
        return RecordDict({"arrays": protocol.to_array_record(arrays), "metrics": MetricRecord(metrics)})

    reply = parse_train_reply(content(good), ask, shapes)
    assert reply.is_update and reply.update["fc.weight"].shape == (8,)
    with pytest.raises(ReplyRejected):
        parse_train_reply(content({**good, "fc.weight": np.ones(8, np.float32)}), ask, shapes)
    # a stock client: its whole model (then weights), or the projected arrays (the evidence mod)
    whole = parse_train_reply(content(start, loss=False), ask, shapes, stock=True)
    assert not whole.is_update and whole.arrays["fc.weight"].shape == (10, 6)
    modded = parse_train_reply(content(good, loss=False), ask, shapes, stock=True)
    assert modded.is_update and set(modded.arrays) == set(good)


def test_the_helper_client_replies_with_the_projected_updates():
    from clusterfed.client.app import trained_content
    from clusterfed.client.task import ClientTask, TaskData

    task = ClientTask(model_fn=lambda c, cfg: None, data_fn=lambda c, cfg: None, key_fn=lambda c: "k")
    received = {"w": np.zeros((40, 10), np.float32), "b": np.zeros(10, np.float32)}
    trained = {"w": np.full((40, 10), 0.5, np.float32), "b": np.ones(10, np.float32)}
    config = {"upload": "w,b", **protocol.evidence_config({"w": 20, "b": 10}, 9)}
    out = trained_content(task, None, config, TaskData([0] * 3, num_train=3), received, None, trained, {"train-loss": 1.0})
    arrays = protocol.from_array_record(out[protocol.ARRAYS])
    assert {n: a.shape for n, a in arrays.items()} == {"w": (14,), "b": (9,)}
    assert np.array_equal(arrays["w"], project(trained["w"] - received["w"], "w", 20, 9))
    assert protocol.array_bytes(out[protocol.ARRAYS]) == encoded_bytes(20) + encoded_bytes(10)


# ------------------------------------------------------------------------ the client mod
def _stock_app(epochs_seen: list):
    from flwr.clientapp import ClientApp

    from clusterfed.client import evidence_mod

    app = ClientApp(mods=[evidence_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:  # one epoch: +1 on every weight
        arrays = {n: a + 1 for n, a in protocol.from_array_record(msg.content["arrays"]).items()}
        epochs_seen.append(1)
        return Message(RecordDict({"arrays": protocol.to_array_record(arrays),
                                   "metrics": MetricRecord({"train_loss": 0.1, "num-examples": 7})}), reply_to=msg)

    return app


def _message(config):
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    arrays = {"w": np.zeros((30, 8), np.float32), "b": np.zeros(4, np.float32)}
    content = RecordDict({"arrays": protocol.to_array_record(arrays), "config": ConfigRecord(config)})
    return Message(content, dst_node_id=1, message_type=MessageType.TRAIN, group_id="1"), arrays


def test_the_evidence_mod_trains_the_epochs_asked_and_sends_the_projection():
    seen: list = []
    app = _stock_app(seen)
    config = {"local-epochs": 3, "lr": 0.1, **protocol.evidence_config({"w": 16, "b": 4}, 2)}
    msg, sent = _message(config)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={"local-epochs": 1})
    reply = app(msg, context)
    assert len(seen) == 3  # three calls of one epoch each, chained on the model returned
    arrays = protocol.from_array_record(reply.content["arrays"])
    assert np.array_equal(arrays["w"], project(np.full((30, 8), 3.0), "w", 16, 2))
    assert np.array_equal(decode(arrays["b"], 4), np.full(4, 3.0))
    assert reply.content["metrics"]["local-epochs"] == 3 and reply.content["metrics"]["num-examples"] == 7
    # a message that asks for no evidence passes through: the whole model, one call
    seen.clear()
    msg, _ = _message({"local-epochs": 3, "lr": 0.1})
    reply = app(msg, context)
    assert len(seen) == 1 and protocol.from_array_record(reply.content["arrays"])["w"].shape == (30, 8)


# ---------------------------------------------------------------- the clustering round's bytes
@pytest.mark.end_to_end
def test_fedclusts_clustering_upload_is_the_projected_sizes(small_config):
    """The built-in digits CNN: the clustering upload is exactly the clients times the plan's
    bytes, at most the paper layer's (fc2) per client and a quarter of a training round's."""
    from clusterfed.server_app import initial_arrays
    from clusterfed.simulation import simulate

    config = small_config(strategy="fedclust", rounds=1, num_clients=6, **{"fedclust.evidence-sketch": True})
    simulate(config, engine="inprocess", stream=None)
    record = json.loads(open(f"{config.out_dir}/rounds.jsonl").readline())
    model = protocol.from_array_record(initial_arrays(config))
    paper = model["fc2.weight"].nbytes + model["fc2.bias"].nbytes
    state = json.load(open(f"{config.out_dir}/clusters.json"))
    per_client = record["clustering_bytes_up"] / 6
    assert paper - 4 * 8 <= per_client <= paper  # the budget spent, but for the half bytes of odd counts
    assert record["clustering_bytes_up"] <= 6 * sum(a.nbytes for a in model.values()) / 4
    assert "projected (seeded CountSketch" in record["evidence_upload"]
    assert state is not None


@pytest.mark.end_to_end
def test_without_the_sketch_every_candidate_layer_is_uploaded_whole(small_config):
    from clusterfed.server_app import initial_arrays
    from clusterfed.simulation import simulate

    config = small_config(strategy="fedclust", rounds=1, num_clients=6, **{"fedclust.evidence-sketch": False})
    simulate(config, engine="inprocess", stream=None)
    record = json.loads(open(f"{config.out_dir}/rounds.jsonl").readline())
    model_bytes = protocol.array_bytes(initial_arrays(config))
    assert record["clustering_bytes_up"] == 6 * model_bytes  # every candidate layer: the whole CNN
    assert "evidence_upload" not in record or record["evidence_upload"] is None


# ------------------------------------------------------------------ the helper's checks
def test_a_train_fn_that_reports_other_epochs_than_the_clustering_round_asks_is_warned(caplog):
    from clusterfed.client import task as task_module
    from clusterfed.client.task import ClientTask

    task_module._EPOCH_WARNINGS.clear()
    task = ClientTask(model_fn=lambda c, cfg: None, data_fn=lambda c, cfg: None,
                      train_fn=lambda model, data, config, device: {"train-loss": 0.3, "local-epochs": 1})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        task.train(None, None, {"local-epochs": 10, "upload": "fc2.weight,fc2.bias", "phase": "cluster"}, "cpu")
    assert "trained 1 epoch(s) where the message asked local-epochs=10" in caplog.text
    assert "a clustering round" in caplog.text


def test_a_train_fn_that_never_reads_the_epochs_is_warned_once(caplog):
    from clusterfed.client import task as task_module
    from clusterfed.client.task import ClientTask

    task_module._UNREAD_WARNED.clear()
    fixed = ClientTask(model_fn=lambda c, cfg: None, data_fn=lambda c, cfg: None,
                       train_fn=lambda model, data, config, device: 0.3)  # trains its own count
    reading = ClientTask(model_fn=lambda c, cfg: None, data_fn=lambda c, cfg: None,
                         train_fn=lambda model, data, config, device: float(config["local-epochs"]))
    copying = ClientTask(model_fn=lambda c, cfg: None, data_fn=lambda c, cfg: None,
                         train_fn=lambda model, data, config, device: float(dict(config).get("lr", 0)))
    cluster = {"local-epochs": 10, "upload": "fc2.weight", "phase": "cluster", "lr": 0.1}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        reading.train(None, None, dict(cluster), "cpu")
        copying.train(None, None, dict(cluster), "cpu")
        assert "did not read" not in caplog.text
        fixed.train(None, None, dict(cluster), "cpu")
        fixed.train(None, None, dict(cluster), "cpu")
    assert caplog.text.count("did not read config['local-epochs']") == 1
    assert "cluster-epochs = 10" in caplog.text


def test_client_app_refuses_a_task_that_cannot_give_ifcas_loss_when_built():
    from clusterfed.client import TaskCapabilityError, client_app
    from clusterfed.client.task import ClientTask
    from clusterfed.strategies.ifca import IFCA

    own = ClientTask(model_fn=lambda c, cfg: None, data_fn=lambda c, cfg: None,
                     train_fn=lambda model, data, config, device: 0.1)
    with pytest.raises(TaskCapabilityError, match="loss_fn"):
        client_app(own, requires=IFCA())
    client_app(ClientTask(model_fn=own.model_fn, data_fn=own.data_fn, train_fn=own.train_fn,
                          loss_fn=lambda out, y: 0), requires=IFCA())
    assert math.isfinite(0.0)


# ------------------------------------------------------ a stock ClientApp, with and without the mod
def _quickstart(mods, strategy):
    import torch
    from flwr.clientapp import ClientApp
    from quickstartapp import client_app as quickstart
    from quickstartapp.task import Net

    from clusterfed.runner.inprocess import InProcessGrid
    from flwr.supercore.task_identity import TaskIdentity

    app = ClientApp(mods=mods)
    app.train()(quickstart.train_fn)
    app.evaluate()(quickstart.evaluate_fn)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(app, 9, node_configs=[{"partition-id": i} for i in range(9)],
                         run_config={"local-epochs": 1, "batch-size": 32})
    torch.manual_seed(0)
    model = Net().state_dict()
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model), num_rounds=1,
                            train_config=ConfigRecord({"lr": 0.03, "local-epochs": 1}))
    return result, sum(t.numel() * t.element_size() for t in model.values())


def _ari(result):
    from quickstartapp.task import group_of
    from sklearn.metrics import adjusted_rand_score

    keys = sorted(result.assignment)
    return adjusted_rand_score([group_of(int(k.removeprefix("node-")) - 1000) for k in keys],
                               [result.assignment[k] for k in keys])


@pytest.mark.end_to_end
def test_a_stock_client_app_with_the_evidence_mod_uploads_only_the_projection():
    """Flower quickstart-style clients (run config local-epochs = 1) with ``evidence_mod``: one
    request each trains the 10 cluster-epochs and returns the projection (at most the final
    layer's bytes); then round 1's training returns the whole model."""
    import clusterfed
    from clusterfed.client import evidence_mod

    result, model = _quickstart([evidence_mod], clusterfed.FedClust(cluster_epochs=10, chain_until="epochs",
                                                                    evidence_sketch=True))
    assert _ari(result) >= 0.9, result.clustering.get("one_cluster_reason")
    paper = (32 * 10 + 10) * 4  # fc2: the paper layer
    projected = result.traffic["bytes_up"] - 9 * model  # the projection, then one training round
    assert projected % 9 == 0 and projected // 9 <= paper


@pytest.mark.end_to_end
def test_a_stock_client_app_without_the_mod_is_projected_on_the_server_and_said_so():
    import clusterfed

    result, model = _quickstart([], clusterfed.FedClust(cluster_epochs=10, chain_until="epochs", evidence_sketch=True))
    assert _ari(result) >= 0.9, result.clustering.get("one_cluster_reason")
    assert result.traffic["bytes_up"] == 9 * 10 * model + 9 * model  # whole models: no bytes saved
    assert result.clustering["layer_choice"]["rule"] == "auto"
