"""Where people watch a run: plug-ins told of every round as ``rounds.jsonl`` is written.

A ``RunWatcher`` is handed to ``clusterfed.results.RunRecorder(..., watchers=[...])``; the
built-in app builds them from the run-config key ``log-to`` (``report``, ``tensorboard``,
``mlflow``), a library user with ``clusterfed.report.watch``. A watcher's
missing package is found before round 1 (``missing_extras``) and named with its pip extra;
a watcher that fails during the run is switched off with one warning, never the run.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from flwr.supercore import log

from clusterfed.report.html import write_report
from clusterfed.core.exchange import natural

LOG_TO = ("report", "tensorboard", "mlflow")
# per destination: the module it needs and the pip extra that installs it
EXTRAS = {"report": ("matplotlib", "report"), "tensorboard": ("tensorboardX", "tensorboard"),
          "mlflow": ("mlflow", "mlflow")}
TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlruns"
# the report is redrawn after a round only if the time since the last drawing is at least this
# many times what drawing took, so it costs at most ~1/(1+this) of a run's time; always at the end
REPORT_COST_RATIO = 10.0


class WatcherError(RuntimeError):
    """A watcher cannot start (its package is missing, its destination refuses); before round 1."""


def parse_log_to(text: str) -> list[str]:
    """``"report,tensorboard"`` → ``["report", "tensorboard"]``; ``""``/``"none"`` → ``[]``.
    Raises ValueError naming an unknown destination."""
    names = [part.strip().lower() for part in str(text).split(",") if part.strip()]
    if names == ["none"]:
        return []
    unknown = [n for n in names if n not in LOG_TO]
    if unknown:
        raise ValueError(f"log-to: {', '.join(map(repr, unknown))} is not one of {', '.join(LOG_TO)} "
                         f"(comma-separated, or \"none\")")
    return list(dict.fromkeys(names))


def missing_extras(names: list[str]) -> str | None:
    """One sentence naming the pip extra of each destination whose package is not installed."""
    missing = [(n, *EXTRAS[n]) for n in names if importlib.util.find_spec(EXTRAS[n][0]) is None]
    if not missing:
        return None
    return "; ".join(f"log-to = {name} needs {module}: pip install \"clusterfed[{extra}]\""
                     for name, module, extra in missing)


class RunWatcher:
    """Base of the plug-ins: override what you need. ``run_started`` comes before round 1
    (raise ``WatcherError`` to stop the run there), ``round_ended`` after each row of
    ``rounds.jsonl`` (the row: clusterfed.results' fields, ``assignment`` included; the true
    groups of the clients, for metrics only), ``run_ended`` with summary.json's and
    clusters.json's content."""

    name = "watcher"

    def run_started(self, out: Path, config: dict[str, Any]) -> None:
        pass

    def round_ended(self, record: dict[str, Any], true_groups: dict[str, int]) -> None:
        pass

    def run_ended(self, summary: dict[str, Any], clusters: dict[str, Any] | None) -> None:
        pass


class SafeWatcher(RunWatcher):
    """Runs another watcher; an error after the start switches it off with one warning."""

    def __init__(self, inner: RunWatcher):
        self.inner, self.name, self.failed = inner, inner.name, False

    def run_started(self, out: Path, config: dict[str, Any]) -> None:
        self.inner.run_started(out, config)

    def _call(self, method: str, *args: Any) -> None:
        if self.failed:
            return
        try:
            getattr(self.inner, method)(*args)
        except Exception as error:  # a dashboard must not stop training
            self.failed = True
            log(logging.WARNING, "clusterfed: %s switched off after an error: %s: %s", self.name,
                type(error).__name__, error)

    def round_ended(self, record: dict[str, Any], true_groups: dict[str, int]) -> None:
        self._call("round_ended", record, true_groups)

    def run_ended(self, summary: dict[str, Any], clusters: dict[str, Any] | None) -> None:
        self._call("run_ended", summary, clusters)


