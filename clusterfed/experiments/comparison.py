"""A grid's comparison: one row per run from its folder, ``comparison.csv``, ``comparison.md``
(mean ± std over seeds per strategy, the best of each column in bold) and the two figures of a
grid folder (``clusterfed.plots.compare``).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from clusterfed.experiments.stats import MeanStd, mean_std

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
# first_clustered_round: the first round whose assignment has more than one cluster (empty if never);
# rounds_to_ari: the first round whose ARI against the true groups reaches RECOVERED_ARI (empty if never);
# round_seconds: mean wall time of a round
RECOVERED_ARI = 0.9
CSV_COLUMNS = ("strategy", "seed", *(name for name, _, _ in COLUMNS), "first_clustered_round", "rounds",
               "target_accuracy", "rounds_to_ari", "round_seconds")


def run_row(run_dir: Path, label: str | None = None) -> dict[str, Any]:
    """One comparison.csv row from a finished run's folder (``label``: the strategy column,
    default the strategy's name)."""
    from clusterfed.results import load_run

    rounds, summary = load_run(run_dir)
    config = summary.get("config", {})
    last = rounds[-1] if rounds else {}
    return {
        "strategy": label or config.get("strategy"),
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
        "rounds_to_ari": next((r["round"] for r in rounds if (r.get("ari") or 0) >= RECOVERED_ARI), None),
        "round_seconds": (sum(r.get("round_seconds", 0.0) for r in rounds) / len(rounds)) if rounds else None,
    }


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
            rows.append({k: (raw[k] if k == "strategy" else _number(raw[k])) for k in raw})
    return rows


def _number(text: str) -> int | float | None:
    """A csv cell as written: empty is None, an integer stays one (a rewritten file keeps its counts)."""
    if text == "":
        return None
    return int(text) if text.lstrip("-").isdigit() else float(text)


def aggregate(rows: list[dict[str, Any]]) -> dict[str, dict[str, MeanStd]]:
    """strategy -> column -> mean ± std over its seeds."""
    table: dict[str, dict[str, MeanStd]] = {}
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        group = [r for r in rows if r["strategy"] == strategy]
        table[strategy] = {name: column_stat(group, name) for name, _, _ in COLUMNS}
    return table


def column_stat(rows: list[dict[str, Any]], column: str, strategy: str | None = None) -> MeanStd:
    """Mean ± std of one column over ``rows`` (of one ``strategy`` when given)."""
    if strategy is not None:
        rows = [r for r in rows if r["strategy"] == strategy]
    return mean_std(None if r.get(column) is None else float(r[column]) for r in rows)


DIGITS = {"final_accuracy": 3, "best_accuracy": 3, "accuracy_std": 3, "final_ari": 2}


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
            text = cols[name].format(DIGITS.get(name, 1))
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


