"""Checkpoint and resume: a run stopped after round k and resumed ends bit-identical to
an uninterrupted one; unusable checkpoints are refused and touch nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from clusterfed.config import ConfigError, parse_config
from clusterfed.models import build_model
from clusterfed.runner.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from clusterfed.simulation import simulate

TIMING = ("round_seconds", "clustering_seconds")
SETTINGS = {
    "fedclust": {"partitioner": "label-groups", "label-groups": "0,1;2,3;4,5", "num-clients": 12,
                 "newcomer-fraction": 0.2, "newcomer-round": 4, "cluster-epochs": 3},
    "cfl": {"partitioner": "rotation", "num-clients": 12, "split-criteria": "absolute", "eps1": 100.0,
            "eps2": 0.001, "split-min-silhouette": 0.0, "min-split-round": 2, "newcomer-fraction": 0.2,
            "newcomer-round": 4},
    "hicfl": {"partitioner": "rotation", "num-clients": 12, "window": 2, "stability-eps": 5.0,
              "split-criteria": "absolute", "eps1": 100.0, "eps2": 0.001, "fraction-train": 0.75},
}


def config(strategy, out, **more):
    return parse_config({"strategy": strategy, "rounds": 6, "batch-size": 32, "out-dir": str(out),
                         **SETTINGS[strategy], **more})


def rows(out):
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (out / "rounds.jsonl").read_text().splitlines()]


def models(out):
    return {p.name: torch.load(p) for p in sorted((out / "models").glob("*.pt"))}


@pytest.mark.parametrize("strategy", ["fedclust", "cfl", "hicfl"])
def test_resumed_run_is_bit_identical(strategy, tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    simulate(config(strategy, straight), engine="inprocess", stream=None)
    simulate(config(strategy, stopped, rounds=3), engine="inprocess", stream=None)
    assert load_checkpoint(stopped)["round"] == 3
    simulate(config(strategy, stopped, **{"resume-from": str(stopped)}), engine="inprocess", stream=None)
    assert rows(stopped) == rows(straight)
    a, b = models(straight), models(stopped)
    assert a.keys() == b.keys() and len(a) >= 1
    for name in a:
        for key in a[name]:
            assert torch.equal(a[name][key], b[name][key])
    clusters = [json.loads((d / "clusters.json").read_text())["assignment"] for d in (straight, stopped)]
    assert clusters[0] == clusters[1]


def test_a_killed_process_resumes_from_its_last_checkpoint(tmp_path):
    """SIGKILL mid-run (after some round's checkpoint), then resume: same final rows."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    simulate(config("cfl", straight, rounds=8), engine="inprocess", stream=None)
    args = [sys.executable, "-m", "clusterfed.cli", "run", "--engine", "inprocess", "--out", str(killed),
            "--set", "strategy=cfl", "--set", "rounds=8", "--set", "batch-size=32"]
    args += [a for k, v in SETTINGS["cfl"].items() for a in ("--set", f"{k}={json.dumps(v)}")]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (killed / "checkpoint.pkl").exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    stopped_at = load_checkpoint(killed)["round"]
    if stopped_at < 8:
        simulate(config("cfl", killed, rounds=8, **{"resume-from": str(killed)}), engine="inprocess", stream=None)
    assert rows(killed) == rows(straight)


def test_corrupt_truncated_and_incompatible_checkpoints_are_refused(tmp_path):
    run = tmp_path / "run"
    simulate(config("fedclust", run, rounds=2), engine="inprocess", stream=None)
    data = (run / "checkpoint.pkl").read_bytes()
    cases = {"truncated": data[: len(data) // 2], "flipped": data[:-10] + bytes([data[-10] ^ 1]) + data[-9:],
             "foreign": b"not a checkpoint"}
    for name, content in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "checkpoint.pkl").write_bytes(content)
        with pytest.raises(ConfigError, match="truncated or corrupt|not a clusterfed checkpoint"):
            simulate(config("fedclust", tmp_path / f"out-{name}", **{"resume-from": str(folder)}),
                     engine="inprocess", stream=None)
        assert (folder / "checkpoint.pkl").read_bytes() == content  # touched nothing
        assert not (tmp_path / f"out-{name}" / "rounds.jsonl").exists()
    with pytest.raises(ConfigError, match="it is a 'fedclust' run, this run is 'cfl'"):
        simulate(config("cfl", tmp_path / "other", **{"resume-from": str(run)}), engine="inprocess", stream=None)
    with pytest.raises(ConfigError, match="model differs"):
        simulate(config("fedclust", tmp_path / "other-model", model="selection-cnn", **{"resume-from": str(run)}),
                 engine="inprocess", stream=None)
    with pytest.raises(ConfigError, match="seed"):
        simulate(config("fedclust", tmp_path / "seed", seed=3, **{"resume-from": str(run)}),
                 engine="inprocess", stream=None)
    assert (run / "checkpoint.pkl").read_bytes() == data


def test_checkpoint_is_written_atomically(tmp_path):
    save_checkpoint(tmp_path, {"round": 1, "x": np.arange(3)})
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pkl"]  # no temporary file left
    assert load_checkpoint(tmp_path)["round"] == 1
    with pytest.raises(CheckpointError, match="cannot read"):
        load_checkpoint(tmp_path / "missing")


def test_exported_cluster_model_loads_and_predicts(tmp_path):
    out = tmp_path / "run"
    simulate(config("fedclust", out, rounds=2), engine="inprocess", stream=None)
    clusters = json.loads((out / "clusters.json").read_text())
    cluster = clusters["assignment"]["0"]
    model = build_model("auto", "digits", (1, 8, 8), 10)
    model.load_state_dict(torch.load(out / "models" / f"cluster-{cluster}.pt"))
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images[:50, None] / 16.0, dtype=torch.float32)
    predicted = model.eval()(x).argmax(dim=1).numpy()
    assert predicted.shape == (50,) and set(predicted) <= set(range(10))
    assert (predicted == digits.target[:50]).mean() > 0.1  # trained, not a constant guess
