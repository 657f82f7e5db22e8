"""Scoring a round: the clients' metrics averaged as Flower's FedAvg does, each evaluated
client's row (its cluster, its true group where known, the declared metric) and the round's
record (assignment against the true groups, bytes, timing) handed to the recorder, and the
strategy's reported splits and placements scored against the true groups. The strategies
never see true groups or clocks: scoring is the driver's."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from flwr.app import MetricRecord, RecordDict

from clusterfed.clustering.layercfl import true_group_gap
from clusterfed.results import EvalRow, RunRecorder, Traffic
from clusterfed.runner.replies import STOCK_KEY_METRICS
from clusterfed.runner.validation import ReplyRejected, parse_eval_reply
from clusterfed.core.exchange import Arrays, ClientInfo, NewcomersPlaced, SplitCompared, natural

# names a stock Flower ClientApp (quickstart-pytorch) reports for the same quantities
METRIC_ALIASES = {"accuracy": ("eval-accuracy", "eval_acc", "eval_accuracy", "accuracy"),
                  "loss": ("eval-loss", "eval_loss", "loss")}


def metric_value(metrics: dict[str, float], name: str) -> float | None:
    """The value of the declared metric ``name`` (``accuracy``, ``loss``, or any reply key)."""
    for key in METRIC_ALIASES.get(name, ()) + (name, f"eval-{name}", f"eval_{name}"):
        if key in metrics:
            return float(metrics[key])
    return None


def weighted_metrics(rows: list[tuple[str, int, dict[str, float]]]) -> MetricRecord:
    """Each metric averaged over the replies (client key, num-examples, metrics) by their
    num-examples, as Flower's FedAvg does, summed in the order of the client keys;
    ``num-examples`` is the total."""
    return average_metrics([{**m, "num-examples": n} for _, n, m in sorted(rows, key=lambda row: natural(row[0]))])


def average_metrics(records: list) -> MetricRecord:
    total = sum(int(r.get("num-examples", 0)) for r in records)
    if not total:
        return MetricRecord({})
    sums: dict[str, float] = {}
    for record in records:
        n = int(record.get("num-examples", 0))
        for key, value in record.items():
            if key != "num-examples" and isinstance(value, (int, float)) and not isinstance(value, bool):
                sums[key] = sums.get(key, 0.0) + n * float(value)
    out = {key: value / total for key, value in sums.items()}
    out["num-examples"] = total
    return MetricRecord(out)


def eval_rows(server_round: int, received: dict[str, RecordDict], models: dict[str, tuple[int, Arrays]],
              clients: dict[str, ClientInfo], metric: str, reject) -> tuple[list[EvalRow], list[tuple[str, int, dict]]]:
    """Each evaluate reply scored: its row (cluster, true group, ``metric``, loss, examples)
    and its metrics for the Flower-style average; a malformed reply goes to ``reject``."""
    rows, averaged = [], []
    for key in sorted(received, key=natural):  # every sum over clients in the order of their keys
        content = received[key]
        try:
            metrics, n = parse_eval_reply(content, key)
        except ReplyRejected as error:
            reject(server_round, key, error)
            continue
        averaged.append((key, n, {k: v for k, v in metrics.items() if k not in STOCK_KEY_METRICS}))
        rows.append(EvalRow(key, models[key][0], clients[key].true_group, metric_value(metrics, metric),
                            metric_value(metrics, "loss"), n))
    return rows, averaged


def record_round(recorder: RunRecorder, server_round: int, *, evals: list[EvalRow], active: list[str],
                 clients: dict[str, ClientInfo], assignment: dict[str, int], traffic: Traffic, seconds: float,
                 clustering_seconds: float, extra: dict[str, Any], absent: int, evaluated: int) -> dict[str, Any]:
    """The round's row in rounds.jsonl: the active clients' assignment against their true groups
    (and every known client's true group kept for clusters.json)."""
    recorder.true_groups.update({k: info.true_group for k, info in clients.items()})
    return recorder.record_round(
        server_round, evals=evals, assignment={k: assignment[k] for k in active if k in assignment},
        true_groups={k: clients[k].true_group for k in active}, traffic=traffic, round_seconds=seconds,
        clustering_seconds=clustering_seconds, extra=extra, clients_known=len(active), clients_absent=absent,
        clients_to_evaluate=evaluated,
    )


def score_reports(reports: list[Any], clients: dict[str, ClientInfo], assignment_before: dict[str, int]) -> None:
    """Write the true-group diagnostics into the records the strategy reported this round
    (metrics only: nothing here decides anything). A split (``SplitCompared``): Sattler's gap
    of the true groups on the similarity matrix it decided on (``true_group_gap``; None where
    undefined, one group only). Placed newcomers (``NewcomersPlaced``): each one's
    ``true_group`` and ``matches_true_group`` — it joined a cluster most of whose members held
    its group when the placement began (``assignment_before``, the assignment at the round's
    start, updated by each earlier placement), or it founded a cluster and its group was no
    cluster's majority then (nor an earlier founder's of the same placement)."""
    assignment = dict(assignment_before)
    for report in reports:
        if isinstance(report, SplitCompared):
            gap = true_group_gap(report.similarity, [clients[k].true_group for k in report.keys])
            for record in report.records:
                record["true_group_gap"] = None if np.isnan(gap) else float(gap)
        elif isinstance(report, NewcomersPlaced):
            majority = majority_groups(assignment, clients)
            for entry in report.entries:
                group, cluster = clients[entry["client"]].true_group, entry["cluster"]
                if entry["new_cluster"]:
                    matches = group not in majority.values()
                    majority[cluster] = group
                else:
                    matches = majority.get(cluster) == group
                entry.update(true_group=group, matches_true_group=bool(matches))
            assignment.update({entry["client"]: entry["cluster"] for entry in report.entries})


def majority_groups(assignment: dict[str, int], clients: dict[str, ClientInfo]) -> dict[int, int]:
    """Cluster -> the true group most of its members hold (ties: the group met first)."""
    votes: dict[int, Counter] = {}
    for key, cluster in assignment.items():
        votes.setdefault(cluster, Counter())[clients[key].true_group] += 1
    return {cluster: counter.most_common(1)[0][0] for cluster, counter in votes.items()}
