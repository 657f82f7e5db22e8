"""Running an experiment's grids: ``clusterfed experiment FILE`` (and ``clusterfed compare``, a grid
given on the command line).

Every run of every grid is built and checked (run-config schema, then ``preflight``: partition
feasibility, out folder, model) before the first run starts, and each run gets its checked
config (``Checked``), so no run parses or checks it again; then all runs share one pool of ``workers`` processes
(in-process engine), the longest first. Per grid, ``<out>/<folder>/`` gets ``comparison.csv``,
``comparison.md``, the two figures and ``manifest.json``; the runs' own folders are
``<out>/<folder>/<label>/seed<s>/``. ``<out>/`` gets ``timing.json`` (the profile, the runs,
the wall time, per grid its rounds, seeds and summed run time) and ``manifest.json``. For one
seed every strategy sees the same clients: the partition depends only on the data keys and
the seed.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TextIO

from clusterfed.config import ConfigError, RunConfig, parse_config
from clusterfed.datasets.shapes import DATASET_SHAPES
from clusterfed.experiments.comparison import CSV_COLUMNS, run_row, write_outputs
from clusterfed.experiments.manifest import config_hash, start_manifest, write_manifest
from clusterfed.experiments.spec import Experiment, Grid, Variant
from clusterfed.experiments.sweeps import sweep_grids, write_sweep
from clusterfed.runner.preflight import Checked, preflight_runs
from clusterfed.simulation import simulate


class Progress:
    """A one-line progress bar over the runs on ``stream`` (stderr)."""

    def __init__(self, total: int, stream: TextIO | None = sys.stderr, width: int = 24):
        self.total, self.done, self.stream, self.width = total, 0, stream, width
        self.started = time.perf_counter()

    def step(self, label: str) -> None:
        self.done += 1
        if self.stream is None:
            return
        filled = round(self.width * self.done / self.total)
        elapsed = time.perf_counter() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        print(f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {label} "
              f"({elapsed:.0f} s, ~{eta:.0f} s left)", file=self.stream, flush=True)


def _values(variant: Variant, base: dict[str, Any], seed: int, out: Path) -> dict[str, Any]:
    params = {f"{variant.strategy}.{k}": v for k, v in variant.params.items()}
    return {**base, **params, "strategy": variant.strategy, "seed": seed,
            "out-dir": str(out / variant.label / f"seed{seed}")}


def build_grid(grid: Grid, out: Path) -> list[tuple[str, Checked]]:
    """(label, checked config) of every run of ``grid`` under ``out``: the schema and
    ``preflight``, once per run (each partition split once), all problems in one ConfigError."""
    runs, problems = [], []
    for variant in grid.variants:
        for seed in grid.seeds:
            try:
                runs.append((variant.label, parse_config(_values(variant, grid.values, seed, out))))
            except ConfigError as error:
                problems.append(f"{grid.folder or 'grid'} / {variant.label}: {error}" if grid.folder else str(error))
    if problems:
        raise ConfigError("; ".join(dict.fromkeys(problems)))
    return list(zip([label for label, _ in runs], preflight_runs([config for _, config in runs])))


def run_one(checked: Checked, engine: str, label: str | None = None) -> dict[str, Any]:
    """One run of a grid, from its checked config (``build_grid``); its comparison row."""
    logging.getLogger("flwr").setLevel(logging.WARNING)  # the progress line reports each run
    simulate(checked, engine=engine, stream=None)
    return run_row(Path(checked.config.out_dir), label)


def run_configs(runs: list[tuple[str, Checked]], *, engine: str = "inprocess", workers: int = 1,
                progress: Progress | None = None,
                runner: Callable[..., dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Run every (label, checked config) (``workers`` processes for the in-process engine); rows in order."""
    runner = runner or run_one
    if engine != "inprocess" and workers > 1:
        raise ConfigError("--workers > 1 needs --engine inprocess (Flower's engine uses every core itself)")
    rows: dict[int, dict[str, Any]] = {}

    def done(index: int, row: dict[str, Any]) -> None:
        rows[index] = row
        if progress is not None:
            acc = row["final_accuracy"]
            result = (f"FAILED: {row['error']}" if row.get("error") else
                      f"acc {'n/a' if acc is None else f'{acc:.3f}'} ARI {row['final_ari'] or 0:.2f}")
            progress.step(f"{row['strategy']} seed {row['seed']}: {result}")

    def failed(index: int, error: BaseException) -> dict[str, Any]:
        label, checked = runs[index]
        return {**dict.fromkeys(CSV_COLUMNS), "strategy": label, "seed": checked.config.seed,
                "error": f"{type(error).__name__}: {error}"}

    if workers <= 1:
        for index, (label, checked) in enumerate(runs):
            try:
                row = runner(checked, engine, label)
            except Exception as error:  # noqa: BLE001 - one failed run must not lose the others
                row = failed(index, error)
            done(index, row)
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(runner, checked, engine, label): i for i, (label, checked) in enumerate(runs)}
            for future in as_completed(futures):
                try:
                    row = future.result()
                except Exception as error:  # noqa: BLE001
                    row = failed(futures[future], error)
                done(futures[future], row)
    return [rows[i] for i in range(len(runs))]


