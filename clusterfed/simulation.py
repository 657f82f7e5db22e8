"""Run one experiment in simulation: Flower's simulation engine (Ray) or in-process.

``engine = "flower"`` runs the apps on Flower's Simulation Engine (virtual SuperNodes in
Ray actors), the path ``flwr run`` takes. ``engine = "inprocess"`` runs the same
ServerApp logic and ClientApp against ``clusterfed.runner.inprocess.InProcessGrid``, with
no Ray: the clients run one after another in this process. A test checks both engines
give the same numbers.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import tomllib
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from flwr.app import Context, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.task_identity import TaskIdentity

import clusterfed
from clusterfed.config import RunConfig
from clusterfed.datasets import load_source
from clusterfed.runner.inprocess import InProcessGrid
from clusterfed.runner.preflight import Checked, preflight

ENGINES = ("flower", "inprocess")


class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


def inprocess_grid(client_app, num_nodes: int, node_configs: list[dict] | None = None,
                   run_config: dict | None = None, client_batching: str = "auto"):
    """A Flower Grid whose ``num_nodes`` nodes call ``client_app`` in this process (no Ray,
    no SuperLink): for trying a ServerApp's ``main`` or a strategy's ``start`` quickly.
    ``client_batching``: ``auto`` trains the clients of a round together where the app lets
    it (``clusterfed.runner.batched_clients``), ``off`` one after another. Node i gets ``node_configs[i]`` (default ``partition-id = i``,
    ``num-partitions``); its node id is ``1000 + i``, so a stock ClientApp's client key is
    ``node-{1000 + i}``. ``run_config`` is what the ClientApps see as ``context.run_config``
    (under ``flwr run``: the pyproject's ``[tool.flwr.app.config]``)."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # what a SuperLink sets
    return InProcessGrid(client_app, num_nodes, node_configs=node_configs, run_config=run_config,
                         client_batching=client_batching)


def make_server_app(checked: Checked, stream: TextIO | None, result: dict[str, Any]) -> ServerApp:
    """A ServerApp running the run ``preflight`` checked (not checked again inside it)."""
    from clusterfed.server_app import run_server

    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context) -> None:
        result["summary"] = run_server(grid, checked, stream=stream)

    return server_app


def simulate(config: RunConfig | Checked, *, engine: str = "flower", stream: TextIO | None = sys.stdout,
             client_app=None) -> dict[str, Any]:
    """Run one experiment; returns the summary (also written to ``out-dir``). ``config``: the
    run config, checked here once (``preflight``) before any node starts, or ``preflight``'s
    ``Checked`` when the caller checked it already (an experiment's grid: not checked twice).
    What is checked is handed down as it is: the grid, the ServerApp and the driver take their
    parts of it."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r} is not one of {ENGINES}")
    if client_app is None:
        from clusterfed.client_app import app as client_app
    run = config.config if isinstance(config, Checked) else config
    # in simulation the clients' data lives on this machine: a missing data set is
    # reported here, once, before any node starts (DatasetNotFoundError names the layout),
    # and so is every other problem the server can see (one ConfigError listing them all)
    load_source(run.dataset, run.data_dir or None)
    checked = config if isinstance(config, Checked) else preflight(config, announce=True)  # before a node starts
    if engine == "inprocess":
        from clusterfed.server_app import run_server

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        return run_server(InProcessGrid.for_run(client_app, checked), checked, stream=stream, node_wait_seconds=0)
    return _simulate_flower(checked, stream, client_app)


def _simulate_flower(checked: Checked, stream: TextIO | None, client_app) -> dict[str, Any]:
    from flwr.simulation import run_simulation

    config = checked.config

    result: dict[str, Any] = {}
    cpus = os.cpu_count() or 1
    gpus = 0.0
    if config.device != "cpu":
        import torch

        if torch.cuda.is_available():
            gpus = 1.0 / max(cpus, 1)  # share the GPU between concurrent virtual clients
    backend_config = {
        "client_resources": {"num_cpus": 1, "num_gpus": gpus},
        "init_args": {"num_cpus": cpus, "num_gpus": 1 if gpus else 0},
    }
    # run_simulation is Flower's Python entry to its simulation engine; its deprecation
    # notice points users at `flwr run`, which also works with this app (README)
    quiet = _DropMessages("DEPRECATED FEATURE", "This is a deprecated feature", "default simulated SuperNodes")
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addFilter(quiet)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            run_simulation(
                server_app=make_server_app(checked, stream, result),
                client_app=client_app,
                num_supernodes=config.num_clients,
                backend_config=backend_config,
            )
        finally:
            flwr_logger.removeFilter(quiet)
    if "summary" not in result:
        raise RuntimeError("the simulation ended without a result; see the log above")
    return result["summary"]


def run_app_inprocess(app_dir: str | Path, client_app, main: Callable, run: Callable,
                      group_of: Callable[[int, int, Mapping[str, Any]], int], strategy: Any = None,
                      rounds: int | None = None):
    """Run a Flower app of ``app_dir`` in this process, without Ray or a SuperLink: its
    ServerApp ``main(grid, context)`` (``strategy`` None) or ``run(strategy, grid, run_config)``
    with ``strategy`` (a strategy object, or a public clusterfed class name built with its
    defaults), on an ``inprocess_grid`` of the pyproject's ``num-supernodes`` nodes calling
    ``client_app``, node i holding partition i. The run config is the pyproject's
    ``[tool.flwr.app.config]``, with ``num-server-rounds = rounds`` if given.

    Returns (result, ARI of the final clusters against ``group_of(partition, num_partitions,
    run_config)``). A client is looked up by its partition id (the client helper's key), else
    as a stock ClientApp's ``node-<node id>``."""
    from sklearn.metrics import adjusted_rand_score

    flwr = tomllib.loads((Path(app_dir) / "pyproject.toml").read_text())["tool"]["flwr"]
    run_config = dict(flwr["app"]["config"])
    nodes = int(flwr["federations"][flwr["federations"]["default"]]["options"]["num-supernodes"])
    if rounds is not None:
        run_config["num-server-rounds"] = rounds
    grid = inprocess_grid(client_app, nodes,
                          node_configs=[{"partition-id": i, "num-partitions": nodes} for i in range(nodes)])
    if strategy is None:
        result = main(grid, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config))
    else:
        strategy = getattr(clusterfed, strategy)(fraction_train=1.0) if isinstance(strategy, str) else strategy
        result = run(strategy, grid, run_config)
    clusters = [result.assignment.get(str(i), result.assignment.get(f"node-{node}"))
                for i, node in enumerate(grid.node_ids)]
    return result, adjusted_rand_score([group_of(i, nodes, run_config) for i in range(nodes)], clusters)


def run_app_inprocess_main(simulate: Callable, groups: str, argv: list[str] | None = None) -> None:
    """``python run_inprocess.py [STRATEGY [ROUNDS]]``: ``simulate(STRATEGY, ROUNDS)`` (e.g. a
    ``run_app_inprocess`` call), then the ARI against ``groups`` (what the planted groups are
    called) and the wall time."""
    args = sys.argv[1:] if argv is None else argv
    start = time.perf_counter()
    _, ari = simulate(*args[:1], *map(int, args[1:2]))
    print(f"ARI against {groups}: {ari:.2f}   ({time.perf_counter() - start:.1f} s)")
