"""What a clustered strategy and the round driver agree on, apart from the messages: the
client capabilities a strategy may need, the result ``start`` returns, the errors a run
stops with, and the round's train loss. Both import it; neither imports the other's
internals through it."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import Result

from clusterfed.core.exchange import TrainReply, by_key

# capabilities a strategy may need from its clients beyond a stock Flower ClientApp
# (train: load arrays, train, reply the full state + num-examples; evaluate: reply metrics)
MULTI_MODEL = "multi-model"  # choose the lowest-training-loss model among K (IFCA)
LABEL_STATS = "label-stats"  # report label statistics in the profile (AdaCFL)
CAPABILITIES = {
    MULTI_MODEL: "choosing the lowest-training-loss model among the K it is sent",
    LABEL_STATS: "reporting label statistics (number of classes, label entropy) in its profile",
}


class ClusteredResult(Result):
    """Flower's ``Result`` plus the clustering: ``cluster_arrays`` (the final model of each
    cluster), ``assignment`` (client key → cluster) and ``clustering`` (the clustering
    record: splits, cuts, reasons) and ``traffic`` (array bytes each way, counted from the
    messages). ``arrays`` is the largest cluster's model."""

    def __init__(self) -> None:
        super().__init__()
        # probe_bytes_down: the initial model sent with each node's profile probe
        self.traffic: dict[str, int] = {"bytes_down": 0, "bytes_up": 0, "eval_bytes_down": 0, "probe_bytes_down": 0}
        self.cluster_arrays: dict[int, ArrayRecord] = {}
        self.assignment: dict[str, int] = {}
        self.clustering: dict[str, Any] = {}

    def clusters(self) -> dict[int, list[str]]:
        """Each final cluster's client keys, in key order (numeric keys by their number)."""
        members: dict[int, list[str]] = {}
        for key in sorted(self.assignment, key=lambda k: (0, int(k), "") if k.isdigit() else (1, 0, k)):
            members.setdefault(self.assignment[key], []).append(key)
        return dict(sorted(members.items()))

    def summary(self, *metrics: str) -> str:
        """A table of ``metrics`` per round (each looked up in the clients' aggregated train
        metrics, then their evaluate metrics; "-" where a round has none), then the clusters
        and, when the run ended with one cluster, why."""
        rounds = sorted(set(self.train_metrics_clientapp) | set(self.evaluate_metrics_clientapp))
        widths = [max(10, len(name)) for name in metrics]
        lines = ["round" + "".join(f"  {name:>{w}}" for name, w in zip(metrics, widths))]
        for rnd in rounds:
            train, evaluate = self.train_metrics_clientapp.get(rnd, {}), self.evaluate_metrics_clientapp.get(rnd, {})
            values = [train.get(name, evaluate.get(name)) for name in metrics]
            lines.append(f"{rnd:5d}" + "".join("  " + ("-".rjust(w) if value is None else f"{float(value):>{w}.4g}")
                                               for value, w in zip(values, widths)))
        clusters = self.clusters()
        lines.append(f"{len(clusters)} cluster(s):")
        lines += [f"  cluster {cluster}: {', '.join(keys)}" for cluster, keys in clusters.items()]
        if self.clustering.get("one_cluster_reason"):
            lines.append(f"one cluster because: {self.clustering['one_cluster_reason']}")
        return "\n".join(lines)


class StrategyParamsError(ValueError):
    """A strategy parameter is wrong; the message names the strategy, the parameter and what is allowed."""


class CapabilityError(RuntimeError):
    """The strategy needs something of its clients that they cannot do (IFCA with stock
    ClientApps, say); raised before round 1, naming the capability and the clients."""


class ClientFailureError(RuntimeError):
    """The clients keep failing: no train reply was accepted in several rounds in a row; the
    message quotes the clients' own error text."""


class ModelMismatchError(ValueError):
    """The clients' first replies do not match ``initial_arrays`` (array names, shapes or
    dtypes); raised in round 1, naming the first mismatched array and its client."""


def mean_train_loss(replies: list[TrainReply]) -> float | None:
    """Mean training loss of the replies that reported one (a stock client may not)."""
    losses = [r.train_loss for r in by_key(replies) if r.train_loss is not None]
    return float(np.mean(losses)) if losses else None


def ending_sentence(strategy: Any, clients: Any = None) -> str | None:
    """The last round line's words on how many clusters ``strategy`` ends with and why: as
    FedAvg, its reason and what to try (``one_cluster_reason``, ``one_cluster_advice``), in
    plain words; with several, its evidence for their number (``cluster_count_basis``).
    ``clients``: the run's client table (the driver's), which a reason may quote."""
    name = type(strategy).__name__
    reason = strategy.one_cluster_reason(clients)
    if reason is None:
        basis = strategy.cluster_count_basis()
        clusters = len(set(strategy.assignment.values()))
        if basis is None or clusters < 2:
            return None
        said = basis.startswith(f"{clusters} clusters")  # the one-shot strategies' basis names the count itself
        return f"{name} ends with " + (basis if said else f"{clusters} clusters: {basis}")
    advice = strategy.one_cluster_advice()
    return f"{name} ends with one cluster: {reason}" + (f"; try {advice}" if advice else "")
