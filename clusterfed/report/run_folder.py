"""What a run's output folder says, read once for the report: rows, summary, status, config,
the cluster assignment (final, or the last round's while the run goes on) and true groups."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterfed.core.exchange import natural


class RunFolderError(FileNotFoundError):
    """The folder holds no run's output (no ``rounds.jsonl``)."""


@dataclass
class RunView:
    out: Path
    rounds: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    clusters: dict[str, Any] = field(default_factory=dict)  # clusters.json of a finished run, else {}
    assignment: dict[str, int] = field(default_factory=dict)
    true_groups: dict[str, int] = field(default_factory=dict)
    final: bool = False  # the run ended and wrote summary.json / clusters.json for these rows

    @property
    def metric(self) -> str:
        return self.summary.get("metric", "accuracy")

    @property
    def strategy(self) -> str:
        return str(self.config.get("strategy") or self.summary.get("strategy") or self.clusters.get("strategy") or "?")

    def strategy_params(self) -> dict[str, Any]:
        """The strategy's own keys of the run config (``fedclust.lambda`` …), prefix dropped."""
        prefix = f"{self.strategy}."
        return {k[len(prefix):]: v for k, v in sorted(self.config.items()) if k.startswith(prefix)}

    def clients(self) -> list[str]:
        return sorted(set(self.assignment) | set(self.true_groups), key=natural)


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def read_rounds(out: Path) -> list[dict[str, Any]]:
    """Every complete row of ``rounds.jsonl`` (a row being written by a live run is left out)."""
    rows = []
    for line in (out / "rounds.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def read_run(out_dir: str | Path, *, live_true_groups: dict[str, int] | None = None,
             ended: tuple[dict[str, Any], dict[str, Any] | None] | None = None) -> RunView:
    """Read ``out_dir``. ``summary.json`` and ``clusters.json`` count only when they belong to
    these rows (a run that ended: same number of rounds, not ``running``); otherwise the
    assignment is the last row's and the true groups are ``live_true_groups`` (the running
    recorder's) if given. ``ended``: the (summary, clusters) the recorder has just finished
    with, used as they are (``status.json`` says ``running`` until the app has saved its models:
    shown as ``ended``)."""
    out = Path(out_dir)
    if not (out / "rounds.jsonl").is_file():
        raise RunFolderError(f"{out}: no rounds.jsonl here; give the out-dir of a clusterfed run "
                             f"(see docs/outputs.md)")
    rounds = read_rounds(out)
    view = RunView(out=out, rounds=rounds, status=_json(out / "status.json"), config=_json(out / "config.json"))
    summary, clusters = ended if ended is not None else (_json(out / "summary.json"), None)
    view.final = ended is not None or (bool(summary) and summary.get("rounds") == len(rounds)
                                       and view.status.get("status", "ok") != "running" and live_true_groups is None)
    if view.final:
        if view.status.get("status") == "running":
            view.status = {**view.status, "status": "ended"}
        view.summary = summary
        view.clusters = clusters if clusters is not None else {} if ended is not None else _json(out / "clusters.json")
        view.assignment = {k: int(v) for k, v in view.clusters.get("assignment", {}).items()}
        view.true_groups = {k: int(v) for k, v in view.clusters.get("true_groups", {}).items()}
    if not view.assignment and rounds:
        view.assignment = dict(rounds[-1].get("assignment", {}))
    if not view.true_groups and live_true_groups:
        view.true_groups = dict(live_true_groups)
    return view
