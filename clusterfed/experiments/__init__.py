"""Experiments as data: experiment files (TOML) over the one settings registry, one grid runner,
result folders with manifests.

    clusterfed experiment benchmarks/experiments/suite-quick.toml --workers 2

- ``settings``: the registry of named settings (run-config keys per setting);
- ``spec``: experiment files, checked as a whole before anything runs;
- ``grids``: every grid's runs checked, then run in one process pool, tables, figures, ``timing.json``;
- ``comparison``: one row per run, ``comparison.csv`` / ``comparison.md`` and figures;
- ``sweeps``: second-phase grids that depend on the first (dendrogram cuts);
- ``manifest``: ``manifest.json`` (commit, config hash, versions, machine, command, times);
- ``stats``: the one mean ± std.
"""

from clusterfed.experiments.grids import run_experiment
from clusterfed.experiments.manifest import start_manifest, write_manifest
from clusterfed.experiments.settings import SETTINGS, setting
from clusterfed.experiments.spec import Experiment, ExperimentError, load_experiment, parse_experiment
from clusterfed.experiments.stats import MeanStd, mean_std

__all__ = ["SETTINGS", "Experiment", "ExperimentError", "MeanStd", "load_experiment", "mean_std", "run_experiment",
           "parse_experiment", "setting", "start_manifest", "write_manifest"]
