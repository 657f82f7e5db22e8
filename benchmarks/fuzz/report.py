"""The per-strategy table (markdown, CSV, JSON) and the heatmap, from the cell records
(``cells/<seed>.json``) of a results folder."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from fuzz.run import MAX_LOSS_PP, STRATEGIES, groups_help
from fuzz.signal import shows_groups

LEARNT = 0.2  # FedAvg below this (twice chance on 10 classes) did not learn the task in the cell's rounds

COLUMNS = ("strategy", "cells", "pass_share", "passes", "learnt_cells", "learnt_passes", "learnt_pass_share",
           "informative_cells", "informative_passes", "informative_pass_share",
           "visible_cells", "visible_passes", "visible_pass_share",
           "worst_loss_pp", "cells_over_1pp", "iid_controls",
           "iid_one_cluster_share", "misses", "misses_named_share", "mean_ari_grouped", "errors",
           "peak_trainings_max", "mean_bytes_up", "mean_seconds")


def load_records(out: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (Path(out) / "cells").glob("*.json")),
                  key=lambda r: r["cell"]["seed"])


def judged_rounds(records: list[dict]) -> list[str]:
    """The rounds before the last that every record was judged at too (``run_cell``'s ``judge_at``)."""
    found = [set(rec.get("groups_help_at_round", {})) for rec in records]
    return sorted(set.intersection(*found), key=int) if found else []


def at_round(records: list[dict], server_round: str) -> list[dict]:
    """The records as they stood after ``server_round``: each row's clusters, accuracy and
    verdict of that round (its costs stay the whole run's), judged against FedAvg's of that
    round; a run of that many rounds would have ended so (no strategy reads the rounds left)."""
    return [{**rec, "rounds": int(server_round), "groups_help": rec["groups_help_at_round"][server_round],
             "rows": [{**row, **row["at_round"][server_round]} for row in rec["rows"]]} for rec in records]


def learnt_cell(record: dict) -> bool:
    """Whether FedAvg learnt the cell's task (final accuracy >= LEARNT)."""
    fedavg = next((r for r in record["rows"] if r["strategy"] == "fedavg"), None)
    return fedavg is not None and fedavg["accuracy"] is not None and fedavg["accuracy"] >= LEARNT


def informative_cell(record: dict) -> bool | None:
    """Whether finding the groups pays in the cell (``fuzz.run.groups_help``: the oracle beats
    FedAvg by more than 1 point, or an IID control); None when the cell has no oracle row."""
    rows = {r["strategy"]: r for r in record["rows"]}
    fedavg, oracle = rows.get("fedavg"), rows.get("oracle")
    return groups_help(fedavg and fedavg["accuracy"], oracle and oracle["accuracy"], record["cell"]["shift"] == "iid")


def visible_cell(record: dict, signal: dict | None) -> bool | None:
    """Whether the cell's true groups show in its clients' updates at all (``fuzz.signal``, read
    from ``signal``: seed -> record; an IID control counts); None when ``signal`` lacks the cell."""
    if record["cell"]["shift"] == "iid":
        return True
    found = (signal or {}).get(str(record["cell"]["seed"]))
    return None if found is None else bool(shows_groups(found))


def _share(part: int, whole: int) -> float | None:
    return None if whole == 0 else round(part / whole, 3)


def summarise(records: list[dict], signal: dict | None = None) -> list[dict]:
    """One row per strategy: share of cells passing (of all, where FedAvg learnt, where the groups
    help, where they show in the updates: ``signal``), worst loss against FedAvg, IID controls
    ending with one cluster, misses whose last round line names a reason, and costs."""
    names = [s for s in STRATEGIES if any(r["strategy"] == s for rec in records for r in rec["rows"])]
    table = []
    for name in names:
        rows = [(rec, r) for rec in records for r in rec["rows"] if r["strategy"] == name]
        passes = sum(1 for _, r in rows if r["passes"])
        learnt = [r for rec, r in rows if learnt_cell(rec)]
        judged = [informative_cell(rec) for rec, _ in rows]
        informative = [r for (rec, r), helps in zip(rows, judged) if helps]
        no_oracle = any(helps is None for helps in judged)
        seen = [visible_cell(rec, signal) for rec, _ in rows]
        visible = None if any(v is None for v in seen) else [r for (_, r), v in zip(rows, seen) if v]
        losses = [r["loss_pp"] for _, r in rows if r["loss_pp"] is not None]
        iid = [r for rec, r in rows if rec["cell"]["shift"] == "iid"]
        misses = [r for _, r in rows if not r["passes"]]
        grouped_ari = [r["ari"] for rec, r in rows if rec["cell"]["shift"] != "iid" and r["ari"] is not None]
        ups = [r["bytes_up"] for _, r in rows if r["bytes_up"] is not None]
        table.append({
            "strategy": name, "cells": len(rows), "pass_share": _share(passes, len(rows)), "passes": passes,
            "learnt_cells": len(learnt), "learnt_passes": sum(1 for r in learnt if r["passes"]),
            "learnt_pass_share": _share(sum(1 for r in learnt if r["passes"]), len(learnt)),
            "informative_cells": None if no_oracle else len(informative),
            "informative_passes": None if no_oracle else sum(1 for r in informative if r["passes"]),
            "informative_pass_share": None if no_oracle else _share(sum(1 for r in informative if r["passes"]),
                                                                     len(informative)),
            "visible_cells": None if visible is None else len(visible),
            "visible_passes": None if visible is None else sum(1 for r in visible if r["passes"]),
            "visible_pass_share": None if visible is None else _share(sum(1 for r in visible if r["passes"]),
                                                                       len(visible)),
            "worst_loss_pp": max(losses) if losses else None,
            "cells_over_1pp": sum(1 for loss in losses if loss > MAX_LOSS_PP),
            "iid_controls": len(iid), "iid_one_cluster_share": _share(sum(1 for r in iid if r["clusters"] == 1), len(iid)),
            "misses": len(misses), "misses_named_share": _share(sum(1 for r in misses if r["reason_named"]), len(misses)),
            "mean_ari_grouped": round(sum(grouped_ari) / len(grouped_ari), 3) if grouped_ari else None,
            "errors": sum(1 for _, r in rows if r["error"]),
            "peak_trainings_max": max((r["peak_trainings"] or 0 for _, r in rows), default=0),
            "mean_bytes_up": round(sum(ups) / len(ups)) if ups else None,
            "mean_seconds": round(sum(r["seconds"] for _, r in rows) / len(rows), 1),
        })
    return table


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(table: list[dict]) -> str:
    head = ("| strategy | cells | pass share | pass share where FedAvg learnt (≥ 0.2) | pass share where the groups "
            "help (the oracle > FedAvg + 1 pp; IID controls count) | pass share where the groups show in the "
            "updates (group signal; IID controls count) | worst loss vs FedAvg (pp) | "
            "cells > 1 pp below FedAvg | IID controls "
            "ending with one cluster | misses naming a reason in the last round line | mean ARI (grouped cells) | "
            "errors | most trainings of one client in one round | mean bytes up | mean seconds |")
    lines = [head, "|---" * 15 + "|"]
    for row in table:
        iid = "-" if not row["iid_controls"] else \
            f"{round(row['iid_one_cluster_share'] * row['iid_controls'])} of {row['iid_controls']}"
        named = "-" if not row["misses"] else \
            f"{round(row['misses_named_share'] * row['misses'])} of {row['misses']}"
        lines.append(f"| {row['strategy']} | {row['cells']} | {row['passes']} of {row['cells']} ({_fmt(row['pass_share'])}) | "
                     f"{row['learnt_passes']} of {row['learnt_cells']} ({_fmt(row['learnt_pass_share'])}) | "
                     + ("- | " if row["informative_cells"] is None else
                        f"{row['informative_passes']} of {row['informative_cells']} "
                        f"({_fmt(row['informative_pass_share'])}) | ") +
                     ("- | " if row["visible_cells"] is None else
                      f"{row['visible_passes']} of {row['visible_cells']} ({_fmt(row['visible_pass_share'])}) | ") +
                     f"{_fmt(row['worst_loss_pp'], 1)} | {row['cells_over_1pp']} | {iid} | {named} | "
                     f"{_fmt(row['mean_ari_grouped'])} | {row['errors']} | {row['peak_trainings_max']} | "
                     f"{_fmt(row['mean_bytes_up'])} | {_fmt(row['mean_seconds'], 1)} |")
    return "\n".join(lines)


def cell_table(records: list[dict]) -> str:
    """One line per cell and strategy: accuracy, ARI, clusters, verdict."""
    lines = ["| cell | strategy | client | accuracy | FedAvg | loss (pp) | ARI | clusters | verdict | last round line's own words |",
             "|---" * 10 + "|"]
    for rec in records:
        for r in rec["rows"]:
            verdict = ("passes: recovered" if r["recovered"] else "passes: FedAvg's ceiling") if r["passes"] else \
                ("error" if r["error"] else "miss")
            words = (r["error"] or r["last_decision"] or "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {rec['label']} | {r['strategy']} | {r['client']} | {_fmt(r['accuracy'], 3)} | "
                         f"{_fmt(r['fedavg_accuracy'], 3)} | {_fmt(r['loss_pp'], 1)} | {_fmt(r['ari'])} | "
                         f"{_fmt(r['clusters'])} | {verdict} | {words[:300]} |")
    return "\n".join(lines)


def write_tables(out: Path, records: list[dict], signal: dict | None = None, suffix: str = "") -> list[dict]:
    """``summary{suffix}.json/.csv/.md`` and ``cells{suffix}.md``."""
    table = summarise(records, signal)
    (out / f"summary{suffix}.json").write_text(json.dumps({"cells": len(records), "strategies": table}, indent=1) + "\n")
    with open(out / f"summary{suffix}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    (out / f"summary{suffix}.md").write_text(markdown(table) + "\n")
    (out / f"cells{suffix}.md").write_text(cell_table(records) + "\n")
    return table


def heatmap(records: list[dict], path: Path) -> None:
    """Cells × strategies: the ARI as colour, each square marked ✓ (passes) or ✗ (misses);
    an IID control's colour is 1 when it ended with one cluster, else 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    strategies = [s for s in STRATEGIES if any(r["strategy"] == s for rec in records for r in rec["rows"])]
    values = np.full((len(records), len(strategies)), np.nan)
    fig, ax = plt.subplots(figsize=(2.5 + 0.9 * len(strategies), 1.0 + 0.32 * len(records)))
    for i, rec in enumerate(records):
        by_name = {r["strategy"]: r for r in rec["rows"]}
        for j, name in enumerate(strategies):
            r = by_name.get(name)
            if r is None or r["accuracy"] is None:
                if r is not None:
                    ax.text(j, i, "err", ha="center", va="center", fontsize=7)
                continue
            value = (1.0 if r["clusters"] == 1 else 0.0) if rec["cell"]["shift"] == "iid" else max(r["ari"] or 0.0, 0.0)
            values[i, j] = value
            ax.text(j, i, ("✓ " if r["passes"] else "✗ ") + f"{value:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if value < 0.5 else "black")
    ax.imshow(values, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(strategies)), strategies, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(records)), [rec["label"] for rec in records], fontsize=7)
    ax.set_title("ARI vs the true groups (IID control: 1 = one cluster)\n✓ passes, ✗ misses", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
