"""One cell of the model matrix (a model, a shift, a strategy): the users' ServerApp ``main``
on an in-process grid of their ClientApp, scored against the true groups."""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch
from flwr.app import Context, Message, MessageType, RecordDict
from sklearn.metrics import adjusted_rand_score

from clusterfed.cluster_misses import cluster_miss_reason
from clusterfed.runner.membership import UNASSIGNED
from clusterfed.simulation import inprocess_grid
from model_matrix import client_app, helper_app, server_app
from model_matrix.data import NUM_GROUPS, SHIFTS, group_of
from model_matrix.models import MODELS, half_supported
from model_matrix.quickstart import MODEL_NAMES as QUICKSTART_MODELS
from model_matrix.quickstart import client_app as quickstart_client
from model_matrix.quickstart.task import SHIFT_VARIABLE

# the models written as outside users write them, listed after the first matrix's models so
# that a full run keeps those cells at the positions docs bind in cells.json
USER_MODELS = ("mobilenet", "frozen-backbone", "head-not-last", "lstm", "quickstart-lr0.1")
MODEL_NAMES = (*(m for m in (*MODELS, *QUICKSTART_MODELS) if m not in USER_MODELS), *USER_MODELS)
STRATEGY_NAMES = tuple(server_app.STRATEGIES)
HELPER_STRATEGIES = ("ifca", "adacfl-helper")
NUM_CLIENTS = 12
ROUNDS = 15
# CFL's family splits one cluster in two at a time, each once the cluster's model is
# near-stationary: three groups take two such splits
SPLITTING_ROUNDS = {"cfl": 25, "layercfl": 25, "hicfl": 25}


def rounds_for(strategy: str) -> int:
    return SPLITTING_ROUNDS.get(strategy, ROUNDS)

LEARNING_RATES = {"mlp": 0.05, "scalar-buffer": 0.05, "float16": 0.05, "resnet-bn": 0.05, "gru": 0.1,
                  "transformer": 0.05, "mobilenet": 0.05, "frozen-backbone": 0.05, "head-not-last": 0.05,
                  "lstm": 0.1, "quickstart": 0.02, "quickstart-lr0.1": 0.1}


@dataclass
class Cell:
    model: str
    shift: str
    strategy: str
    client: str = ""  # "stock", "helper", "quickstart" or "echo"
    rounds: int = ROUNDS
    num_clients: int = NUM_CLIENTS
    accuracy: float | None = None  # the last round's evaluation accuracy, averaged by num-examples
    ari: float | None = None  # the clusters against the true groups
    clusters: int | None = None
    reason: str | None = None  # the strategy's one-cluster or miss reason, or the error that stopped it
    seconds: float = 0.0
    compared: list | None = None  # the arrays the strategy's clustering compared, where it names them
    trainings: float | None = None  # train messages a client got, on average over the clients
    peak_trainings: float | None = None  # of those, the most in one round (where a chained clustering step shows)
    assignment: dict = field(default_factory=dict)
    accuracy_by_round: dict = field(default_factory=dict)

    def row(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("assignment", "accuracy_by_round")}


def client_for(model: str, strategy: str) -> str:
    if model in QUICKSTART_MODELS:
        return "quickstart"
    return "helper" if strategy in HELPER_STRATEGIES else "stock"


APPS = {"stock": client_app.app, "helper": helper_app.app, "quickstart": quickstart_client.app,
        "echo": client_app.echo_app}


class CountingApp:
    """A ClientApp that counts the train messages its nodes get (a stock client trains once
    per train message) before passing each message on: ``trainings[(node, round)]``."""

    def __init__(self, app):
        self.app, self.trainings = app, Counter()

    def __call__(self, message: Message, context: Context) -> Message:
        if message.metadata.message_type == MessageType.TRAIN:
            config = message.content.config_records.get("config", {})
            self.trainings[(context.node_id, int(config.get("server-round", 0)))] += 1
        return self.app(message, context)

    def per_client(self, num_clients: int) -> tuple[float, float]:
        """Train messages per client over the run, and in the round that had the most."""
        by_round = Counter()
        for (_, server_round), count in self.trainings.items():
            by_round[server_round] += count
        peak = max(by_round.values(), default=0)
        return round(sum(by_round.values()) / num_clients, 2), round(peak / num_clients, 2)


def partition_of(key: str) -> int:
    """A client key's partition: a stock client is keyed ``node-<1000 + i>`` on the in-process
    grid, the helper's by its partition id."""
    number = int(re.search(r"(\d+)$", key).group(1))
    return number - 1000 if key.startswith("node-") else number


def run_config(model: str, shift: str, strategy: str, rounds: int, num_clients: int) -> dict:
    return {"model": model, "shift": shift, "strategy": strategy, "num-server-rounds": rounds,
            "num-groups": NUM_GROUPS, "num-partitions": num_clients, "learning-rate": LEARNING_RATES[model],
            "local-epochs": 1, "batch-size": 16, "seed": 0}