class RunsFailed(RuntimeError):
    """Some runs raised; every grid's tables were still written (the failed runs' rows are empty)."""


def cost(config: RunConfig) -> float:
    """Rough relative cost of a run, to start the longest first."""
    small_images = DATASET_SHAPES[config.dataset][0][1:] == (8, 8)  # the digits CNN
    per_round = (1.0 if small_images else 8.0) * config.num_clients / 20 * config.fraction_train
    return per_round * config.rounds


def _grid_title(grid: Grid, first: RunConfig) -> str:
    return grid.title or (f"{first.dataset} / {grid.setting or first.partitioner}, {first.num_clients} clients, "
                          f"{first.rounds} rounds")


def _grid_record(grid: Grid, runs: list[tuple[str, Checked]]) -> dict[str, Any]:
    return {"folder": grid.folder, "setting": grid.setting, "values": grid.values, "seeds": grid.seeds,
            "strategies": [{"label": v.label, "strategy": v.strategy, "params": v.params} for v in grid.variants],
            "runs": [{k: v for k, v in c.config.to_flower().items() if k != "out-dir"} | {"label": label}
                     for label, c in runs]}


def plan(experiment: Experiment) -> list[tuple[Grid, list[tuple[str, Checked]]]]:
    """Every grid's runs, checked; one error naming every grid that is wrong."""
    planned, problems = [], []
    for grid in experiment.grids:
        try:
            planned.append((grid, build_grid(grid, experiment.out / grid.folder)))
        except ConfigError as error:
            problems.append(str(error))
    if problems:
        head = "" if experiment.command_line else f"experiment {experiment.source} refused: "
        raise ConfigError(head + "; ".join(problems))
    return planned