class HtmlReport(RunWatcher):
    """``out/report.html`` (clusterfed.report.html), redrawn after each round (at most
    ``1/(1+REPORT_COST_RATIO)`` of the run's time) and at the end."""

    name = "report"

    def __init__(self, cost_ratio: float = REPORT_COST_RATIO):
        self.cost_ratio = cost_ratio
        self.out: Path | None = None
        self.next_at = 0.0

    def run_started(self, out: Path, config: dict[str, Any]) -> None:
        self.out = out

    def _write(self, true_groups: dict[str, int] | None, ended: tuple | None = None) -> None:
        started = time.monotonic()
        write_report(self.out, live_true_groups=true_groups, ended=ended)
        ended = time.monotonic()
        self.next_at = ended + self.cost_ratio * (ended - started)

    def round_ended(self, record: dict[str, Any], true_groups: dict[str, int]) -> None:
        if time.monotonic() >= self.next_at:
            self._write(true_groups)

    def run_ended(self, summary: dict[str, Any], clusters: dict[str, Any] | None) -> None:
        self._write(None, (summary, clusters))


def round_scalars(record: dict[str, Any]) -> dict[str, float]:
    """A row's numbers as flat metric names: the metric and loss overall and per cluster,
    bytes each way, clusters, ARI, failures."""
    metric = next((k[len("client_"):] for k in record if k.startswith("client_")), "accuracy")
    values: dict[str, Any] = {
        metric: record.get(metric), f"{metric}_std": record.get(f"{metric}_std"), "loss": record.get("loss"),
        "train_loss": record.get("train_loss"), "ari": record.get("ari"), "num_clusters": record.get("num_clusters"),
        "bytes_up": record.get("bytes_up"), "bytes_down": record.get("bytes_down"),
        "cum_bytes_up": record.get("cum_bytes_up"), "cum_bytes_down": record.get("cum_bytes_down"),
        "failures": record.get("failures"), "rejected": record.get("rejected"),
        "clients_evaluated": record.get("clients_evaluated"), "round_seconds": record.get("round_seconds"),
    }
    for cluster, stats in record.get("clusters", {}).items():
        for key in (metric, "loss", "size"):
            values[f"cluster_{cluster}/{key}"] = stats.get(key)
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def assignment_markdown(assignment: dict[str, int], true_groups: dict[str, int]) -> str:
    """Clusters and their clients as a Markdown table (TensorBoard's text tab renders it)."""
    members: dict[int, list[str]] = {}
    for key, cluster in assignment.items():
        members.setdefault(int(cluster), []).append(key)
    lines = ["| cluster | clients | true groups | members |", "|---|---|---|---|"]
    for cluster in sorted(members):
        keys = sorted(members[cluster], key=natural)
        groups = sorted({true_groups[k] for k in keys if k in true_groups})
        lines.append(f"| {cluster} | {len(keys)} | {', '.join(map(str, groups)) or '-'} | {', '.join(keys)} |")
    return "\n".join(lines)


class TensorBoardLogger(RunWatcher):
    """Event files under ``log_dir`` (default ``out/tensorboard``): each row's numbers as
    scalars (``round_scalars``) at step = round, and the assignment as a text table per round."""

    name = "tensorboard"

    def __init__(self, log_dir: str | Path | None = None):
        self.log_dir = log_dir
        self.writer = None

    def run_started(self, out: Path, config: dict[str, Any]) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise WatcherError(missing_extras(["tensorboard"])) from None
        self.writer = SummaryWriter(logdir=str(self.log_dir or out / TENSORBOARD_DIR))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1, sort_keys=True, default=str) + "\n```", 0)

    def round_ended(self, record: dict[str, Any], true_groups: dict[str, int]) -> None:
        step = int(record["round"])
        for key, value in round_scalars(record).items():
            self.writer.add_scalar(key, value, step)
        self.writer.add_text("assignment", assignment_markdown(record.get("assignment", {}), true_groups), step)
        self.writer.flush()

    def run_ended(self, summary: dict[str, Any], clusters: dict[str, Any] | None) -> None:
        if clusters and clusters.get("one_cluster_reason"):
            self.writer.add_text("one_cluster_reason", str(clusters["one_cluster_reason"]), summary.get("rounds", 0))
        self.writer.close()


