"""Faults and hostile replies: every fault counted by kind, no bad value reaches a model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from harness import capture_algorithms

from clusterfed import faults, protocol
from clusterfed.client_app import do_evaluate, do_train, profile
from clusterfed.config import parse_config
from clusterfed.simulation import simulate


def rows(out):
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]


def all_finite(algorithm):
    return all(np.all(np.isfinite(v)) for model in algorithm.models.values() for v in model.values())


def expected_faults(config, algorithm, rounds):
    """The faults the clients drew for their plain train messages (phase "train")."""
    values = config.to_flower()
    keys = list(algorithm.assignment)  # every client: all are placed in round 1 (before any split)
    return [sum(faults.draw_fault(values, k, r, "train") is not None for k in keys) for r in rounds]


@pytest.mark.parametrize("strategy", ["fedavg", "cfl"])
def test_run_with_a_fifth_of_clients_faulting_completes_and_counts_every_fault(strategy, tmp_path, monkeypatch):
    captured = capture_algorithms(monkeypatch)
    config = parse_config({"strategy": strategy, "num-clients": 10, "rounds": 4, "out-dir": str(tmp_path),
                           "partitioner": "rotation", "batch-size": 32, "timeout": 30, "fraction-evaluate": 1.0,
                           "fault-rate": 0.05, "fault-nan-rate": 0.05, "fault-shape-rate": 0.05,
                           "fault-slow-rate": 0.05, "fault-delay": 1000})
    summary = simulate(config, engine="inprocess", stream=None)
    algorithm, records = captured[0], rows(tmp_path)
    assert len(records) == 4 and all_finite(algorithm)
    train_faults = expected_faults(config, algorithm, range(1, 5))
    assert sum(train_faults) > 0
    for record, expected in zip(records, train_faults):
        trained = record["transmissions"] - record["rejected"]
        assert trained == 10 - expected  # every train fault kept its reply out
        assert all(r["reason"] for r in record.get("rejections", []))
        assert record["clients_known"] == 10
    kinds = summary["faults"]
    assert set(kinds) <= {"error", "timeout", "non_finite", "shape", "names"}
    assert sum(kinds.values()) >= sum(train_faults)


def test_slow_reply_is_a_timeout_and_the_round_is_not_counted_towards_the_target(tmp_path):
    config = parse_config({"num-clients": 4, "rounds": 2, "out-dir": str(tmp_path), "partitioner": "label-groups",
                           "label-groups": "0-4;5-9", "batch-size": 32, "timeout": 30, "fault-slow-rate": 0.5,
                           "target-accuracy": 0.01, "fault-delay": 1000})
    summary = simulate(config, engine="inprocess", stream=None)
    records = rows(tmp_path)
    assert summary["faults"].get("timeout", 0) > 0
    short = [r for r in records if r["clients_evaluated"] < r["clients_known"]]
    full = [r for r in records if r["clients_evaluated"] == r["clients_known"]]
    assert short  # some evaluation replies were late too
    assert summary["rounds_to_target"] == (full[0]["round"] if full else None)


def hostile_app(seed: int, log: list):
    """The real client, whose train replies are randomly damaged in many ways."""
    rng = np.random.default_rng(seed)

    def damage(reply: Message) -> Message:
        content = reply.content
        arrays = protocol.from_array_record(content[protocol.ARRAYS])
        name = sorted(arrays)[int(rng.integers(len(arrays)))]
        kind = int(rng.integers(12))
        log.append(kind)
        if kind == 0:
            arrays[name] = arrays[name].astype(np.float64)
        elif kind == 1:
            arrays[name] = np.full_like(arrays[name], np.inf)
        elif kind == 2:
            arrays[name] = arrays[name].reshape(-1)
        elif kind == 3:
            del arrays[name]
        elif kind == 4:
            arrays["x"] = np.zeros(2, np.float32)
        elif kind == 5:
            return Message(RecordDict({protocol.METRICS: content[protocol.METRICS]}), reply_to=_request)
        elif kind == 6:
            return Message(RecordDict({protocol.ARRAYS: content[protocol.ARRAYS]}), reply_to=_request)
        elif kind == 7:
            content[protocol.METRICS] = MetricRecord({"num-examples": -3, "train-loss": 0.1})
        elif kind == 8:
            content[protocol.METRICS] = MetricRecord({"num-examples": 2.5, "train-loss": 0.1})
        elif kind == 9:
            content[protocol.CLIENT] = ConfigRecord({"client-key": "someone-else", "true-group": 0})
        elif kind == 10:
            content[protocol.METRICS] = MetricRecord({"num-examples": 5, "train-loss": float("nan")})
        else:
            record = ArrayRecord({n: Array(v) for n, v in arrays.items()})
            broken = record[name]
            broken.data = broken.data[: len(broken.data) // 2]  # truncated bytes
            content[protocol.ARRAYS] = record
            return reply
        if kind <= 4:
            content[protocol.ARRAYS] = protocol.to_array_record(arrays)
        return reply

    app = ClientApp()
    _request = None

    @app.train()
    def train(msg, context):
        nonlocal _request
        _request = msg
        reply = do_train(msg, context)
        return damage(reply) if rng.random() < 0.5 else reply

    app.evaluate()(do_evaluate)
    app.query("profile")(profile)
    return app


@pytest.mark.parametrize("seed", [0, 1])
def test_fuzzed_replies_are_rejected_with_reasons_and_corrupt_nothing(seed, tmp_path, monkeypatch):
    captured = capture_algorithms(monkeypatch)
    damaged: list = []
    config = parse_config({"strategy": "fedclust", "num-clients": 6, "rounds": 3, "out-dir": str(tmp_path),
                           "partitioner": "label-groups", "label-groups": "0-4;5-9", "batch-size": 32,
                           "cluster-epochs": 1, "seed": seed})
    simulate(config, engine="inprocess", stream=None, client_app=hostile_app(seed, damaged))
    records = rows(tmp_path)
    rejections = [r for record in records for r in record.get("rejections", [])]
    assert damaged and len(rejections) == len(damaged)  # every damaged reply, and only those
    assert all(r["reason"] and r["kind"] for r in rejections)
    assert all_finite(captured[0])
    shapes = {n: v.shape for n, v in captured[0].theta0.items()}
    assert all({n: v.shape for n, v in m.items()} == shapes for m in captured[0].models.values())


def test_malformed_profile_is_rejected_and_the_client_tried_again(tmp_path):
    calls = {"n": 0}
    app = ClientApp()

    @app.evaluate()
    def bad_profile(msg, context):  # the profile probe is an evaluate message of phase "profile"
        if msg.content[protocol.CONFIG].get("phase") != protocol.PROFILE_PHASE:
            return do_evaluate(msg, context)
        calls["n"] += 1
        if int(context.node_config["partition-id"]) == 1 and calls["n"] <= 4:  # a profile without a key
            return Message(RecordDict({protocol.METRICS: MetricRecord({"num-examples": 0}),
                                       protocol.CLIENT: ConfigRecord({protocol.CAPABILITIES_KEY: ["label-stats"]})}),
                           reply_to=msg)
        return profile(msg, context)

    app.train()(do_train)
    config = parse_config({"num-clients": 4, "rounds": 2, "out-dir": str(tmp_path), "batch-size": 32,
                           "partitioner": "label-groups", "label-groups": "0-4;5-9"})
    simulate(config, engine="inprocess", stream=None, client_app=app)
    first, second = rows(tmp_path)
    assert first["faults"] == {"identity": 1} and first["clients_known"] == 3
    assert second["clients_known"] == 4
