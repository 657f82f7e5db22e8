"""``clusterfed compare``: every strategy × seed on one setting given on the command line — a
front-end over the grid runner (``clusterfed.experiments.grids``) with one grid whose folder is
``out`` itself: ``<strategy>/seed<s>/`` per run, ``comparison.csv``, ``comparison.md``, the two
figures and ``manifest.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from clusterfed.config import ConfigError
from clusterfed.experiments.comparison import CSV_COLUMNS, markdown_table, read_csv  # noqa: F401 (re-exported)
from clusterfed.experiments.grids import run_experiment
from clusterfed.experiments.spec import parse_experiment


def compare(base: dict[str, Any], strategies: list[str], seeds: list[int], out: Path, *, engine: str = "inprocess",
            workers: int = 1, stream: TextIO | None = sys.stderr) -> list[dict[str, Any]]:
    """Check the whole grid, run it, write the table, csv and figures; returns the rows."""
    if not strategies:
        raise ConfigError("no strategy given")
    if not seeds:
        raise ConfigError("no seed given")
    if len(set(strategies)) != len(strategies):
        raise ConfigError(f"a strategy is named twice in {','.join(strategies)}")
    # a config file (a pyproject's [tool.flwr.app.config]) may name a strategy, seed and out-dir: the grid sets them
    config = {k: v for k, v in base.items() if k not in ("strategy", "seed", "out-dir")}
    data = {"strategies": strategies, "seeds": seeds, "grid": [{"folder": "", "config": config}]}
    experiment = parse_experiment(data, source="clusterfed compare", base_dir=Path.cwd(), name="compare",
                                  out=Path(out), skip_missing_data=False, command_line=True)
    return run_experiment(experiment, engine=engine, workers=workers, stream=stream)[""]
