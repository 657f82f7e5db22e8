"""One fuzz cell against the strategies: each with its defaults (only the cell's participation
as ``fraction_train``), stock ClientApps unless its ``requires()`` names a capability they
lack, on clusterfed's in-process grid; scored against the true groups and judged."""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from dataclasses import asdict

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from sklearn.metrics import adjusted_rand_score

from clusterfed import protocol
from clusterfed.simulation import inprocess_grid
from clusterfed.strategies import strategy_class
from fuzz.apps import helper_app, stock_app, test
from fuzz.cell import Cell
from fuzz.data import loaders, true_groups
from fuzz.models import build_model
from model_matrix.cells import CEILING, MIN_ARI, CountingApp, partition_of, placed_clients

# FedAvg and the oracle (clusters given as the true groups) are the references: FedAvg what a
# strategy must not lose against, the oracle what a perfect clustering gains in the cell's rounds
STRATEGIES = ("fedavg", "oracle", "fedclust", "adacfl", "cfl", "layercfl", "hicfl", "ifca", "selection")
MAX_LOSS_PP = 1.0  # the most a cell may lose against FedAvg, in percentage points
STANDARD_PARTS = ("[ROUND ", "train loss ", "evaluate over ")


class SeededApp(CountingApp):
    """``CountingApp`` that seeds torch before each train message from the cell's seed, the
    client, the round, the message's phase and how many messages of that phase the client got
    in the round before it: common random numbers. A client's dropout (its loader's order is
    the cell's) then depends on what it is asked, not on which other clients trained before it,
    so two strategies asking it the same training draw the same, and a strategy whose one
    cluster averages FedAvg's sample ends with FedAvg's model; without it such runs differed by
    dropout's draws alone (up to 3 points on a small federation)."""

    def __init__(self, app, seed: int):
        super().__init__(app)
        self.seed, self.calls = int(seed), Counter()

    def __call__(self, message: Message, context: Context) -> Message:
        if message.metadata.message_type == MessageType.TRAIN:
            config = message.content.config_records.get("config", {})
            server_round, phase = int(config.get("server-round", 0)), str(config.get("phase", "train"))
            partition = int(context.node_config["partition-id"])
            asked = (partition, server_round, phase)
            entropy = [self.seed, partition, server_round, *phase.encode(), self.calls[asked]]
            self.calls[asked] += 1
            torch.manual_seed(int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 1))
        return super().__call__(message, context)


class RoundLines(logging.Handler):
    """Keeps the ``[ROUND n/N] ...`` lines Flower's logger gets."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("[ROUND "):
            self.lines.append(message)


def quiet_flower() -> logging.Logger:
    """Flower's logger at INFO with its console handlers silenced (the round lines are captured)."""
    logger = logging.getLogger("flwr")
    logger.setLevel(logging.INFO)
    for handler in logger.handlers:
        if not isinstance(handler, RoundLines):
            handler.setLevel(logging.CRITICAL)
    return logger


def decision_text(line: str | None) -> str:
    """What a round line says beyond the driver's counts (replies, clusters, loss, evaluation):
    the strategy's own words: what it compared, decided, or why it ended as it did."""
    if not line:
        return ""
    parts = [part for part in line.split("; ") if part and not part.startswith(STANDARD_PARTS)
             and not re.fullmatch(r"\d+ clusters?", part)]
    return "; ".join(parts)


def clusters_scored(cell: Cell, cluster_arrays: dict, largest, assignment: dict[str, int]) -> dict:
    """The clusters as a row reports them: ``accuracy``, the mean over clients of their own
    cluster's model's test accuracy (``cluster_arrays``: id -> ArrayRecord; a client the run
    never placed is served ``largest``, the largest cluster's), the ``ari`` against the true
    groups, how many ``clusters`` and ``singletons`` (one-client clusters), and how many clients
    were ``placed``."""
    placed = placed_clients(assignment)
    by_partition = {partition_of(k): int(c) for k, c in placed.items()}
    models: dict[int | None, torch.nn.Module] = {}
    accuracies = []
    for partition in range(cell.clients):
        cluster = by_partition.get(partition)
        if cluster not in models:
            record = cluster_arrays.get(cluster) if cluster is not None else None
            model = build_model(cell)
            model.load_state_dict((record or largest).to_torch_state_dict())
            models[cluster] = model
        accuracies.append(test(models[cluster], loaders(cell, partition)[1])[1])
    sizes = Counter(placed.values())
    return {"accuracy": round(sum(accuracies) / len(accuracies), 4), "ari": ari(cell, assignment),
            "clusters": len(sizes), "singletons": sum(1 for size in sizes.values() if size == 1),
            "placed": len(by_partition)}


