"""Per-round records, rounds.jsonl / summary.json / clusters.json, and the summary table.

One writer for every strategy. Field names are the contract benchmarks and tests read:
renaming one is a breaking change.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np
from sklearn.metrics import adjusted_rand_score

from clusterfed.cluster_misses import MISS_LABELS, SINGLE_CLIENTS, cluster_miss_reason, single_client_clusters

ROUND_FIELDS = (
    "round",
    "accuracy",
    "accuracy_weighted",
    "accuracy_std",
    "loss",
    "num_clusters",
    "ari",
    "bytes_down",
    "bytes_up",
    "cum_bytes_down",
    "cum_bytes_up",
    "eval_bytes_down",
    "transmissions",
    "failures",
    "rejected",
    "faults",
    "clients_evaluated",
    "clients_known",
    "clients_to_evaluate",
    "clients_absent",
    "round_seconds",
    "clustering_seconds",
)


@dataclass
class Traffic:
    """What crossed the network in one round. Training-protocol arrays (train and
    clustering messages) are ``down``/``up``; evaluation downloads are kept apart so that
    measuring a model does not count as the algorithm's communication."""

    down: int = 0
    up: int = 0
    eval_down: int = 0
    transmissions: int = 0
    failures: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    # every failure by client: {"client": key or None, "node": node id, "kind", "reason": its full text}
    failed: list[dict[str, Any]] = field(default_factory=list)
    # every fault by kind: "error" (the client raised), "timeout" (no reply in time) and the
    # rejection kinds of clusterfed.runner.validation ("non_finite", "shape", ...)
    faults: dict[str, int] = field(default_factory=dict)

    def fault(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1


@dataclass(frozen=True)
class EvalRow:
    key: str
    cluster: int
    true_group: int
    accuracy: float  # the value of the task's declared metric (accuracy for classification)
    loss: float | None
    num_examples: int


@dataclass(frozen=True)
class Metric:
    """The metric a task declares: its name (a key of the clients' evaluate replies, with or
    without ``eval-``), whether higher is better, and the target for rounds/MB to target.
    Rows and summaries name their columns after it (``accuracy``, ``final_accuracy``,
    ``client_accuracy``; ``mse``, ``final_mse`` …); ``best`` is the max or the min."""

    name: str = "accuracy"
    higher_is_better: bool = True

    def reached(self, value: float, target: float) -> bool:
        return value >= target if self.higher_is_better else value <= target

    def best(self, values: list[float]) -> float:
        return max(values) if self.higher_is_better else min(values)


ACCURACY = Metric()


def assignment_ari(assignment: dict[str, int], true_groups: dict[str, int]) -> float:
    """Adjusted Rand index of client -> model against the true groups (1 model vs G groups = 0)."""
    keys = sorted(k for k in assignment if k in true_groups)
    if len(keys) < 2:
        return 1.0
    return float(adjusted_rand_score([true_groups[k] for k in keys], [assignment[k] for k in keys]))


class RunRecorder:
    """Collects per-round records for one run and writes them under ``out_dir``."""

    def __init__(self, out_dir: str | Path, config: dict[str, Any], *, stream: TextIO | None = sys.stdout,
                 metric: Metric = ACCURACY, target: float | None = None, watchers: Sequence[Any] = ()):
        self.metric = metric
        self.target = float(config.get("target-accuracy", 1.0)) if target is None else float(target)
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.stream = stream
        self.rounds: list[dict[str, Any]] = []
        self.cluster_accuracy: list[dict[str, Any]] = []
        self.cum_down = 0
        self.cum_up = 0
        self.true_groups: dict[str, int] = {}  # client -> true group, for clusters.json (metrics only)
        (self.out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        self._rounds_path = self.out / "rounds.jsonl"
        # a run that resumes keeps the rows on disk until restore() rewrites them: stopped
        # before that (killed while it waits for its nodes), it leaves them as they were
        self._rounds_file = None if config.get("resume-from") else self._rounds_path.open("w")
        self.on_round = None  # called with each round's row once it is written (the ServerApp's heartbeat)
        # clusterfed.report.RunWatcher plug-ins (HTML report, TensorBoard, MLflow): told of the
        # start, each row as it is written and the end
        self.watchers = list(watchers)
        for watcher in self.watchers:
            watcher.run_started(self.out, config)

    def record_round(
        self,
        server_round: int,
        *,
        evals: list[EvalRow],
        assignment: dict[str, int],
        true_groups: dict[str, int],
        traffic: Traffic,
        round_seconds: float,
        clustering_seconds: float = 0.0,
        extra: dict[str, Any] | None = None,
        clients_known: int | None = None,
        clients_absent: int = 0,
        clients_to_evaluate: int | None = None,
    ) -> dict[str, Any]:
        """One round's row. Accuracy is over the clients evaluated this round;
        ``clients_to_evaluate`` (the clients sent an evaluate message: the ``fraction-evaluate``
        sample; default ``clients_known``, default those evaluated) is what coverage is
        measured against."""
        self.cum_down += traffic.down
        self.cum_up += traffic.up
        self.true_groups.update(true_groups)
        name = self.metric.name
        evals = [e for e in evals if e.accuracy is not None]  # a reply without the declared metric
        accuracies = np.array([e.accuracy for e in evals], dtype=float)
        sizes = np.array([e.num_examples for e in evals], dtype=float)
        losses = np.array([e.loss for e in evals if e.loss is not None], dtype=float)
        per_cluster: dict[str, dict[str, float]] = {}
        for cluster in sorted({e.cluster for e in evals}):
            members = [e.accuracy for e in evals if e.cluster == cluster]
            member_losses = [e.loss for e in evals if e.cluster == cluster and e.loss is not None]
            per_cluster[str(cluster)] = {name: float(np.mean(members)), "size": len(members),
                                         "loss": float(np.mean(member_losses)) if member_losses else None}
        record: dict[str, Any] = {
            "round": server_round,
            name: _mean(accuracies),
            f"{name}_weighted": float(np.average(accuracies, weights=sizes)) if sizes.sum() > 0 else None,
            f"{name}_std": float(accuracies.std()) if len(accuracies) else None,
            "loss": _mean(losses),
            "num_clusters": len(set(assignment.values())),
            "ari": assignment_ari(assignment, true_groups),
            "bytes_down": traffic.down,
            "bytes_up": traffic.up,
            "cum_bytes_down": self.cum_down,
            "cum_bytes_up": self.cum_up,
            "eval_bytes_down": traffic.eval_down,
            "transmissions": traffic.transmissions,
            "failures": traffic.failures,
            "rejected": len(traffic.rejected),
            "faults": dict(sorted(traffic.faults.items())),
            "clients_evaluated": len(evals),
            "clients_known": len(evals) if clients_known is None else clients_known,
            "clients_to_evaluate": (clients_to_evaluate if clients_to_evaluate is not None
                                    else len(evals) if clients_known is None else clients_known),
            "clients_absent": clients_absent,
            "round_seconds": round(round_seconds, 4),
            "clustering_seconds": round(clustering_seconds, 4),
            "clusters": per_cluster,
            f"client_{name}": {e.key: round(e.accuracy, 4) for e in evals},
            "assignment": {key: int(cluster) for key, cluster in assignment.items()},
        }
        if traffic.failed:
            record["failed"] = traffic.failed
        if traffic.rejected:
            record["rejections"] = traffic.rejected
        record.update(_no_clash(server_round, record, extra or {}))
        self.rounds.append(record)
        if self._rounds_file is None:
            self._rounds_file = self._rounds_path.open("w")
        self._rounds_file.write(json.dumps(record) + "\n")
        self._rounds_file.flush()
        self._progress(record)
        if self.on_round is not None:
            self.on_round(record)
        for watcher in self.watchers:
            watcher.round_ended(record, true_groups)
        return record

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the recorder."""
        return {"rounds": self.rounds, "cum_down": self.cum_down, "cum_up": self.cum_up,
                "true_groups": self.true_groups}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue a resumed run: its earlier rows are written again, then new ones follow."""
        self.rounds = list(state["rounds"])
        self.cum_down, self.cum_up = state["cum_down"], state["cum_up"]
        self.true_groups = dict(state.get("true_groups", {}))
        # written beside and renamed: a kill at any moment leaves the old rows or the new ones
        tmp = self._rounds_path.with_name("rounds.jsonl.tmp")
        tmp.write_text("".join(json.dumps(record) + "\n" for record in self.rounds))
        if self._rounds_file is not None:
            self._rounds_file.close()
        tmp.replace(self._rounds_path)
        self._rounds_file = self._rounds_path.open("a")

    def _progress(self, r: dict[str, Any]) -> None:
        if self.stream is None:
            return
        total = self.config.get("rounds", "?")
        name = self.metric.name
        acc = "   n/a" if r[name] is None else f"{r[name]:.3f} ± {r[name + '_std']:.3f}"
        known = r["clients_known"] + r["clients_absent"]  # absent clients count among those the value is over
        print(
            f"round {r['round']:>3}/{total}  {name[:3] if name == 'accuracy' else name} {acc}  clusters {r['num_clusters']:>2}  ARI {r['ari']:.2f}  "
            f"up {r['cum_bytes_up'] / 1e6:7.2f} MB  down {r['cum_bytes_down'] / 1e6:7.2f} MB  "
            f"{r['round_seconds']:.1f}s" + (f"  rejected {r['rejected']}" if r["rejected"] else "")
            + (f"  failed {r['failures']}" if r["failures"] else "")
            + (f"  evaluated {r['clients_evaluated']} of {known} clients" if r["clients_evaluated"] != known else ""),
            file=self.stream,
            flush=True,
        )

    def finish(self, wall_seconds: float, clusters: dict[str, Any] | None = None) -> dict[str, Any]:
        if self._rounds_file is not None:
            self._rounds_file.close()
        summary = summarize(self.rounds, self.target, float(self.config.get("target-coverage", 1.0)), self.metric)
        summary["wall_seconds"] = round(wall_seconds, 2)
        summary["strategy"] = self.config.get("strategy")
        summary["config"] = self.config
        if clusters and clusters.get("one_cluster_reason"):  # a clustered strategy that ended as FedAvg: say why
            summary["one_cluster_reason"] = clusters["one_cluster_reason"]
        if clusters and (miss := cluster_miss_reason(summary, clusters, self.true_groups)):
            summary[miss[0]] = miss[1]
        if clusters and (single := single_client_clusters(clusters)):  # a cluster of one client is named
            summary[SINGLE_CLIENTS] = single
        if clusters and clusters.get("privacy"):  # differential privacy: the run's ε at δ (clusterfed.privacy)
            summary["epsilon"], summary["delta"] = clusters["privacy"]["epsilon"], clusters["privacy"]["delta"]
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        if clusters is not None:
            clusters = with_true_groups(clusters, self.true_groups)
            (self.out / "clusters.json").write_text(json.dumps(clusters, indent=2, default=_jsonable))
        if self.stream is not None:
            print(summary_table([summary]), file=self.stream, flush=True)
        for watcher in self.watchers:
            watcher.run_ended(summary, clusters)
        return summary


def with_true_groups(clusters: dict[str, Any], true_groups: dict[str, int]) -> dict[str, Any]:
    """A strategy's ``final_clusters`` with each assigned client's true group (``true_groups``,
    after ``assignment``) where it does not say them itself: strategies never see true groups."""
    if "true_groups" in clusters or "assignment" not in clusters:
        return clusters
    out: dict[str, Any] = {}
    for key, value in clusters.items():
        out[key] = value
        if key == "assignment":
            out["true_groups"] = {k: true_groups[k] for k in value if k in true_groups}
    return out


def _no_clash(server_round: int, record: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra``, or ValueError when one of its keys is a column of the round's own ``record``: a
    strategy's diagnostic under a column's name would corrupt the row and what reads it."""
    clash = sorted(set(extra) & set(record))
    if clash:
        raise ValueError(f"round {server_round}: the round's diagnostics {clash} have the names of "
                         f"rounds.jsonl's own columns; a strategy hook must return them under other names")
    return extra


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if len(values) else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value)}")


def covered(record: dict[str, Any], coverage: float) -> bool:
    """Whether enough of the clients sent an evaluate message (the ``fraction-evaluate``
    sample; in files without that field, every known client) replied for the round's
    accuracy to count."""
    known = record.get("clients_to_evaluate", record.get("clients_known", 0))
    return known > 0 and record.get("clients_evaluated", 0) >= coverage * known - 1e-9


def summarize(rounds: list[dict[str, Any]], target: float, coverage: float = 1.0,
              metric: Metric = ACCURACY) -> dict[str, Any]:
    """Final and best value of the declared metric, rounds and MB (up + down) to reach
    ``target`` (at or above it, or at or below it for a metric where lower is better). A
    round counts towards the target only if at least ``coverage`` of the clients it sent an
    evaluate message to replied (``covered``): a round that missed clients may not reach the
    target early, and a ``fraction-evaluate`` sample is judged against itself."""
    name = metric.name
    values = [r[name] for r in rounds if r.get(name) is not None]
    reached = next((r for r in rounds if r.get(name) is not None and metric.reached(r[name], target)
                    and covered(r, coverage)), None)
    last = rounds[-1] if rounds else {}
    total_bytes = last.get("cum_bytes_down", 0) + last.get("cum_bytes_up", 0)
    return {
        **({} if name == "accuracy" else {"metric": name, "higher_is_better": metric.higher_is_better}),
        f"final_{name}": values[-1] if values else None,
        f"best_{name}": metric.best(values) if values else None,
        f"final_{name}_std": last.get(f"{name}_std"),
        f"target_{name}": target,
        "rounds_to_target": reached["round"] if reached else None,
        "mb_to_target": round((reached["cum_bytes_down"] + reached["cum_bytes_up"]) / 1e6, 4) if reached else None,
        "total_mb": round(total_bytes / 1e6, 4),
        "total_mb_up": round(last.get("cum_bytes_up", 0) / 1e6, 4),
        "total_mb_down": round(last.get("cum_bytes_down", 0) / 1e6, 4),
        # what the final value is over: the clients evaluated, of every client the run knew
        # (absent ones included), as a Flower user counts its nodes
        "final_clients_evaluated": last.get("clients_evaluated"),
        "final_clients_known": last.get("clients_known", 0) + last.get("clients_absent", 0) if last else None,
        "final_ari": last.get("ari"),
        "num_clusters": last.get("num_clusters"),
        "rounds": len(rounds),
        "target_coverage": coverage,
        "rejected": sum(r.get("rejected", 0) for r in rounds),
        "failures": sum(r.get("failures", 0) for r in rounds),
        "faults": _sum_faults(rounds),
    }


def _sum_faults(rounds: list[dict[str, Any]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for record in rounds:
        for kind, count in record.get("faults", {}).items():
            total[kind] = total.get(kind, 0) + count
    return dict(sorted(total.items()))


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        width = int(spec.split(".")[0].rstrip("dfs") or 0)
        return "-".rjust(width)
    return format(value, spec)


def summary_table(summaries: list[dict[str, Any]]) -> str:
    name = summaries[0].get("metric", "accuracy") if summaries else "accuracy"
    short = "acc" if name == "accuracy" else name[:5]
    header = f"{'strategy':<12} {'final ' + short:>9} {'best ' + short:>9} {'ARI':>5} {'clusters':>8} {'rnds→tgt':>8} {'MB→tgt':>8} {'total MB':>9} {'wall s':>7}"
    lines = [header, "-" * len(header)]
    for s in summaries:
        lines.append(
            f"{str(s.get('strategy')):<12} {_fmt(s[f'final_{name}'], '9.3f')} {_fmt(s[f'best_{name}'], '9.3f')} "
            f"{_fmt(s['final_ari'], '5.2f')} {_fmt(s['num_clusters'], '8d')} {_fmt(s['rounds_to_target'], '8d')} "
            f"{_fmt(s['mb_to_target'], '8.2f')} {_fmt(s['total_mb'], '9.2f')} {_fmt(s.get('wall_seconds'), '7.1f')}"
        )
        evaluated, known = s.get("final_clients_evaluated"), s.get("final_clients_known")
        if evaluated is not None and known and evaluated < known:
            lines.append(f"{'':<12} final {short} over {evaluated} of {known} clients")
        for key, label in {"one_cluster_reason": "one cluster", **MISS_LABELS, SINGLE_CLIENTS: "single clients"}.items():
            if s.get(key):
                lines.append(f"{'':<12} {label}: {s[key]}")
    return "\n".join(lines)


def describe_clusters(clusters: dict[str, Any]) -> str:
    """One line per cluster: its members and the true groups they come from."""
    assignment, groups = clusters.get("assignment", {}), clusters.get("true_groups", {})
    members: dict[int, list[str]] = {}
    for key, cluster in assignment.items():
        members.setdefault(int(cluster), []).append(key)
    lines = []
    for cluster in sorted(members):
        keys = members[cluster]
        origin = sorted({groups.get(k) for k in keys if k in groups})
        lines.append(f"  cluster {cluster:>3}: {len(keys):>3} clients, true groups {origin}  [{', '.join(keys)}]")
    return "\n".join(lines)


def load_run(out_dir: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    out = Path(out_dir)
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return rounds, summary
