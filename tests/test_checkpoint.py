"""Checkpoint and resume: a run stopped after round k and resumed ends bit-identical to
an uninterrupted one; unusable checkpoints are refused and touch nothing."""

from __future__ import annotations

import json
import logging
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


def assert_same_models(first, second):
    """Both runs saved the same cluster models, tensor for tensor."""
    a, b = models(first), models(second)
    assert a.keys() == b.keys() and len(a) >= 1
    for name in a:
        for key in a[name]:
            assert torch.equal(a[name][key], b[name][key])


@pytest.mark.parametrize("strategy", ["fedclust", "cfl", "hicfl"])
@pytest.mark.end_to_end
def test_resumed_run_is_bit_identical(strategy, tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    simulate(config(strategy, straight), engine="inprocess", stream=None)
    simulate(config(strategy, stopped, rounds=3), engine="inprocess", stream=None)
    assert load_checkpoint(stopped)["round"] == 3
    simulate(config(strategy, stopped, **{"resume-from": str(stopped)}), engine="inprocess", stream=None)
    assert rows(stopped) == rows(straight)
    assert_same_models(straight, stopped)
    clusters = [json.loads((d / "clusters.json").read_text())["assignment"] for d in (straight, stopped)]
    assert clusters[0] == clusters[1]


@pytest.mark.end_to_end
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
        while not (killed / "checkpoint.json").exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    stopped_at = load_checkpoint(killed)["round"]
    if stopped_at < 8:
        simulate(config("cfl", killed, rounds=8, **{"resume-from": str(killed)}), engine="inprocess", stream=None)
    assert rows(killed) == rows(straight)


@pytest.mark.end_to_end
def test_corrupt_truncated_and_incompatible_checkpoints_are_refused(tmp_path):
    run = tmp_path / "run"
    simulate(config("fedclust", run, rounds=2), engine="inprocess", stream=None)
    files = {p.name: p.read_bytes() for p in run.glob("checkpoint*")}
    npz = next(name for name in files if name.endswith(".npz"))
    assert sorted(files) == [npz, "checkpoint.json"]
    text, arrays = files["checkpoint.json"], files[npz]
    cases = {"truncated": {"checkpoint.json": text[: len(text) // 2]},
             "truncated-arrays": {npz: arrays[: len(arrays) // 2]},
             "flipped": {npz: arrays[:-10] + bytes([arrays[-10] ^ 1]) + arrays[-9:]},
             "foreign": {"checkpoint.json": b"not a checkpoint"},
             "no-arrays": {npz: None}}
    for name, changes in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        content = {**files, **changes}
        for file, data in content.items():
            if data is not None:
                (folder / file).write_bytes(data)
        with pytest.raises(ConfigError, match="truncated or corrupt|not a clusterfed checkpoint|half-written"):
            simulate(config("fedclust", tmp_path / f"out-{name}", **{"resume-from": str(folder)}),
                     engine="inprocess", stream=None)
        for file, data in content.items():  # touched nothing
            assert (folder / file).read_bytes() == data if data is not None else not (folder / file).exists()
        assert not (tmp_path / f"out-{name}" / "rounds.jsonl").exists()
    with pytest.raises(ConfigError, match="it is a 'fedclust' run, this run is 'cfl'"):
        simulate(config("cfl", tmp_path / "other", **{"resume-from": str(run)}), engine="inprocess", stream=None)
    with pytest.raises(ConfigError, match="model differs"):
        simulate(config("fedclust", tmp_path / "other-model", model="selection-cnn", **{"resume-from": str(run)}),
                 engine="inprocess", stream=None)
    with pytest.raises(ConfigError, match="seed"):
        simulate(config("fedclust", tmp_path / "seed", seed=3, **{"resume-from": str(run)}),
                 engine="inprocess", stream=None)
    assert {p.name: p.read_bytes() for p in run.glob("checkpoint*")} == files


def test_an_old_pickle_checkpoint_is_refused_with_a_reason(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "checkpoint.pkl").write_bytes(b"clusterfed-checkpoint v1\n" + bytes(32) + b"never unpickled")
    with pytest.raises(ConfigError, match="old pickle checkpoint .* Restart the run"):
        simulate(config("fedclust", tmp_path / "out", **{"resume-from": str(folder)}), engine="inprocess", stream=None)
    assert not (tmp_path / "out" / "rounds.jsonl").exists()


def test_checkpoint_is_written_atomically(tmp_path):
    save_checkpoint(tmp_path, {"round": 1, "x": np.arange(3)})
    first = sorted(p.name for p in tmp_path.iterdir())
    assert len(first) == 2 and first[1] == "checkpoint.json" and first[0].endswith(".npz")  # no temporary file left
    assert load_checkpoint(tmp_path)["round"] == 1
    save_checkpoint(tmp_path, {"round": 2, "x": np.arange(4)})
    second = sorted(p.name for p in tmp_path.iterdir())
    assert len(second) == 2 and second[0] != first[0]  # the previous round's arrays are gone
    assert load_checkpoint(tmp_path)["round"] == 2
    with pytest.raises(CheckpointError, match="cannot read"):
        load_checkpoint(tmp_path / "missing")


def test_a_checkpoint_interrupted_before_its_json_leaves_the_previous_one(tmp_path, monkeypatch):
    """Killed after the new arrays file landed but before the JSON: the old pair still loads."""
    save_checkpoint(tmp_path, {"round": 1, "x": np.arange(3)})
    real_replace = os.replace

    def dies_at_the_json(src, dst):
        if str(dst).endswith(".json"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dies_at_the_json)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, {"round": 2, "x": np.arange(5)})
    monkeypatch.setattr(os, "replace", real_replace)
    assert load_checkpoint(tmp_path)["round"] == 1
    assert not list(tmp_path.glob(".checkpoint-*"))
    save_checkpoint(tmp_path, {"round": 2, "x": np.arange(5)})  # and the orphaned arrays are cleaned up
    assert len(list(tmp_path.glob("checkpoint-*.npz"))) == 1 and load_checkpoint(tmp_path)["round"] == 2


@pytest.mark.end_to_end
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


@pytest.mark.end_to_end
def test_resume_from_auto_starts_fresh_then_continues_from_out_dir(tmp_path, caplog, monkeypatch):
    """``resume-from="auto"`` (what a deployment passes with ``flwr run --run-config``): no
    checkpoint in out-dir starts fresh, saying so; the same command after a stop resumes,
    said once, the checkpoint read once, and the run ends bit-identical to an uninterrupted one."""
    import clusterfed.runner.driver as driver
    import clusterfed.runner.preflight as preflight

    # the messages are Flower's logger's at INFO; a benchmark run earlier in this process
    # (the fuzz harness, the experiments grid) may have left that logger at WARNING
    caplog.set_level(logging.INFO, logger="flwr")
    reads = []
    for module in (driver, preflight):
        monkeypatch.setattr(module, "load_checkpoint", lambda folder, real=module.load_checkpoint:
                            reads.append(folder) or real(folder))
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    simulate(config("fedclust", straight, rounds=4), engine="inprocess", stream=None)
    with caplog.at_level("INFO"):
        simulate(config("fedclust", stopped, rounds=2, **{"resume-from": "auto"}), engine="inprocess", stream=None)
    assert any("no checkpoint in" in m and "starting fresh" in m for m in caplog.messages)
    assert load_checkpoint(stopped)["round"] == 2
    caplog.clear()
    with caplog.at_level("INFO"):
        simulate(config("fedclust", stopped, rounds=4, **{"resume-from": "auto"}), engine="inprocess", stream=None)
    assert sum("resuming from the checkpoint in" in m for m in caplog.messages) == 1
    assert reads == [str(stopped)]
    assert rows(stopped) == rows(straight)
    assert_same_models(straight, stopped)


def test_a_key_added_since_the_checkpoint_is_accepted_at_its_default_only():
    """A checkpoint written before a parameter existed resumes while the parameter holds its
    default (what the earlier version did), and is refused when it is set otherwise."""
    from clusterfed.config import config_defaults
    from clusterfed.runner.checkpoint import check_compatible

    defaults = config_defaults("hicfl")
    saved = {k: v for k, v in defaults.items() if k != "hicfl.window"}  # as if hicfl.window came later
    state = {"config": saved, "model_shapes": {}, "round": 1}
    check_compatible(state, {**defaults, "rounds": 5}, {}, defaults=defaults)
    with pytest.raises(CheckpointError, match="hicfl.window"):
        check_compatible(state, {**defaults, "rounds": 5, "hicfl.window": defaults["hicfl.window"] + 1}, {},
                         defaults=defaults)
    with pytest.raises(CheckpointError, match="hicfl.window"):  # without the defaults, every new key is a change
        check_compatible(state, {**defaults, "rounds": 5}, {})
