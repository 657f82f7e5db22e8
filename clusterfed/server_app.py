"""ServerApp: run config -> RunConfig -> strategy.start(...) -> results in ``out-dir``."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from clusterfed.config import ConfigError, RunConfig, parse_config
from clusterfed.report.watchers import make_watchers, parse_log_to
from clusterfed.results import RunRecorder
from clusterfed.runner import CheckpointError
from clusterfed.runner import strategy_runner
from clusterfed.runner.preflight import Checked, check_model, preflight
from clusterfed.runner.transport import wait_for_nodes
from clusterfed.strategies.base import (
    CapabilityError,
    ClientFailureError,
    ClusteredStrategy,
    ModelMismatchError,
    StrategyParamsError,
)

NODE_WAIT_SECONDS = 120.0


def initial_arrays(config: RunConfig):
    """θ0: the seeded initial model every client and the server agree on."""
    arrays, problem = check_model(config)
    if problem is not None:
        raise ConfigError(problem)
    return arrays


def export_models(out: Path, models: dict[int, dict]) -> list[Path]:
    """``out/models/cluster-<id>.pt``: torch state dicts loadable into
    ``clusterfed.models.build_model(...)`` (see docs/checkpoints-faults.md)."""
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
    """Simulation: start only with exactly ``num-clients`` nodes; a mismatch is an error."""
    online = wait_for_nodes(grid, expected, wait_seconds)
    if online > expected:
        raise ConfigError(
            f"num-clients = {expected} but the federation has {online} SuperNodes; set num-clients to {online} "
            f"or start the simulation with {expected} nodes (--federation-config 'num-supernodes={expected}')"
        )
    if online < expected:
        raise ConfigError(
            f"num-clients = {expected} but only {online} SuperNodes joined within {wait_seconds:.0f}s; "
            f"set num-clients to {online} or start the missing nodes"
        )


def wait_for_min_clients(grid: Grid, needed: int, wait_timeout: float, poll_seconds: float = 1.0) -> int:
    """Deployment: wait until ``needed`` SuperNodes (the run's ``min-clients``, 0 meaning
    ``num-clients``) are up, at most ``wait_timeout`` seconds. More may be up, and more may
    join later. Returns how many were up."""
    online = wait_for_nodes(grid, needed, wait_timeout, poll_seconds)
    if online < needed:
        raise ConfigError(
            f"only {online} of the {needed} SuperNodes needed to start (min-clients, 0 = num-clients) "
            f"connected within wait-timeout = {wait_timeout:g} s; start more SuperNodes, "
            f"lower min-clients or raise wait-timeout"
        )
    return online


def run_server(grid: Grid, config: RunConfig | Checked, *, stream: TextIO | None = sys.stdout,
               node_wait_seconds: float = NODE_WAIT_SECONDS, deployment: bool = False,
               status: RunStatus | None = None) -> dict[str, Any]:
    """Everything a server does for one run; returns the summary written to summary.json.

    ``config``: the run config, checked here first (``preflight``: every problem the server
    can see, before any client is contacted; resume-from resolved, the checkpoint loaded), or
    ``preflight``'s ``Checked`` when the caller checked it already (not checked twice).
    ``deployment=False`` (simulation): the federation must have exactly ``num-clients``
    nodes, waited for up to ``node_wait_seconds``. ``deployment=True`` (``flwr run``
    against a SuperLink): start once ``min-clients`` nodes are up; nodes that join later
    are profiled and placed by the algorithm, unreachable ones are marked absent."""
    started = time.perf_counter()
    checked = config if isinstance(config, Checked) else preflight(config, announce=True)
    # the checked run is handed down as preflight made it: the strategy its Params, the driver
    # its RunOptions (with this app's recorder and deployment), start its arguments, the
    # clients (in the train and evaluate configs) the task spec
    config = checked.config
    if deployment:
        online = wait_for_min_clients(grid, config.min_clients or config.num_clients, config.wait_timeout)
        log(logging.INFO, "clusterfed: %d SuperNodes up, starting", online)
    else:
        wait_for_federation(grid, config.num_clients, node_wait_seconds)
    out = Path(config.out_dir).resolve()
    recorder = RunRecorder(out, checked.flat, stream=stream, watchers=make_watchers(parse_log_to(config.log_to)))
    strategy = config.build_strategy(recorder)
    start, driver = strategy.start, None
    if isinstance(strategy, ClusteredStrategy):  # the app hands its options to the driver, not to the strategy
        driver = strategy_runner.new_driver(strategy, replace(checked.options, recorder=recorder, deployment=deployment))
        start = driver.start
    if status is not None:
        recorder.on_round = status.heartbeat
        status.rounds = config.rounds
        status.devices = lambda: driver.members.device_report() if driver is not None else {}
    log(logging.INFO, "clusterfed: %s on %s/%s, %d clients, %d rounds -> %s", config.strategy, config.dataset,
        config.partitioner, config.num_clients, config.rounds, out)
    start(grid, checked.initial, **checked.start_args())
    clients = {"clients": driver.members.table()} if driver is not None else {}  # what a reason may quote
    summary = recorder.finish(time.perf_counter() - started, strategy.final_clusters(**clients))
    if hasattr(strategy, "cluster_models"):
        export_models(out, strategy.cluster_models())
    from clusterfed.plots import plot_run  # matplotlib only when a run has finished

    plot_run(out)
    return summary


class RunFailed(RuntimeError):
    """The ServerApp stopped; the message is the sentence in status.json. An Exception (not
    SystemExit): Flower's flwr-serverapp catches it, logs it, uploads the run's logs (what
    ``flwr run --stream`` shows), marks the run failed and exits 1. A SystemExit would skip
    all of that."""


def _now(seconds: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


ROUND_EXCHANGES = 4  # the most exchanges one round makes (FedClust's first: probe, train, evaluate, ...)


def stale_bounds(config: RunConfig) -> tuple[float, float]:
    """Seconds a ``"running"`` status.json stays true without a new round: (before this
    launch's first round, after a later one). Every exchange waits at most ``timeout`` (the
    first profile probe ``probe-timeout``); a launch first waits ``wait-timeout`` for its
    devices. The run keeper's stall bound is the same with its defaults."""
    later = ROUND_EXCHANGES * config.timeout
    first = later - config.timeout + max(config.timeout, config.probe_timeout) + config.wait_timeout
    return first, later


