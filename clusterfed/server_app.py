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

from clusterfed.config import ConfigError, RunConfig, parse_config
from clusterfed.results import RunRecorder
from clusterfed.runner import CheckpointError, build_runner
from clusterfed.runner.preflight import check_model, preflight

NODE_WAIT_SECONDS = 120.0


def initial_arrays(config: RunConfig):
    """θ0: the seeded initial model every client and the server agree on."""
    arrays, problem = check_model(config)
    if problem is not None:
        raise ConfigError(problem)
    return arrays


def export_models(out: Path, config: RunConfig, models: dict[int, dict]) -> list[Path]:
    """``out/models/cluster-<id>.pt``: torch state dicts loadable into
    ``clusterfed.models.build_model(...)`` (see the README)."""
    import torch

    folder = out / "models"
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("cluster-*.pt"):  # a resumed run's earlier export: clusters may have split since
        stale.unlink()
    paths = []
    for cluster, arrays in sorted(models.items()):
        path = folder / f"cluster-{cluster}.pt"
        torch.save({name: torch.from_numpy(value.copy()) for name, value in arrays.items()}, path)
        paths.append(path)
    return paths


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
    initial = preflight(config)  # every problem the server can see, before any client is contacted
    wait_for_federation(grid, config.num_clients, node_wait_seconds)
    out = Path(config.out_dir).resolve()
    recorder = RunRecorder(out, config.to_flower(), stream=stream)
    runner = build_runner(config, recorder)
    log(logging.INFO, "clusterfed: %s on %s/%s, %d clients, %d rounds -> %s", config.strategy, config.dataset,
        config.partitioner, config.num_clients, config.rounds, out)
    runner.start(grid, initial, num_rounds=config.rounds, timeout=config.timeout)
    algorithm = getattr(runner, "algorithm", runner)
    summary = recorder.finish(time.perf_counter() - started, algorithm.final_clusters())
    if hasattr(algorithm, "cluster_models"):
        export_models(out, config, algorithm.cluster_models())
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
    try:
        run_server(grid, config)
    except (ConfigError, CheckpointError) as error:
        log(logging.ERROR, "%s", error)
        raise SystemExit(f"clusterfed: {error}") from None
