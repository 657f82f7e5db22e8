"""``clusterfed compare``: every strategy × seed on the same data, one table and two figures.

The partition depends only on the data keys and the seed, so for one seed every strategy
sees the same clients. Every configuration of the grid is built and checked before the
first run starts (an unknown strategy, a bad key or an infeasible partition stops the
command with one message). Results, under ``out``:

- ``<strategy>/seed<s>/`` — each run's own folder (``rounds.jsonl``, ``summary.json``, ...);
- ``comparison.csv`` — one row per strategy × seed (``CSV_COLUMNS``);
- ``comparison.md`` — mean ± std over seeds per strategy, the best value of each column
  in bold;
- ``accuracy_vs_round.png``, ``accuracy_vs_mb.png`` — all strategies on one plot each,
  mean over seeds with a ± std band (``clusterfed.plots.compare``).
"""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from clusterfed.config import ConfigError, RunConfig, parse_config

# (column, header in comparison.md, which way is better: +1 higher, -1 lower, 0 no best)
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("final_accuracy", "final acc", +1),
    ("best_accuracy", "best acc", +1),
    ("accuracy_std", "acc std over clients", -1),
    ("final_ari", "ARI", +1),
    ("num_clusters", "clusters", 0),
    ("rounds_to_target", "rounds to target", -1),
    ("mb_to_target", "MB to target", -1),
    ("mb_up", "MB up", -1),
    ("mb_down", "MB down", -1),
    ("transmissions", "transmissions", -1),
    ("wall_seconds", "wall s", -1),
)
# first_clustered_round: the first round whose assignment has more than one cluster (empty if never)
CSV_COLUMNS = ("strategy", "seed", *(name for name, _, _ in COLUMNS), "first_clustered_round", "rounds",
               "target_accuracy")


def parse_list(text: str, kind: type = str) -> list:
    return [kind(part.strip()) for part in text.split(",") if part.strip()]


def check_strategies(names: Iterable[str]) -> None:
    """One error naming every unknown strategy and the known ones."""
    from clusterfed.strategies import REGISTRY

    names = list(names)
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise ConfigError(f"unknown strateg{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))}; "
                          f"available: {', '.join(REGISTRY)}")
    if not names:
        raise ConfigError("no strategy given")
    if len(set(names)) != len(names):
        raise ConfigError(f"a strategy is named twice in {','.join(names)}")


def build_grid(base: dict[str, Any], strategies: list[str], seeds: list[int], out: Path) -> list[RunConfig]:
    """Every run's config, checked (schema and preflight) before any run starts."""
    from clusterfed.runner.preflight import preflight

    check_strategies(strategies)
    if not seeds:
        raise ConfigError("no seed given")
    configs, problems = [], []
    for strategy in strategies:
        for seed in seeds:
            values = {**base, "strategy": strategy, "seed": seed, "out-dir": str(out / strategy / f"seed{seed}")}
            try:
                configs.append(parse_config(values))
            except ConfigError as error:
                problems.append(str(error))
    if problems:
        raise ConfigError("; ".join(dict.fromkeys(problems)))
    checked: set[tuple] = set()
    for config in configs:  # the partition (and data) checks depend on the data keys and seed only
        data_keys = tuple(sorted((k, v) for k, v in config.to_flower().items() if k not in ("strategy", "out-dir")))
        if data_keys not in checked:
            checked.add(data_keys)
            preflight(config)
    return configs


def _run_one(config: RunConfig, engine: str) -> dict[str, Any]:
    import logging

    from clusterfed.simulation import simulate

    logging.getLogger("flwr").setLevel(logging.WARNING)  # the progress line reports each run
    simulate(config, engine=engine, stream=None)
    return run_row(Path(config.out_dir))


def run_row(run_dir: Path) -> dict[str, Any]:
    """One comparison.csv row from a finished run's folder."""
    from clusterfed.results import load_run

    rounds, summary = load_run(run_dir)
    config = summary.get("config", {})
    last = rounds[-1] if rounds else {}
    return {
        "strategy": config.get("strategy"),
        "seed": config.get("seed"),
        "final_accuracy": summary.get("final_accuracy"),
        "best_accuracy": summary.get("best_accuracy"),
        "accuracy_std": last.get("accuracy_std"),
        "final_ari": summary.get("final_ari"),
        "num_clusters": summary.get("num_clusters"),
        "rounds_to_target": summary.get("rounds_to_target"),
        "mb_to_target": summary.get("mb_to_target"),
        "mb_up": summary.get("total_mb_up"),
        "mb_down": summary.get("total_mb_down"),
        "transmissions": sum(r.get("transmissions", 0) for r in rounds),
        "wall_seconds": summary.get("wall_seconds"),
        "first_clustered_round": next((r["round"] for r in rounds if r.get("num_clusters", 1) > 1), None),
        "rounds": len(rounds),
        "target_accuracy": summary.get("target_accuracy"),
    }


class Progress:
    """A one-line progress bar over the grid on ``stream`` (stderr)."""

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