def _alive(pid: int) -> bool:
    """Whether process ``pid`` on this host still runs. A zombie (ended, not yet reaped,
    as under an init that does not reap) answers signal 0 but does not run."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        # /proc/<pid>/stat: "pid (name) state ...", and the name may hold spaces or ")"
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class RunStatus:
    """``out-dir/status.json``: ``"running"`` (with ``updated``, the time of the last round,
    as a heartbeat), ``"ok"`` or ``"failed"`` (with ``error``), ``ended`` (how the run ended,
    in a sentence), the devices ``absent`` and ``failing`` (docs/outputs.md), and who writes
    it (``pid``, ``host``). A ``"running"`` carries ``stale_after``: the time past which it is
    stale (no round can take that long, so its writer is dead or stuck). A ``"running"`` left
    by a run that is gone is replaced at start-up with a ``note`` saying so."""

    def __init__(self, out_dir: str | Path):
        self.path = Path(out_dir).resolve() / "status.json"
        self.started = _now()
        self.note = ""
        self.round: int | None = None
        self.rounds: int | None = None  # the rounds the run was asked for
        self.devices: Callable[[], dict[str, Any]] | None = None  # absent and failing devices, now
        # seconds a round may take: (this launch's first round, a later one); see stale_bounds
        self.bounds: tuple[float, float] | None = None

    def start(self) -> None:
        previous = self.read()
        if previous.get("status") == "running":
            pid, host = previous.get("pid"), previous.get("host")
            here = host == socket.gethostname()
            state = ("is still running" if here and isinstance(pid, int) and _alive(pid) and pid != os.getpid()
                     else "is no longer running" if here and isinstance(pid, int) else "was not seen to end")
            self.note = (f"a previous run in this folder (pid {pid} on {host}, last update "
                         f"{previous.get('updated', previous.get('time'))}) {state} and never wrote how it ended")
            log(logging.WARNING, "clusterfed: %s", self.note)
        self.write("running")

    def ended(self, status: str, error: str) -> str:
        """How the run ended, in one sentence."""
        done = (f"after round {self.round} of {self.rounds}" if self.rounds else f"after round {self.round}") \
            if self.round is not None else "before round 1 ended"
        if status == "ok":
            return f"completed all {self.rounds} rounds" if self.rounds and self.round == self.rounds else \
                f"completed {done}"
        return f"stopped {done}: {error}"

    def read(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def heartbeat(self, record: dict[str, Any]) -> None:
        self.round = int(record["round"])
        self.write("running")

    def write(self, status: str, error: str = "") -> None:
        now = time.time()
        body: dict[str, Any] = {"status": status, "time": _now(now), "started": self.started, "updated": _now(now),
                                "pid": os.getpid(), "host": socket.gethostname()}
        if status == "running" and self.bounds is not None:
            body["stale_after"] = _now(now + self.bounds[0 if self.round is None else 1])
        if self.round is not None:
            body["round"] = self.round
        if error:
            body["error"] = error
        if status != "running":
            body["ended"] = self.ended(status, error)
        if self.devices is not None:
            body.update({"absent": [], "failing": [], **self.devices()})
        if self.note:
            body["note"] = self.note
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(body, indent=2) + "\n")
            tmp.replace(self.path)
        except OSError as failure:
            log(logging.ERROR, "clusterfed: cannot write %s: %s", self.path, failure)


def write_status(out_dir: str | Path, status: str, error: str = "") -> None:
    """``out-dir/status.json`` written once (see ``RunStatus``)."""
    RunStatus(out_dir).write(status, error)


app = ServerApp()


def _fail(status: RunStatus, sentence: str, cause: BaseException | None = None) -> RunFailed:
    """Say why at ERROR (``flwr run --stream`` shows the ServerApp's log) and in status.json,
    in the same sentence."""
    log(logging.ERROR, "clusterfed: run failed: %s", sentence)
    status.write("failed", sentence)
    failure = RunFailed(sentence)
    failure.__cause__ = cause
    failure.__suppress_context__ = True
    return failure


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under ``flwr run`` against a SuperLink (deployment): the run config
    comes from pyproject.toml's [tool.flwr.app.config] plus --run-config overrides. How the
    run ended is written to ``out-dir/status.json`` and, when it failed, logged at ERROR and
    raised (``RunFailed``: flwr-serverapp then marks the run failed and exits 1)."""
    out_dir = str(context.run_config.get("out-dir", RunConfig().out_dir))
    status = RunStatus(out_dir)
    try:
        config = parse_config(dict(context.run_config))
    except ConfigError as error:
        raise _fail(status, f"bad run config: {error}") from None
    status.bounds = stale_bounds(config)
    status.start()
    # `flwr run` against a simulation federation hands the app Flower's in-memory grid: that
    # is a simulation (fixed federation); any other grid talks to a SuperLink
    deployment = not isinstance(grid, InMemoryGrid)
    try:
        run_server(grid, config, deployment=deployment, status=status)
    except (ConfigError, CheckpointError, StrategyParamsError, CapabilityError, ClientFailureError,
            ModelMismatchError) as error:
        raise _fail(status, str(error)) from None
    except Exception as error:
        raise _fail(status, f"{type(error).__name__}: {error}", error) from error
    except BaseException as error:  # stopped (a signal's SystemExit, Ctrl-C)
        status.write("failed", f"stopped: {type(error).__name__}: {error}")
        raise
    status.write("ok")
