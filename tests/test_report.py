"""Where people watch training: the self-contained HTML run report (built from a run's
folder, refreshed each round), TensorBoard and MLflow plug-ins, the log-to key."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from clusterfed.config import ConfigError, parse_config
from clusterfed.report.audit import ReportAudit, audit, find_chromium, screenshot
from clusterfed.report import HtmlReport, RunWatcher, WatcherError, make_watchers, watch, write_report
from clusterfed.results import EvalRow, RunRecorder, Traffic

def check_self_contained(path: Path) -> ReportAudit:
    """No URL leaves the file; each figure is a PNG that decodes, of non-trivial size."""
    text = path.read_text()
    found = audit(text)
    assert "<link" not in text and "@import" not in text and "url(" not in text
    assert found.external_urls() == [] and len(found.urls) == len(found.images) >= 4
    for png in found.pngs():
        image = Image.open(io.BytesIO(png))
        image.verify()
        assert image.format == "PNG" and image.size[0] >= 400 and image.size[1] >= 200 and len(png) > 5000
    return found


@pytest.mark.end_to_end
def test_a_runs_report_is_one_self_contained_file_listing_every_client(small_config, tmp_path):
    from clusterfed.simulation import simulate

    config = small_config(strategy="fedclust", rounds=2, **{"fedclust.cluster-epochs": 1})
    simulate(config, engine="inprocess", stream=None)
    out = Path(config.out_dir)
    report = out / "report.html"  # written by the run (log-to = report is the default)
    parser = check_self_contained(report)
    clusters = json.loads((out / "clusters.json").read_text())
    assert sorted(parser.clients) == sorted(clusters["assignment"]) and len(parser.clients) == 6
    text = report.read_text()
    assert "Strategy parameters (fedclust)" in text and "cluster-epochs" in text and "round 2 of 2" in text
    assert not list(out.glob(".report.html.*"))  # written through a temporary file, renamed

    # rebuilt from the folder alone by `clusterfed report`, to another path
    from clusterfed.cli import main

    again = tmp_path / "copy.html"
    assert main(["report", str(out), "--out", str(again)]) == 0
    assert sorted(check_self_contained(again).clients) == sorted(parser.clients)

    # it renders in headless Chromium: a full-width page, not a blank one
    if find_chromium() is None:
        pytest.skip("chromium is not on PATH: the rendering check needs it (apt-get install chromium)")
    image = Image.open(screenshot(report, tmp_path / "shot.png")).convert("L")
    assert image.size == (1280, 2000)
    low, high = image.getextrema()
    assert high - low > 100 and len(set(image.resize((64, 100)).getdata())) > 20


def record_rounds(out: Path, watchers, rounds: list[dict[str, int]], groups: dict[str, int]) -> RunRecorder:
    """A recorder fed hand-made rounds: per round the assignment; every client scores 0.5 + round/10."""
    recorder = RunRecorder(out, {"strategy": "cfl", "rounds": len(rounds), "cfl.eps1": 0.4}, stream=None,
                           watchers=watchers)
    for number, assignment in enumerate(rounds, 1):
        evals = [EvalRow(k, c, groups[k], 0.5 + number / 10, 1.0 / number, 10) for k, c in assignment.items()]
        recorder.record_round(number, evals=evals, assignment=assignment, true_groups=groups,
                              traffic=Traffic(down=1000 * number, up=500), round_seconds=0.1)
    return recorder


def test_the_report_is_refreshed_each_round_with_the_live_assignment_and_ignores_a_stale_summary(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    # what an earlier run left in the same folder: not this run's
    (out / "summary.json").write_text(json.dumps({"rounds": 1, "final_accuracy": 0.123456}))
    (out / "clusters.json").write_text(json.dumps({"assignment": {"zz": 9}}))
    # the ServerApp's status.json says running until it has saved the models, after the recorder ends
    (out / "status.json").write_text(json.dumps({"status": "running", "round": 1}))
    groups = {"a": 0, "b": 0, "c": 1, "d": 1}
    report = HtmlReport(cost_ratio=0.0)  # redrawn after every round
    seen = []

    class Spy(RunWatcher):
        def round_ended(self, record, true_groups):
            seen.append(((out / "report.html").read_text(), record["assignment"], true_groups))

    recorder = record_rounds(out, [report, Spy()], [{k: 0 for k in groups}, {"a": 0, "b": 0, "c": 1, "d": 1}],
                             groups)
    first, second = seen[0][0], seen[1][0]
    assert "round 1 of 2" in first and "0.123456" not in first and ">zz<" not in first and ">running<" in first
    assert "round 2 of 2" in second and seen[1][1] == {"a": 0, "b": 0, "c": 1, "d": 1} and seen[1][2] == groups
    assert "Mixed: cluster 0 holds true groups [0, 1]" not in first  # one cluster: nothing to mix against
    assert "0×2" in second and "1×2" in second  # each cluster's true groups, from the live recorder
    recorder.finish(1.0, {"assignment": {"a": 0, "b": 0, "c": 1, "d": 0}, "true_groups": groups,
                          "one_cluster_reason": None, "merges": [{"round": 2, "merged": [1, 2], "into": 1}]})
    final = (out / "report.html").read_text()
    assert "(final)" in final and ">ended<" in final and "Mixed: cluster 0 holds true groups [0, 1]" in final
    assert "Over-split: true group 1 is spread over clusters [0, 1]" in final and "merged" in final
    check_self_contained(out / "report.html")
    # rebuilt from the folder while status.json still says running: the last round's assignment
    live = write_report(out, tmp_path / "live.html").read_text()
    assert ">running<" in live and "(last round)" in live and "Mixed: cluster 0" not in live


def test_log_to_names_are_checked_and_a_missing_extra_is_named_before_round_1(small_config, monkeypatch):
    with pytest.raises(ConfigError, match="log-to: 'wandb' is not one of report, tensorboard, mlflow"):
        parse_config({"log-to": "report,wandb"})
    assert parse_config({"log-to": "none"}).log_to == "none"

    import importlib.util

    from clusterfed.runner.preflight import preflight

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("tensorboardX", "mlflow") else find_spec(name, *a))
    with pytest.raises(ConfigError) as error:
        preflight(small_config(**{"log-to": "report,tensorboard,mlflow"}))
    assert 'pip install "clusterfed[tensorboard]"' in str(error.value)
    assert 'pip install "clusterfed[mlflow]"' in str(error.value)
    with pytest.raises(WatcherError, match=r"clusterfed\[mlflow\]"):
        make_watchers(["mlflow"])


def test_a_watcher_that_fails_mid_run_is_switched_off_and_the_run_goes_on(tmp_path, caplog):
    calls = []

    class Broken(RunWatcher):
        name = "broken"

        def round_ended(self, record, true_groups):
            calls.append(record["round"])
            raise OSError("disk full")

    from clusterfed.report.watchers import SafeWatcher

    recorder = record_rounds(tmp_path, [SafeWatcher(Broken())], [{"a": 0, "b": 1}] * 3, {"a": 0, "b": 1})
    assert calls == [1] and len(recorder.rounds) == 3
    assert "broken switched off after an error: OSError: disk full" in caplog.text


def test_tensorboard_gets_scalars_per_round_and_the_assignment_as_text(tmp_path):
    pytest.importorskip("tensorboardX")
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    groups = {"a": 0, "b": 0, "c": 1}
    recorder = record_rounds(tmp_path, make_watchers(["tensorboard"]), [{"a": 0, "b": 0, "c": 1}] * 2, groups)
    recorder.finish(1.0, {"assignment": {"a": 0, "b": 0, "c": 1}, "true_groups": groups})
    events = accumulator.EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    assert [(s.step, round(s.value, 6)) for s in events.Scalars("accuracy")] == [(1, 0.6), (2, 0.7)]
    assert [s.value for s in events.Scalars("bytes_down")] == [1000, 2000]
    assert [s.value for s in events.Scalars("cluster_1/size")] == [1, 1]
    texts = events.Tensors("assignment/text_summary")
    assert [t.step for t in texts] == [1, 2]
    assert "| 1 | 1 | 1 | c |" in texts[-1].tensor_proto.string_val[0].decode()


def test_mlflow_gets_params_metrics_per_step_and_the_assignment_as_artifacts(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    groups = {"a": 0, "b": 1}
    recorder = record_rounds(tmp_path, make_watchers(["report", "mlflow"]), [{"a": 0, "b": 1}] * 2, groups)
    recorder.finish(1.0, {"assignment": {"a": 0, "b": 1}, "true_groups": groups})
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("clusterfed").experiment_id])
    assert run.data.params["cfl.eps1"] == "0.4" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "accuracy")
    assert [(m.step, round(m.value, 6)) for m in history] == [(1, 0.6), (2, 0.7)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "cluster_1.size")] == [1, 1]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"assignment.json", "report.html", "assignment"} <= artifacts
    saved = Path(client.download_artifacts(run.info.run_id, "assignment/round-0002.json", str(tmp_path / "dl")))
    assert json.loads(saved.read_text()) == {"a": 0, "b": 1}


def test_a_library_user_watches_their_own_server_app(tmp_path):
    """``with watch(strategy, out):`` around ``strategy.start`` writes the run's files and report."""
    from test_library import run_user_app

    import clusterfed

    strategy = clusterfed.FedClust()
    with watch(strategy, tmp_path / "mine", log_to="report"):
        result = run_user_app(strategy, 2)
    out = tmp_path / "mine"
    rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["assignment"] for r in rows][-1] == result.assignment
    assert json.loads((out / "clusters.json").read_text())["assignment"] == result.assignment
    parser = check_self_contained(out / "report.html")
    assert sorted(parser.clients) == sorted(result.assignment)
    assert "Strategy parameters (fedclust)" in (out / "report.html").read_text()
    with pytest.raises(WatcherError, match="log-to"):
        watch(clusterfed.FedClust(), tmp_path / "bad", log_to="report,tensorbord")


def test_the_report_quotes_the_strategys_account_of_a_missed_count():
    from clusterfed.report.html import clustering_notes
    from clusterfed.report.run_folder import RunView
    reason = "2 clusters for 3 true groups: 1 splits accepted"
    view = RunView(out=Path("."), rounds=[], summary={"under_split_reason": reason},
                   assignment={"a": 0, "b": 1}, true_groups={"a": 0, "b": 1})
    assert f"Fewer clusters than groups: {reason}" in clustering_notes(view)
    assert not any(n.startswith("Fewer") for n in clustering_notes(RunView(out=Path("."), rounds=[])))