def ari(cell: Cell, assignment: dict[str, int]) -> float | None:
    """ARI of the placed clients' clusters against their true groups (1.0 for one cluster in
    the IID control, whose clients form one group)."""
    groups = true_groups(cell)
    placed = sorted((partition_of(k), int(c)) for k, c in placed_clients(assignment).items())
    if not placed:
        return None
    return round(float(adjusted_rand_score([groups[p] for p, _ in placed], [c for _, c in placed])), 4)


def trainings(app: CountingApp, clients: int) -> dict:
    """Train messages per client: over the run (mean), and the most one client got in one round
    (the round: where a chained clustering step asks a stock client more than once)."""
    if not app.trainings:
        return {"trainings_per_client": 0.0, "peak_trainings": 0, "peak_round": None}
    (_, peak_round), peak = max(app.trainings.items(), key=lambda item: (item[1], -item[0][1]))
    return {"trainings_per_client": round(sum(app.trainings.values()) / clients, 2), "peak_trainings": peak,
            "peak_round": peak_round}


def snapshot(cell: Cell, strategy, lines: RoundLines) -> dict:
    """The run's clusters as they stand after a round (what a run of that many rounds would
    end with: no strategy's decisions read how many rounds are left), scored as at the end
    (``clusters_scored``), with the round's line."""
    driver = strategy.driver
    cluster_arrays = {c: protocol.to_array_record(m) for c, m in strategy.cluster_models().items()}
    line = lines.lines[-1] if lines.lines else None
    return {**clusters_scored(cell, cluster_arrays, driver.largest_cluster_record(),
                              driver.members.final_assignment()),
            "last_line": line, "last_decision": decision_text(line)}


def run_strategy(cell: Cell, name: str, rounds: int, judge_at: tuple[int, ...] = ()) -> dict:
    """One strategy on the cell: its row (see ``run_cell``); with ``judge_at``, the clusters as
    they stood after each of those rounds (before the last) under ``at_round`` (``snapshot``)."""
    cls = strategy_class(name)
    strategy = cls(fraction_train=cell.participation)
    needs = sorted(strategy.requires())
    # the oracle reads each client's true group, which only the helper's clients report
    client = "helper" if needs or name == "oracle" else "stock"
    app = SeededApp(helper_app if client == "helper" else stock_app, cell.seed)
    run_config = {"cell": cell.to_json(), "local-epochs": cell.local_epochs}
    grid = inprocess_grid(app, cell.clients, run_config=run_config, client_batching="off",
                          node_configs=[{"partition-id": i, "num-partitions": cell.clients} for i in range(cell.clients)])
    torch.manual_seed(cell.seed)
    model = build_model(cell)
    lines = RoundLines()
    logger = quiet_flower()
    logger.addHandler(lines)
    row = {"strategy": name, "client": client, "needs": needs, "rounds": rounds}
    judged = sorted(r for r in set(judge_at) if 0 < r < rounds)
    if judged:
        row["at_round"] = {}

    def judge(server_round: int, _result) -> bool:  # Flower's should_stop, asked after every round
        if server_round in judged:
            row["at_round"][str(server_round)] = snapshot(cell, strategy, lines)
        return False

    started = time.perf_counter()
    try:
        # as Flower's quickstart ServerApp: the model's arrays and the learning rate
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
                                train_config=ConfigRecord({"lr": cell.lr}), should_stop=judge if judged else None)
        error = None
    except Exception as exc:  # a refusal or a failure is the outcome, with its message
        result, error = None, f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        logger.removeHandler(lines)
    row["seconds"] = round(time.perf_counter() - started, 2)
    row.update(trainings(app, cell.clients))
    row["error"] = error
    row["last_line"] = lines.lines[-1] if lines.lines else None
    row["last_decision"] = decision_text(row["last_line"])
    row["first_decision"] = decision_text(lines.lines[0]) if lines.lines else ""
    if result is None:
        row.update(accuracy=None, ari=None, clusters=None, singletons=None, placed=0, bytes_up=None, bytes_down=None,
                   reported_accuracy=None, one_cluster_reason=None)
        return row
    last = result.evaluate_metrics_clientapp.get(rounds, {})
    reported = last.get("eval_acc", last.get("eval-accuracy"))
    row.update(clusters_scored(cell, result.cluster_arrays, result.arrays, result.assignment))
    row.update(bytes_up=int(result.traffic["bytes_up"]),
               bytes_down=int(result.traffic["bytes_down"] + result.traffic["eval_bytes_down"]
                              + result.traffic["probe_bytes_down"]),
               reported_accuracy=None if reported is None else round(float(reported), 4),
               one_cluster_reason=(result.clustering or {}).get("one_cluster_reason"))
    return row


def groups_help(fedavg_accuracy: float | None, oracle_accuracy: float | None, iid: bool) -> bool | None:
    """Whether finding the groups pays in this cell's rounds: the oracle (clusters given as the
    true groups) beats FedAvg by more than ``MAX_LOSS_PP`` points. An IID control always counts
    (its right answer, one cluster, is a clustering decision). None: no oracle row."""
    if iid:
        return True
    if fedavg_accuracy is None or oracle_accuracy is None:
        return None
    return 100 * (oracle_accuracy - fedavg_accuracy) > MAX_LOSS_PP


