"""Merge the runs of one experiment grid folder into another of the same setting: more seeds
or strategies of a grid run in pieces (``benchmarks/experiments/scale-seeds.toml``).

Each ``<strategy>/seed<N>`` run folder of FROM replaces the one in INTO; INTO's
comparison.csv keeps its other rows (their run folders are not committed), takes FROM's rows
in their place, and its tables and figures are rewritten (figures from the run folders
present). FROM's manifest is kept beside INTO's as ``manifest-<name>.json``.

    python benchmarks/merge_runs.py /tmp/out/mnist-pairs-400-frac0.1 \\
        benchmarks/results/scale/mnist-pairs-400-frac0.1 --name seeds1-2
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from clusterfed.experiments.comparison import read_csv, run_row, write_outputs


def grid_title(into: Path) -> str:
    """The grid runner's figure title for the grid (data set / setting, clients, rounds), from a run's config."""
    config = json.loads(next(into.glob("*/seed*/config.json")).read_text())
    setting = json.loads((into / "manifest.json").read_text())["grid"]["setting"]
    return f"{config['dataset']} / {setting}, {config['num-clients']} clients, {config['rounds']} rounds"


def merge(source: Path, into: Path, name: str, title: str) -> list[str]:
    """Copy source's run folders into ``into`` and rewrite its outputs; returns the merged runs."""
    merged, rows = [], {(r["strategy"], int(r["seed"])): r for r in read_csv(into / "comparison.csv")}
    for row in read_csv(source / "comparison.csv"):
        run = f"{row['strategy']}/seed{int(row['seed'])}"
        if not (source / run / "summary.json").is_file():  # a run that failed: keep what INTO has
            print(f"skipped {run}: no finished run in {source}")
            continue
        target = into / run
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source / run, target)
        rows[(row["strategy"], int(row["seed"]))] = run_row(target, row["strategy"])
        merged.append(run)
    shutil.copy(source / "manifest.json", into / f"manifest-{name}.json")
    order = list(dict.fromkeys(strategy for strategy, _ in rows))
    write_outputs(sorted(rows.values(), key=lambda r: (order.index(r["strategy"]), int(r["seed"]))), into, title)
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="grid folder holding the new runs")
    parser.add_argument("into", type=Path, help="grid folder to merge them into")
    parser.add_argument("--name", required=True, help="suffix of the kept manifest (manifest-NAME.json)")
    parser.add_argument("--title", help="figure title (default: the runner's, from a run's config)")
    args = parser.parse_args()
    for path in (args.source / "comparison.csv", args.into / "comparison.csv"):
        if not path.is_file():
            parser.error(f"{path} does not exist: both folders must be experiment grid folders")
    merged = merge(args.source, args.into, args.name, args.title or grid_title(args.into))
    print(f"merged {len(merged)} runs into {args.into}: {', '.join(merged)}")


if __name__ == "__main__":
    main()
