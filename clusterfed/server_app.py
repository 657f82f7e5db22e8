"""ServerApp: run config -> RunConfig -> strategy.start(...) -> results in ``out-dir``."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from clusterfed import protocol
from clusterfed.config import ConfigError, RunConfig, parse_config
from clusterfed.datasets.shapes import DATASET_SHAPES
from clusterfed.models import build_model
from clusterfed.results import RunRecorder
from clusterfed.strategies import build_strategy
from clusterfed.training import state_to_numpy

NODE_WAIT_SECONDS = 120.0


def initial_arrays(config: RunConfig):
    shape, num_classes = DATASET_SHAPES[config.dataset]
    model = build_model(config.model, config.dataset, shape, num_classes, config.seed)
    return protocol.to_array_record(state_to_numpy(model))


def wait_for_federation(grid: Grid, expected: int, wait_seconds: float = NODE_WAIT_SECONDS) -> None:
    """Start only with exactly ``num-clients`` nodes; a mismatch is an error, not a surprise."""
    deadline = time.monotonic() + wait_seconds
    while True:
        online = len(list(grid.get_node_ids()))
        if online > expected:
            raise ConfigError(
                f"num-clients = {expected} but the federation has {online} SuperNodes; set num-clients to {online} "
                f"or start the simulation with {expected} nodes (--federation-config 'num-supernodes={expected}')"
            )
        if online == expected:
            return
        if time.monotonic() > deadline:
            raise ConfigError(
                f"num-clients = {expected} but only {online} SuperNodes joined within {wait_seconds:.0f}s; "
                f"set num-clients to {online} or start the missing nodes"
            )
        time.sleep(1.0)


def run_server(grid: Grid, config: RunConfig, *, stream: TextIO | None = sys.stdout,
               node_wait_seconds: float = NODE_WAIT_SECONDS) -> dict[str, Any]:
    """Everything a server does for one run; returns the summary written to summary.json."""
    started = time.perf_counter()
    wait_for_federation(grid, config.num_clients, node_wait_seconds)
    out = Path(config.out_dir).resolve()
    recorder = RunRecorder(out, config.to_flower(), stream=stream)
    strategy = build_strategy(config, recorder)
    log(logging.INFO, "clusterfed: %s on %s/%s, %d clients, %d rounds -> %s", config.strategy, config.dataset,
        config.partitioner, config.num_clients, config.rounds, out)
    strategy.start(grid, initial_arrays(config), num_rounds=config.rounds, timeout=config.timeout)
    summary = recorder.finish(time.perf_counter() - started, strategy.final_clusters())
    from clusterfed.plots import plot_run  # matplotlib only when a run has finished

    plot_run(out)
    return summary


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under ``flwr run`` and in deployment: the run config comes from
    pyproject.toml's [tool.flwr.app.config] plus --run-config overrides."""
    try:
        config = parse_config(dict(context.run_config))
    except ConfigError as error:
        log(logging.ERROR, "bad run config: %s", error)
        raise SystemExit(f"clusterfed: bad run config: {error}") from None
    run_server(grid, config)