def verdict(row: dict, fedavg_accuracy: float | None, iid: bool) -> dict:
    """A row's verdict: ``recovered`` (ARI ≥ 0.9; in the IID control: one cluster),
    ``at_ceiling`` (FedAvg ≥ 0.95 and at most 1 pp lost), ``passes`` (either), ``loss_pp``
    (FedAvg's accuracy minus the row's, in points; > 0 is a loss), ``within_1pp``,
    ``one_cluster`` (IID controls only), and for a row that does not pass, ``reason_named``:
    whether its last round line carries the strategy's own words (or the run's error)."""
    accuracy, ari_value, clusters = row.get("accuracy"), row.get("ari"), row.get("clusters")
    loss_pp = None if accuracy is None or fedavg_accuracy is None else round(100 * (fedavg_accuracy - accuracy), 2)
    if iid:
        recovered = clusters == 1
    else:
        recovered = ari_value is not None and ari_value >= MIN_ARI
    at_ceiling = fedavg_accuracy is not None and fedavg_accuracy >= CEILING and loss_pp is not None \
        and loss_pp <= MAX_LOSS_PP
    passes = bool(accuracy is not None and (recovered or at_ceiling))
    out = {"recovered": bool(recovered and accuracy is not None), "at_ceiling": bool(at_ceiling), "passes": passes,
           "loss_pp": loss_pp, "within_1pp": None if loss_pp is None else loss_pp <= MAX_LOSS_PP,
           "one_cluster": (clusters == 1) if iid else None}
    out["reason_named"] = None if passes else bool(row.get("last_decision") or row.get("error"))
    return out


def judge_rows(rows: list[dict], iid: bool) -> bool | None:
    """Each row's verdict against FedAvg's row (and the oracle's, where there is one) in the
    same list; returns the cell's ``groups_help``."""
    by_name = {row["strategy"]: row for row in rows}
    fedavg_accuracy = by_name["fedavg"]["accuracy"]
    oracle_accuracy = by_name["oracle"]["accuracy"] if "oracle" in by_name else None
    for row in rows:
        row["fedavg_accuracy"] = fedavg_accuracy
        row["oracle_accuracy"] = oracle_accuracy
        row.update(verdict(row, fedavg_accuracy, iid))
    return groups_help(fedavg_accuracy, oracle_accuracy, iid)


def run_cell(cell: Cell, strategies=STRATEGIES, rounds: int = 10, out=None, earlier: dict | None = None,
             judge_at: tuple[int, ...] = ()) -> dict:
    """Every strategy on ``cell`` (FedAvg first: the others are judged against it); the cell's
    record: the cell, the rounds, one row per strategy with its verdict and the cell's
    ``groups_help``. ``earlier``: a record of the same cell and rounds whose rows are all kept
    (only the strategies it lacks run; the seconds add up). ``judge_at``: rounds before the
    last at which every row is judged too, against FedAvg's clusters of that round (each row's
    ``at_round``, the record's ``groups_help_at_round``). Written to ``out/cells/<seed>.json``
    when ``out`` is given."""
    kept = {r["strategy"]: r for r in earlier["rows"]} if earlier else {}
    strategies = ["fedavg", *dict.fromkeys(s for s in [*kept, *strategies] if s != "fedavg")]
    rows, started = [], time.perf_counter()
    for name in strategies:
        rows.append(kept[name] if name in kept else run_strategy(cell, name, rounds, judge_at))
    iid = cell.shift == "iid"
    helps = judge_rows(rows, iid)
    helps_at: dict[str, bool | None] = {}
    for r in sorted({r for row in rows for r in row.get("at_round", {})}, key=int):
        if not all(r in row.get("at_round", {}) for row in rows):
            continue  # a row of an earlier run without this round's clusters: not judged there
        snaps = [{"strategy": row["strategy"], "error": row["error"], **row["at_round"][r]} for row in rows]
        helps_at[r] = judge_rows(snaps, iid)
        for row, snap in zip(rows, snaps):
            row["at_round"][r] = {k: v for k, v in snap.items() if k not in ("strategy", "error")}
    seconds = round(time.perf_counter() - started + (earlier["seconds"] if earlier else 0.0), 1)
    record = {"cell": asdict(cell), "label": cell.label(), "rounds": rounds, "true_groups": true_groups(cell),
              "groups_help": helps, "seconds": seconds, "rows": rows}
    if helps_at:
        record["groups_help_at_round"] = helps_at
    if out is not None:
        import json
        from pathlib import Path

        folder = Path(out) / "cells"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{cell.seed}.json").write_text(json.dumps(record, indent=1) + "\n")
    return record