def run_grids(planned: list[tuple[Grid, list[tuple[str, Checked]]]], out: Path, manifest: dict[str, Any], *,
              engine: str, workers: int, stream: TextIO | None,
              runner: Callable[..., dict[str, Any]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Run the planned grids in one pool; write each grid folder's tables, figures and manifest."""
    flat = [(grid.folder, label, checked) for grid, runs in planned for label, checked in runs]
    order = sorted(range(len(flat)), key=lambda i: -cost(flat[i][2].config))
    rows = run_configs([flat[i][1:] for i in order], engine=engine, workers=workers,
                       progress=Progress(len(flat), stream), runner=runner)
    by_index = dict(zip(order, rows))
    out_rows: dict[str, list[dict[str, Any]]] = {}
    for grid, runs in planned:
        grid_rows = [by_index[i] for i, (folder, _, _) in enumerate(flat) if folder == grid.folder]
        folder = out / grid.folder
        write_outputs(grid_rows, folder, _grid_title(grid, runs[0][1].config))
        record = _grid_record(grid, runs)
        write_manifest(folder, {**manifest, "config_hash": config_hash(record)}, grid=record)
        out_rows[grid.folder] = grid_rows
    return out_rows


def run_experiment(experiment: Experiment, *, workers: int = 1, engine: str = "inprocess",
                   stream: TextIO | None = sys.stderr, command: list[str] | None = None,
                   runner: Callable[..., dict[str, Any]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Check every grid, run them, write the result folders; returns the rows per grid folder."""
    for folder, why in experiment.skipped.items():
        print(f"{folder} skipped: {why} (pass --data-dir)", file=sys.stderr)
    planned = plan(experiment)
    if not planned:
        raise ConfigError(f"experiment {experiment.source}: nothing to run")
    manifest = start_manifest(experiment.resolved(), command)
    runs = sum(len(r) for _, r in planned)
    if stream is not None:
        print(f"{experiment.name}: {len(planned)} grids, {runs} runs, {workers} workers", file=stream)
    started = time.perf_counter()
    rows = run_grids(planned, experiment.out, manifest, engine=engine, workers=workers, stream=stream, runner=runner)
    for sweep in experiment.sweeps:
        of, targets, grids = sweep_grids(sweep, experiment, [g for g, _ in planned])
        sweep_planned = [(grid, build_grid(grid, experiment.out / grid.folder)) for grid in grids]
        sweep_rows = run_grids(sweep_planned, experiment.out, manifest, engine=engine, workers=workers, stream=stream,
                               runner=runner)
        write_sweep(sweep, experiment.out, of, targets, sweep_rows, manifest)
        rows.update(sweep_rows)
    seconds = time.perf_counter() - started
    failures = {f"{folder}/{r['strategy']}/seed{r['seed']}": r["error"]
                for folder, grid_rows in rows.items() for r in grid_rows if r.get("error")}
    write_timing(experiment, planned, rows, seconds, workers, failures)
    write_manifest(experiment.out, manifest, experiment=experiment.source, profile=experiment.profile,
                   skipped=experiment.skipped, failures=failures)
    if stream is not None:
        print(f"{sum(len(r) for r in rows.values())} runs in {seconds / 60:.1f} min; results under {experiment.out}",
              file=stream)
    if failures:
        raise RunsFailed(f"{len(failures)} run(s) failed (tables written without them): "
                         + "; ".join(f"{where}: {why}" for where, why in failures.items()))
    return rows


def write_timing(experiment: Experiment, planned, rows: dict[str, list[dict]], seconds: float, workers: int,
                 failures: dict[str, str] | None = None) -> None:
    """``<out>/timing.json``: profile, runs, wall time; per grid its rounds, seeds and summed run time.
    A partial re-run (``--only``) keeps the record of the other grids."""
    path = experiment.out / "timing.json"
    runs = sum(len(r) for r in rows.values())
    timing = {"profile": experiment.profile, "experiment": experiment.source, "workers": workers, "runs": runs,
              "wall_seconds": round(seconds, 1), "settings": {}}
    partial = experiment.partial and path.exists()
    if partial:
        timing = json.loads(path.read_text())
        timing.setdefault("partial_reruns", []).append({"only": [g.folder for g, _ in planned], "runs": runs,
                                                        "wall_seconds": round(seconds, 1)})
    for folder, grid_rows in rows.items():
        timing["settings"][folder] = {
            "runs": len(grid_rows), "rounds": int(max(r["rounds"] or 0 for r in grid_rows)),  # 0: every run failed
            "seeds": sorted({int(r["seed"]) for r in grid_rows}),
            "run_seconds_sum": round(sum(r["wall_seconds"] or 0 for r in grid_rows), 1)}
    if experiment.skipped:
        timing["skipped"] = experiment.skipped
    if failures:
        timing["failures"] = failures
    path.write_text(json.dumps(timing, indent=1) + "\n")