def run_cell(model: str, shift: str, strategy: str, *, rounds: int = ROUNDS, num_clients: int = NUM_CLIENTS,
             client: str | None = None) -> tuple[Cell, object]:
    """Run one cell; returns the scored cell and the strategy's result (None if it raised)."""
    if model not in MODEL_NAMES or shift not in SHIFTS or strategy not in STRATEGY_NAMES:
        raise ValueError(f"no cell {model} × {shift} × {strategy}")
    cell = Cell(model, shift, strategy, client or client_for(model, strategy), rounds, num_clients)
    if model == "float16" and not half_supported():
        cell.reason = "this CPU's torch does not train float16"
        return cell, None
    config = run_config(model, shift, strategy, rounds, num_clients)
    app = CountingApp(APPS[cell.client])
    grid = inprocess_grid(app, num_clients, run_config=config,
                          node_configs=[{"partition-id": i, "num-partitions": num_clients} for i in range(num_clients)])
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=config)
    started, previous_shift = time.perf_counter(), os.environ.get(SHIFT_VARIABLE)
    os.environ[SHIFT_VARIABLE] = shift
    try:
        result = server_app.main(grid, context)
    except Exception as error:  # a refusal or a failure is the cell's outcome, with its message
        cell.reason, result = f"{type(error).__name__}: {error}", None
    finally:
        if previous_shift is None:
            del os.environ[SHIFT_VARIABLE]
        else:
            os.environ[SHIFT_VARIABLE] = previous_shift
        cell.seconds = round(time.perf_counter() - started, 2)
        cell.trainings, cell.peak_trainings = app.per_client(num_clients)
    if result is not None:
        score(cell, result)
    return cell, result


def placed_clients(assignment: dict[str, int]) -> dict[str, int]:
    """The clients the run placed: ``result.assignment`` names every client it knows, those
    never placed (never sampled, or their replies lost) as ``UNASSIGNED``, which is no cluster."""
    return {key: cluster for key, cluster in assignment.items() if int(cluster) != UNASSIGNED}


def score(cell: Cell, result) -> None:
    last = result.evaluate_metrics_clientapp.get(cell.rounds, {})
    accuracy = last.get("eval_acc", last.get("eval-accuracy"))
    cell.accuracy = None if accuracy is None else round(float(accuracy), 4)
    cell.accuracy_by_round = {rnd: round(float(m.get("eval_acc", m.get("eval-accuracy"))), 4)
                              for rnd, m in result.evaluate_metrics_clientapp.items()
                              if m.get("eval_acc", m.get("eval-accuracy")) is not None}
    clustering = getattr(result, "clustering", None) or {}
    cell.assignment = {partition_of(key): int(cluster) for key, cluster in placed_clients(result.assignment).items()}
    cell.clusters = len(set(cell.assignment.values()))
    if clustering.get("training_failed") or cell.clusters <= 1:
        cell.reason = clustering.get("training_failed") or clustering.get("one_cluster_reason")
    partitions = sorted(cell.assignment)
    if partitions:  # else nobody was placed: no clusters to score
        cell.ari = round(float(adjusted_rand_score([group_of(p) for p in partitions],
                                                   [cell.assignment[p] for p in partitions])), 4)
    layers = clustering.get("layers")
    cell.compared = list(layers.get("names", []) if isinstance(layers, dict) else layers) if layers else None
    if cell.reason is None:
        cell.reason = miss_reason(cell, result, clustering)


def miss_reason(cell: Cell, result, clustering: dict) -> str | None:
    """For several clusters that miss the groups: the strategy's count basis, as a run's summary
    says it, else the clusters against the groups and the arrays compared."""
    true_groups = {key: group_of(partition_of(key)) for key in result.assignment}
    miss = cluster_miss_reason({"final_ari": cell.ari}, {**clustering, "assignment": dict(result.assignment)},
                               true_groups)
    if miss:
        return miss[1]
    if cell.clusters and cell.clusters > 1 and cell.ari is not None and cell.ari < MIN_ARI:
        return (f"{cell.clusters} clusters for {NUM_GROUPS} true groups (ARI {cell.ari:.2f}); the strategy states no "
                f"basis" + (f"; compared: {', '.join(cell.compared)}" if cell.compared else ""))
    return None


def one_thread() -> None:
    """Tiny models: more threads only contend on shared cores."""
    torch.set_num_threads(1)


MIN_ARI = 0.9  # the clusters recover the groups
MIN_GAIN = 0.05  # a clear margin over FedAvg's final accuracy
CEILING = 0.95  # FedAvg at or above this: no margin is possible; the cell must only not lose


def verdict(cell: Cell, fedavg_accuracy: float | None) -> str:
    """``holds``, ``FedAvg at ceiling`` (nothing to win; the cell loses at most 0.02),
    ``refused: needs the client helper``, ``skipped`` or ``fails``: the matrix's criterion."""
    if cell.strategy == "fedavg":
        return "reference"
    if cell.accuracy is None:
        if cell.reason and "clusterfed.client" in cell.reason and cell.client != "helper":
            return "refused: needs the client helper"
        return "skipped" if cell.reason and "float16" in cell.reason else "fails"
    if fedavg_accuracy is not None and fedavg_accuracy >= CEILING:
        return "FedAvg at ceiling" if cell.accuracy >= fedavg_accuracy - 0.02 else "fails"
    if cell.ari is not None and cell.ari >= MIN_ARI and fedavg_accuracy is not None \
            and cell.accuracy >= fedavg_accuracy + MIN_GAIN:
        return "holds"
    return "fails"
