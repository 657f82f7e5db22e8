"""Experiment files: what to run, as data (TOML), checked as a whole before anything runs.

An experiment file names settings from the one registry (``clusterfed.experiments.settings``),
the strategies with their parameters, seeds and rounds::

    description = "two strategies on digit pairs"
    out = "../results/example"    # relative to this file; `clusterfed experiment --out` replaces it
    profile = "example"           # recorded in timing.json (default: the file's stem)
    strategies = ["fedavg", "fedclust"]   # or "all": every strategy of the registry
    seeds = [0, 1]
    rounds = 20

    [config]                      # run-config keys for every run
    checkpoint = false

    [params.fedclust]             # a strategy's parameters for every run of it (fedclust.distance)
    distance = "cosine"

    [[grid]]                      # one result folder: <out>/<folder>/comparison.csv, ...
    setting = "digits-pairs"      # a registered setting
    # folder = "digits-pairs"     # default: the setting's name
    # title, strategies, seeds, rounds, config, params: this grid's own, replacing the file's

    [[grid]]
    setting = "digits-rotation"
    strategies = ["fedavg", {strategy = "fedclust", label = "fedclust-all", cluster-layers = "all"}]

A strategy entry is a name or a table ``{strategy = NAME, label = LABEL, <param> = value ...}``
(a variant: its runs go to ``<folder>/<label>/seed<s>/`` and its rows carry the label).
``[[sweep]]`` tables add a second phase whose grids depend on the first (``kind =
"dendrogram-cuts"``: see ``clusterfed.experiments.sweeps``).
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterfed.config import ConfigError
from clusterfed.datasets import DatasetNotFoundError, load_source
from clusterfed.experiments.settings import UnknownSetting, default_data_dir, setting, uses_data_dir
from clusterfed.strategies import REGISTRY

TOP_KEYS = ("description", "out", "profile", "title", "strategies", "seeds", "rounds", "config", "params",
            "data-dir", "grid", "sweep")
GRID_KEYS = ("setting", "folder", "title", "strategies", "seeds", "rounds", "config", "params")
SWEEP_KEYS = ("kind", "of", "strategy", "param", "counts", "title")
SWEEP_KINDS = ("dendrogram-cuts",)


class ExperimentError(ConfigError):
    """An experiment file is wrong; the message lists every problem found."""


@dataclass(frozen=True)
class Variant:
    label: str
    strategy: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Grid:
    folder: str
    setting: str | None
    values: dict[str, Any]  # run-config keys without strategy, seed, out-dir
    variants: list[Variant]
    seeds: list[int]
    title: str = ""


@dataclass
class Sweep:
    kind: str
    of: str
    strategy: str
    param: str
    counts: list[int]
    title: str = ""


@dataclass
class Experiment:
    name: str
    source: str  # the file, or a description of where the experiment came from
    out: Path
    profile: str
    grids: list[Grid]
    sweeps: list[Sweep] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # grid folder -> why it does not run
    partial: bool = False  # only some grids of the file (--only)
    command_line: bool = False  # given on the command line (clusterfed compare), not in a file

    def resolved(self) -> dict[str, Any]:
        """The experiment as plain data (what the manifest's config hash is taken of)."""
        return {"grids": [{"folder": g.folder, "setting": g.setting, "values": g.values, "seeds": g.seeds,
                           "variants": [[v.label, v.strategy, v.params] for v in g.variants]} for g in self.grids],
                "sweeps": [vars(s) for s in self.sweeps]}


def _at(where: str) -> str:
    return f"{where}: " if where else ""


def _unknown_keys(table: dict, allowed: tuple[str, ...], where: str) -> list[str]:
    problems = []
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            problems.append(f"{_at(where)}unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                            + f"; allowed: {', '.join(allowed)}")
    return problems


def _variants(entries: Any, params: dict[str, dict], where: str, problems: list[str]) -> list[Variant]:
    if entries == "all":
        entries = list(REGISTRY)
    if isinstance(entries, str):
        entries = [e.strip() for e in entries.split(",") if e.strip()]
    if not isinstance(entries, list) or not entries:
        problems.append(f"{_at(where)}strategies must be \"all\" or a non-empty list, got {entries!r}")
        return []
    out = []
    for entry in entries:
        if isinstance(entry, str):
            entry = {"strategy": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("strategy"), str):
            problems.append(f"{_at(where)}a strategy entry is a name or a table with `strategy`, got {entry!r}")
            continue
        own = {k: v for k, v in entry.items() if k not in ("strategy", "label")}
        name = entry["strategy"]
        out.append(Variant(str(entry.get("label", name)), name, {**params.get(name, {}), **own}))
    unknown = list(dict.fromkeys(v.strategy for v in out if v.strategy not in REGISTRY and ":" not in v.strategy))
    if unknown:
        close = {n: c[0] for n in unknown if (c := difflib.get_close_matches(n, list(REGISTRY), n=1))}
        hint = (f" (did you mean {next(iter(close.values()))!r}?)" if len(unknown) == 1 and close else
                f" (did you mean: {', '.join(f'{n!r} → {c!r}' for n, c in close.items())}?)" if close else "")
        problems.append(f"{_at(where)}unknown strateg{'y' if len(unknown) == 1 else 'ies'} "
                        f"{', '.join(map(repr, unknown))}{hint}; available: {', '.join(REGISTRY)}")
    labels = [v.label for v in out]
    for label in dict.fromkeys(lab for lab in labels if labels.count(lab) > 1):
        problems.append(f"{_at(where)}strategy label {label!r} is used twice (give variants a `label`)")
    return out


def _seeds(value: Any, where: str, problems: list[str]) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(s, int) and s >= 0 for s in value):
        problems.append(f"{_at(where)}seeds must be a non-empty list of integers ≥ 0, got {value!r}")
        return []
    return list(value)


def _params(value: Any, where: str, problems: list[str]) -> dict[str, dict]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        problems.append(f"{_at(where)}params must be tables [params.<strategy>], got {value!r}")
        return {}
    return value


def parse_experiment(data: dict[str, Any], *, source: str, base_dir: Path, name: str,
                     out: Path | None = None, data_dir: Path | None = None, rounds: int | None = None,
                     seeds: list[int] | None = None, only: list[str] | None = None,
                     skip_missing_data: bool = True, command_line: bool = False) -> Experiment:
    """Check an experiment's structure (keys, settings, strategies, seeds); every problem in one error.
    The run configs themselves are checked by ``grids.plan`` (schema and preflight).
    ``command_line``: the experiment was given on the command line (``clusterfed compare``), so
    messages point into no file."""
    problems = _unknown_keys(data, TOP_KEYS, source)
    top_params = _params(data.get("params"), source, problems)
    top_config = data.get("config", {})
    if not isinstance(top_config, dict):
        problems.append(f"{source}: config must be a table of run-config keys")
        top_config = {}
    top_seeds = seeds or data.get("seeds", [0])
    data_dir = data_dir or (Path(data["data-dir"]) if "data-dir" in data else None)
    grids_data = data.get("grid", [])
    if not isinstance(grids_data, list) or not grids_data:
        problems.append(f"{source}: no [[grid]] table: an experiment needs at least one")
        grids_data = []
    grids, skipped = [], {}
    for index, raw in enumerate(grids_data):
        grid = _parse_grid(raw, index, data, source=source, top_config=top_config, top_params=top_params,
                           top_seeds=top_seeds, data_dir=data_dir, rounds=rounds, seeds=seeds,
                           command_line=command_line, folders=[g.folder for g in grids], problems=problems)
        if grid is None:
            continue
        folder, values = grid.folder, grid.values
        if only is not None and folder not in only:
            continue
        if skip_missing_data and uses_data_dir(values) and not _has_data(values):
            skipped[folder] = f"no {values['dataset']} data under {values.get('data-dir') or '(no data-dir)'}"
            continue
        grids.append(grid)
    if only is not None:
        missing = [f for f in only if f not in [g.folder for g in grids] and f not in skipped]
        if missing:
            problems.append(f"--only: no grid folder {', '.join(map(repr, missing))} in {source}")
    sweeps = _parse_sweeps(data, grids, source, problems)
    if problems:
        count = f"({len(problems)} problem{'' if len(problems) == 1 else 's'}): "
        head = "" if command_line else f"experiment {source} refused {count}"
        raise ExperimentError(head + "; ".join(dict.fromkeys(problems)))
    out_path = (out if out is not None else base_dir / str(data.get("out", f"results/{name}"))).resolve()
    return Experiment(name=name, source=source, out=Path(out_path), profile=str(data.get("profile", name)),
                      grids=grids, sweeps=sweeps, skipped=skipped, partial=only is not None,
                      command_line=command_line)


def _parse_grid(raw: Any, index: int, data: dict[str, Any], *, source: str, top_config: dict[str, Any],
                top_params: dict[str, Any], top_seeds: Any, data_dir: Path | None, rounds: int | None,
                seeds: list[int] | None, command_line: bool, folders: list[str], problems: list[str]) -> Grid | None:
    """One [[grid]] table as a Grid (None when it cannot be read); its problems go to ``problems``.
    ``folders``: the grid folders kept so far (a folder may not be used twice)."""
    where = f"{source} [[grid]] #{index + 1}"
    if not isinstance(raw, dict):
        problems.append(f"{_at(where)}not a table")
        return None
    problems += _unknown_keys(raw, GRID_KEYS, where)
    values: dict[str, Any] = {}
    name_ = raw.get("setting")
    if name_ is not None:
        try:
            values.update(setting(name_))
        except UnknownSetting as error:
            problems.append(f"{_at(where)}{error}")
            return None
    folder = str(raw.get("folder", name_ or ""))
    if name_ is None and "folder" not in raw:
        problems.append(f"{_at(where)}give a `setting` (or a `folder` and the run keys in `config`)")
        return None
    where = f"{source} [[grid]] {folder!r}" if folder else source
    if command_line:
        where = ""
    config = raw.get("config", {})
    if not isinstance(config, dict):
        problems.append(f"{_at(where)}config must be a table of run-config keys")
        config = {}
    values.update(top_config)
    values.update(config)
    if uses_data_dir(values) and data_dir is not None:
        values["data-dir"] = str(Path(data_dir).expanduser().resolve())
    grid_rounds = rounds or raw.get("rounds", data.get("rounds"))
    if grid_rounds is not None:
        values["rounds"] = grid_rounds
    for reserved in ("strategy", "seed", "out-dir"):
        if reserved in values:
            problems.append(f"{_at(where)}{reserved!r} is set by the experiment, not in config")
            values.pop(reserved)
    params = {**top_params, **_params(raw.get("params"), where, problems)}
    variants = _variants(raw.get("strategies", data.get("strategies", "all")), params, where, problems)
    grid_seeds = _seeds(seeds or raw.get("seeds", top_seeds), where, problems)
    if folder in folders:
        problems.append(f"{_at(where)}folder {folder!r} is used by two grids")
    return Grid(folder, name_, values, variants, grid_seeds, str(raw.get("title", "")))


def _parse_sweeps(data: dict[str, Any], grids: list[Grid], source: str, problems: list[str]) -> list[Sweep]:
    """The [[sweep]] tables over the kept ``grids``; their problems go to ``problems``."""
    sweeps = []
    sweeps_data = data.get("sweep", [])
    if not isinstance(sweeps_data, list) or not all(isinstance(raw, dict) for raw in sweeps_data):
        problems.append(f"{source}: sweeps are [[sweep]] tables")
        sweeps_data = []
    for index, raw in enumerate(sweeps_data):
        where = f"{source} [[sweep]] #{index + 1}"
        problems += _unknown_keys(raw, SWEEP_KEYS, where)
        if raw.get("kind") not in SWEEP_KINDS:
            problems.append(f"{_at(where)}kind must be one of {', '.join(SWEEP_KINDS)}, got {raw.get('kind')!r}")
            continue
        of = next((g for g in grids if g.folder == raw.get("of")), None)
        if of is None:
            problems.append(f"{_at(where)}`of` must name a grid folder of this file, got {raw.get('of')!r}")
            continue
        if raw.get("strategy") not in [v.label for v in of.variants]:
            problems.append(f"{_at(where)}strategy {raw.get('strategy')!r} does not run in grid {of.folder!r}")
            continue
        counts = raw.get("counts")
        if not isinstance(counts, list) or not counts or not all(isinstance(c, int) and c >= 1 for c in counts):
            problems.append(f"{_at(where)}counts must be a list of cluster counts ≥ 1, got {counts!r}")
            continue
        sweeps.append(Sweep("dendrogram-cuts", of.folder, raw["strategy"], str(raw.get("param", "lambda")),
                            counts, str(raw.get("title", ""))))
    return sweeps


def _has_data(values: dict[str, Any]) -> bool:
    try:
        load_source(values["dataset"], values.get("data-dir") or None)
    except (DatasetNotFoundError, ValueError):
        return False
    return True


def load_experiment(path: str | Path, **overrides: Any) -> Experiment:
    """Read and check an experiment file (``overrides``: out, data_dir, rounds, seeds, only)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ExperimentError(f"no experiment file {str(path)!r}") from None
    except tomllib.TOMLDecodeError as error:
        raise ExperimentError(f"{path} is not valid TOML: {error}") from None
    return parse_experiment(data, source=str(path), base_dir=path.resolve().parent, name=path.stem, **overrides)


__all__ = ["Experiment", "ExperimentError", "Grid", "Sweep", "Variant", "default_data_dir", "load_experiment",
           "parse_experiment"]
