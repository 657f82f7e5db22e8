"""The run report: one self-contained HTML file (figures as base64 PNG, no external URL) built
from a run's output folder, written atomically so a browser never reads half a file."""

from __future__ import annotations

import base64
import json
import os
import tempfile
import time
from html import escape
from pathlib import Path
from typing import Any

from clusterfed.cluster_misses import MISS_LABELS
from clusterfed.report.run_folder import RunView, read_run

REPORT_NAME = "report.html"
# clusters.json entries too large or too structured for the notes table (drawn or in the file)
SKIPPED_RECORD_KEYS = {"assignment", "true_groups", "sizes", "distance_matrix", "linkage", "client_order", "labels",
                       "tree", "newcomers", "strategy"}
MAX_VALUE_CHARS = 400  # a record value longer than this is left to clusters.json
MAX_LIST_ROWS = 30  # rows of a list-of-records entry (splits, merges …) shown
STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:6px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.status{display:inline-block;padding:2px 8px;border-radius:4px;color:#fff;font-size:13px}
.running{background:#1f77b4}.ok,.ended{background:#2ca02c}.failed{background:#d62728}.unknown{background:#888}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:6px 10px;margin:6px 0;font-size:14px}
.figs{display:grid;grid-template-columns:1fr 1fr;gap:10px}.figs img{width:100%;display:block}.muted{color:#777;font-size:12px}
"""


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _table(header: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(
        f"<td class=\"num\">{escape(_fmt(v))}</td>" if i in numeric else f"<td>{escape(_fmt(v))}</td>"
        for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


# the report's heading for each miss reason (beside its own ground-truth notes "Over-split: ...")
MISS_HEADINGS = {"over_split_reason": "More clusters than groups", "under_split_reason": "Fewer clusters than groups",
                 "mixed_clusters_reason": "Clusters mix the groups"}


def clustering_notes(view: RunView) -> list[str]:
    """Why the run ended with one cluster, and how the assignment splits or mixes the true
    groups (from ground truth, which only metrics read)."""
    notes = []
    reason = view.clusters.get("one_cluster_reason") or view.summary.get("one_cluster_reason")
    if reason:
        notes.append(f"One cluster: {reason}")
    for key in MISS_LABELS:  # the strategy's own account of its count
        if view.summary.get(key):
            notes.append(f"{MISS_HEADINGS[key]}: {view.summary[key]}")
    groups = {k: g for k, g in view.true_groups.items() if k in view.assignment}
    if groups:
        by_group: dict[int, set[int]] = {}
        by_cluster: dict[int, set[int]] = {}
        for key, group in groups.items():
            by_group.setdefault(group, set()).add(view.assignment[key])
            by_cluster.setdefault(view.assignment[key], set()).add(group)
        split = {g: sorted(c) for g, c in sorted(by_group.items()) if len(c) > 1}
        mixed = {c: sorted(g) for c, g in sorted(by_cluster.items()) if len(g) > 1}
        if split:
            notes.append("Over-split: " + "; ".join(f"true group {g} is spread over clusters {c}"
                                                  for g, c in split.items()))
        if mixed and len(by_cluster) > 1:
            notes.append("Mixed: " + "; ".join(f"cluster {c} holds true groups {g}" for c, g in mixed.items()))
    merges = view.clusters.get("merges")
    if merges:
        notes.append(f"{len(merges)} merge(s) of over-split clusters (the strategy record below lists them)")
    return notes


def _record_section(clusters: dict[str, Any]) -> str:
    """The strategy's clustering record (clusters.json) as scalars and small tables."""
    scalars, lists = [], []
    for key, value in clusters.items():
        if key in SKIPPED_RECORD_KEYS:
            continue
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            columns = sorted({c for v in value for c in v})
            rows = [[_short(v.get(c)) for c in columns] for v in value[:MAX_LIST_ROWS]]
            more = f'<p class="muted">{len(value) - MAX_LIST_ROWS} more in clusters.json</p>' \
                if len(value) > MAX_LIST_ROWS else ""
            lists.append(f"<h3>{escape(key)}</h3>" + _table(columns, rows) + more)
        else:
            scalars.append([key, _short(value)])
    if not scalars and not lists:
        return ""
    return "<h2>Strategy record (clusters.json)</h2>" + (_table(["entry", "value"], scalars) if scalars else "") \
        + "".join(lists)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else _fmt(value) if not isinstance(value, (list, dict)) else \
        json.dumps(value, default=str)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + " … (in clusters.json)"


def client_rows(view: RunView) -> list[list[Any]]:
    """Per client: cluster, true group, the metric in the last round that evaluated it, the
    rounds it was evaluated in, and its failed or rejected replies over the run."""
    name = view.metric
    last: dict[str, float] = {}
    evaluated: dict[str, int] = {}
    failures: dict[str, int] = {}
    for row in view.rounds:
        for key, value in row.get(f"client_{name}", {}).items():
            last[key] = value
            evaluated[key] = evaluated.get(key, 0) + 1
        for failure in row.get("failed", []) + row.get("rejections", []):
            key = failure.get("client")
            if key is not None:
                failures[key] = failures.get(key, 0) + 1
    return [[key, view.assignment.get(key), view.true_groups.get(key), last.get(key), evaluated.get(key, 0),
             failures.get(key, 0)] for key in view.clients()]


def cluster_rows(view: RunView) -> list[list[Any]]:
    """Per cluster of the assignment: clients, the true groups they come from, and the last
    round's metric and loss."""
    last = view.rounds[-1].get("clusters", {}) if view.rounds else {}
    members: dict[int, list[str]] = {}
    for key, cluster in view.assignment.items():
        members.setdefault(cluster, []).append(key)
    rows = []
    for cluster in sorted(members):
        groups: dict[int, int] = {}
        for key in members[cluster]:
            if key in view.true_groups:
                groups[view.true_groups[key]] = groups.get(view.true_groups[key], 0) + 1
        origin = ", ".join(f"{g}×{n}" for g, n in sorted(groups.items())) or None
        stats = last.get(str(cluster), {})
        rows.append([cluster, len(members[cluster]), origin, stats.get(view.metric), stats.get("loss")])
    return rows


def render(view: RunView) -> str:
    """The report's HTML for ``view``."""
    from clusterfed.report import figures

    name, rounds, summary = view.metric, view.rounds, view.summary
    last = rounds[-1] if rounds else {}
    config = view.config
    title = f"{view.strategy} · {config.get('dataset', '?')} / {config.get('partitioner', '?')}"
    state = view.status.get("status", "ok" if view.final else "unknown")
    total = config.get("rounds")
    progress = f"round {last.get('round', 0)}" + (f" of {total}" if total else "")
    ended = view.status.get("ended") or view.status.get("error") or ""
    parts = [
        f"<h1>clusterfed run: {escape(title)}</h1>",
        f'<p><span class="status {escape(state) if state in ("running", "ok", "ended", "failed") else "unknown"}">'
        f"{escape(state)}</span> {escape(progress)}{' — ' + escape(ended) if ended else ''}"
        f'<br><span class="muted">{escape(str(view.out.resolve()))} · written '
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</span></p>",
    ]
    final = summary.get(f"final_{name}", last.get(name))
    best = summary.get(f"best_{name}")
    up = last.get("cum_bytes_up", 0) / 1e6
    down = last.get("cum_bytes_down", 0) / 1e6
    headline = [[f"{name} (mean over clients, last round)", final], [f"best {name}", best],
                ["ARI (assignment vs true groups)", last.get("ari")], ["clusters", last.get("num_clusters")],
                ["MB up / down", f"{up:.3f} / {down:.3f}"], ["rounds to target", summary.get("rounds_to_target")],
                ["failed / rejected replies", f"{sum(r.get('failures', 0) for r in rounds)} / "
                                              f"{sum(r.get('rejected', 0) for r in rounds)}"],
                ["wall seconds", summary.get("wall_seconds")]]
    parts.append(_table(["", "value"], [row for row in headline if row[1] is not None], numeric={1}))
    notes = clustering_notes(view)
    if notes:
        parts.append("<h2>Notes</h2>" + "".join(f'<div class="note">{escape(n)}</div>' for n in notes))
    if rounds:
        target = summary.get(f"target_{name}", config.get("target-accuracy"))
        parts.append('<h2>Training</h2><div class="figs">'
                     + _img(figures.accuracy_png(rounds, f"{name} per cluster", target, name), f"{name} per round")
                     + _img(figures.loss_png(rounds, "loss per cluster"), "loss per round")
                     + _img(figures.sizes_png(rounds, "cluster sizes"), "cluster sizes per round")
                     + _img(figures.traffic_png(rounds, "bytes each way"), "bytes per round") + "</div>")
    ari = last.get("ari") if view.true_groups else None
    parts.append(f"<h2>Cluster assignment{' (final)' if view.final else ' (last round)'}</h2>"
                 + (f"<p>ARI against the true groups: {escape(_fmt(ari, 3))}</p>" if ari is not None else "")
                 + _table(["cluster", "clients", "true groups (group×clients)", name, "loss"], cluster_rows(view),
                          numeric={0, 1, 3, 4}))
    parts.append('<h2>Clients</h2>' + _table(
        ["client", "cluster", "true group", f"{name} (last evaluated)", "rounds evaluated", "failed/rejected replies"],
        client_rows(view), numeric={1, 2, 3, 4, 5}))
    params = view.strategy_params()
    parts.append(f"<h2>Strategy parameters ({escape(view.strategy)})</h2>"
                 + (_table(["parameter", "value"], [[k, v] for k, v in params.items()]) if params
                    else '<p class="muted">defaults (none set in config.json)</p>'))
    parts.append(_record_section(view.clusters))
    if config:
        parts.append("<details><summary>Run config (config.json)</summary>"
                     + _table(["key", "value"], [[k, _short(v)] for k, v in sorted(config.items())]) + "</details>")
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>clusterfed · {escape(title)}</title><style>{STYLE}</style></head><body>"
            + "".join(parts) + "</body></html>\n")


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``."""
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(out_dir: str | Path, path: str | Path | None = None, *,
                 live_true_groups: dict[str, int] | None = None,
                 ended: tuple[dict[str, Any], dict[str, Any] | None] | None = None) -> Path:
    """Build the report of the run in ``out_dir`` and write it to ``path`` (default
    ``out_dir/report.html``); returns the path. ``live_true_groups`` / ``ended``: what the
    recorder of a running / just finished run knows (``read_run``)."""
    view = read_run(out_dir, live_true_groups=live_true_groups, ended=ended)
    target = Path(path) if path is not None else Path(out_dir) / REPORT_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, render(view))
    return target
