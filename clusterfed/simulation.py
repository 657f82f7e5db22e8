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
from typing import Any, TextIO

from flwr.serverapp import Grid, ServerApp
from flwr.supercore.task_identity import TaskIdentity

from clusterfed.config import RunConfig

ENGINES = ("flower", "inprocess")


class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


def inprocess_grid(client_app, num_nodes: int, node_configs: list[dict] | None = None,
                   run_config: dict | None = None):
    """A Flower Grid whose ``num_nodes`` nodes call ``client_app`` in this process, one after
    another (no Ray, no SuperLink): for trying a ServerApp's ``main`` or a strategy's
    ``start`` quickly. Node i gets ``node_configs[i]`` (default ``partition-id = i``,
    ``num-partitions``); its node id is ``1000 + i``, so a stock ClientApp's client key is
    ``node-{1000 + i}``. ``run_config`` is what the ClientApps see as ``context.run_config``
    (under ``flwr run``: the pyproject's ``[tool.flwr.app.config]``)."""
    from clusterfed.runner.inprocess import InProcessGrid

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # what a SuperLink sets
    return InProcessGrid(client_app, num_nodes, node_configs=node_configs, run_config=run_config)


def make_server_app(config: RunConfig, stream: TextIO | None, result: dict[str, Any]) -> ServerApp:
    from clusterfed.server_app import run_server

    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context) -> None:
        result["summary"] = run_server(grid, config, stream=stream)

    return server_app


def simulate(config: RunConfig, *, engine: str = "flower", stream: TextIO | None = sys.stdout,
             client_app=None) -> dict[str, Any]:
    """Run one experiment; returns the summary (also written to ``out-dir``)."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r} is not one of {ENGINES}")
    if client_app is None:
        from clusterfed.client_app import app as client_app
    # in simulation the clients' data lives on this machine: a missing data set is
    # reported here, once, before any node starts (DatasetNotFoundError names the layout),
    # and so is every other problem the server can see (one ConfigError listing them all)
    from clusterfed.datasets import load_source
    from clusterfed.runner.preflight import preflight

    load_source(config.dataset, config.data_dir or None)
    if engine == "inprocess":  # run_server checks the run before it contacts a client
        from clusterfed.runner.inprocess import InProcessGrid
        from clusterfed.server_app import run_server

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        grid = InProcessGrid(client_app, config.num_clients, timeout=config.timeout)
        return run_server(grid, config, stream=stream, node_wait_seconds=0)
    preflight(config)  # before Ray starts; run_server checks again inside the ServerApp
    return _simulate_flower(config, stream, client_app)


def _simulate_flower(config: RunConfig, stream: TextIO | None, client_app) -> dict[str, Any]:
    import warnings

    from flwr.simulation import run_simulation

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
                server_app=make_server_app(config, stream, result),
                client_app=client_app,
                num_supernodes=config.num_clients,
                backend_config=backend_config,
            )
        finally:
            flwr_logger.removeFilter(quiet)
    if "summary" not in result:
        raise RuntimeError("the simulation ended without a result; see the log above")
    return result["summary"]