class MLflowLogger(RunWatcher):
    """One MLflow run: the strategy's parameters as params, each row's numbers as metrics at
    step = round, the assignment as an artifact per round (``assignment/round-NNNN.json``) and
    at the end (``assignment.json``, with ``report.html`` when written). Tracking server:
    ``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a local file store in
    ``out/mlruns``. Experiment: ``experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else
    ``clusterfed``."""

    name = "mlflow"
    MAX_PARAM_CHARS = 500  # MLflow's limits: a param value, params and metrics in one batch
    MAX_BATCH_PARAMS = 100
    MAX_BATCH_METRICS = 1000

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None, run_name: str | None = None):
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.client = self.run_id = self.out = None

    def run_started(self, out: Path, config: dict[str, Any]) -> None:
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise WatcherError(missing_extras(["mlflow"])) from None
        self.out = out
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # MLflow 3 keeps its file store for those who opt in; a local store beside the
            # run's other outputs is what a user without a tracking server wants
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (out / MLFLOW_DIR).resolve().as_uri()
        experiment = self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "clusterfed"
        try:
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            run = self.client.create_run(experiment_id, run_name=self.run_name or out.resolve().name,
                                         tags={"strategy": str(config.get("strategy", ""))})
        except Exception as error:
            raise WatcherError(f"log-to = mlflow: cannot start a run at {uri}: {type(error).__name__}: "
                               f"{str(error).splitlines()[0] if str(error) else ''}") from None
        self.run_id = run.info.run_id
        params = [Param(k, str(v)[:self.MAX_PARAM_CHARS]) for k, v in sorted(config.items())]
        for start in range(0, len(params), self.MAX_BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=params[start:start + self.MAX_BATCH_PARAMS])
        log(logging.INFO, "clusterfed: MLflow run %s in experiment %r at %s", self.run_id, experiment, uri)

    def round_ended(self, record: dict[str, Any], true_groups: dict[str, int]) -> None:
        from mlflow.entities import Metric

        step, now = int(record["round"]), int(time.time() * 1000)
        metrics = [Metric(k.replace("/", "."), v, now, step) for k, v in round_scalars(record).items()]
        for start in range(0, len(metrics), self.MAX_BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + self.MAX_BATCH_METRICS])
        self.client.log_text(self.run_id, json.dumps(record.get("assignment", {}), sort_keys=True),
                             f"assignment/round-{step:04d}.json")

    def run_ended(self, summary: dict[str, Any], clusters: dict[str, Any] | None) -> None:
        if clusters:
            self.client.log_dict(self.run_id, {k: clusters.get(k) for k in ("assignment", "true_groups", "sizes",
                                                                            "one_cluster_reason") if k in clusters},
                                 "assignment.json")
        report = self.out / "report.html"
        if report.is_file():
            self.client.log_artifact(self.run_id, str(report))
        self.client.set_terminated(self.run_id)


def make_watchers(names: list[str], **options: Any) -> list[RunWatcher]:
    """The watchers for ``log-to`` names (in LOG_TO's order: the report is written before
    MLflow uploads it), each wrapped so that an error after the start switches it off.
    Raises WatcherError naming the pip extras of any missing package."""
    problem = missing_extras(names)
    if problem:
        raise WatcherError(problem)
    build = {"report": HtmlReport, "tensorboard": TensorBoardLogger, "mlflow": MLflowLogger}
    return [SafeWatcher(build[n](**options.get(n, {}))) for n in LOG_TO if n in names]