def run_grid(configs: list[RunConfig], *, engine: str = "inprocess", workers: int = 1,
             progress: Progress | None = None,
             runner: Callable[[RunConfig, str], dict[str, Any]] = _run_one) -> list[dict[str, Any]]:
    """Run every config (``workers`` processes for the in-process engine); rows in grid order."""
    if engine != "inprocess" and workers > 1:
        raise ConfigError("--workers > 1 needs --engine inprocess (Flower's engine uses every core itself)")
    rows: dict[int, dict[str, Any]] = {}

    def done(index: int, row: dict[str, Any]) -> None:
        rows[index] = row
        if progress is not None:
            acc = row["final_accuracy"]
            progress.step(f"{row['strategy']} seed {row['seed']}: acc "
                          f"{'n/a' if acc is None else f'{acc:.3f}'} ARI {row['final_ari'] or 0:.2f}")

    if workers <= 1:
        for index, config in enumerate(configs):
            done(index, runner(config, engine))
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(runner, config, engine): i for i, config in enumerate(configs)}
            for future in as_completed(futures):
                done(futures[future], future.result())
    return [rows[i] for i in range(len(configs))]


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in CSV_COLUMNS})


def read_csv(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open() as handle:
        for raw in csv.DictReader(handle):
            rows.append({k: (raw[k] if k == "strategy" else (None if raw[k] == "" else float(raw[k]))) for k in raw})
    return rows


def aggregate(rows: list[dict[str, Any]]) -> dict[str, dict[str, tuple[float | None, float | None, int, int]]]:
    """strategy -> column -> (mean, std over seeds, seeds with a value, seeds)."""
    table: dict[str, dict[str, tuple]] = {}
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        group = [r for r in rows if r["strategy"] == strategy]
        table[strategy] = {}
        for name, _, _ in COLUMNS:
            values = [float(r[name]) for r in group if r.get(name) is not None]
            mean = float(np.mean(values)) if values else None
            std = float(np.std(values)) if values else None
            table[strategy][name] = (mean, std, len(values), len(group))
    return table


def _cell(mean: float | None, std: float | None, present: int, total: int, name: str) -> str:
    if mean is None:
        return "–"
    digits = {"final_accuracy": 3, "best_accuracy": 3, "accuracy_std": 3, "final_ari": 2}.get(name, 1)
    text = f"{mean:.{digits}f}" if present == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"
    if present < total:
        text += f" ({present}/{total})"
    return text


def best_strategies(table: dict[str, dict[str, tuple]], name: str, direction: int) -> set[str]:
    """Strategies whose mean is best in a column (ties included). A to-target column ranks
    only the strategies that reached the target on every seed."""
    if direction == 0:
        return set()
    candidates = {s: cols[name] for s, cols in table.items() if cols[name][0] is not None}
    if name.endswith("_to_target"):
        candidates = {s: v for s, v in candidates.items() if v[2] == v[3]}
    if not candidates:
        return set()
    best = max(direction * v[0] for v in candidates.values())
    return {s for s, v in candidates.items() if direction * v[0] >= best - 1e-9 * max(1.0, abs(best))}


def markdown_table(rows: list[dict[str, Any]]) -> str:
    table = aggregate(rows)
    seeds = sorted({int(r["seed"]) for r in rows})
    bests = {name: best_strategies(table, name, direction) for name, _, direction in COLUMNS}
    lines = ["| strategy | " + " | ".join(header for _, header, _ in COLUMNS) + " |",
             "|---|" + "---|" * len(COLUMNS)]
    for strategy, cols in table.items():
        cells = []
        for name, _, _ in COLUMNS:
            text = _cell(*cols[name], name)
            cells.append(f"**{text}**" if strategy in bests[name] else text)
        lines.append(f"| {strategy} | " + " | ".join(cells) + " |")
    target = next((r.get("target_accuracy") for r in rows if r.get("target_accuracy") is not None), None)
    note = (f"\nMean ± std over seeds {', '.join(map(str, seeds))}; **bold** = best in its column. "
            f"Target accuracy {target}; \"(k/n)\": only k of n seeds reached it (the to-target columns rank "
            "only strategies that reached it on every seed). Transmissions = client replies to training "
            "and clustering messages.\n")
    return "\n".join(lines) + "\n" + note


def write_outputs(rows: list[dict[str, Any]], out: Path, title: str) -> list[Path]:
    from clusterfed.plots.compare import plot_compare

    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "comparison.csv")
    (out / "comparison.md").write_text(markdown_table(rows))
    runs = {}
    for row in rows:
        run_dir = out / str(row["strategy"]) / f"seed{int(row['seed'])}"
        if (run_dir / "rounds.jsonl").exists():
            from clusterfed.results import load_run

            runs.setdefault(str(row["strategy"]), []).append(load_run(run_dir)[0])
    figures = plot_compare(runs, out, title)
    return [out / "comparison.csv", out / "comparison.md", *figures]


def compare(base: dict[str, Any], strategies: list[str], seeds: list[int], out: Path, *, engine: str = "inprocess",
            workers: int = 1, stream: TextIO | None = sys.stderr) -> list[dict[str, Any]]:
    """Check the whole grid, run it, write the table, csv and figures; returns the rows."""
    configs = build_grid(base, strategies, seeds, out)
    progress = Progress(len(configs), stream)
    rows = run_grid(configs, engine=engine, workers=workers, progress=progress)
    first = configs[0]
    write_outputs(rows, out, f"{first.dataset} / {first.partitioner}, {first.num_clients} clients")
    return rows
