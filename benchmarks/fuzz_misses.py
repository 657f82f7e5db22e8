"""Why the clustered strategies miss on the random-model benchmark: every miss of every given
``model_fuzz.py`` results folder sorted into one kind (the first that applies, in the order of
``KINDS``), pooled over the folders, beside the pass share on the cells left when the kinds no
strategy can act on are set aside.

    PYTHONPATH=$PWD:$PWD/tests:$PWD/benchmarks python benchmarks/fuzz_misses.py \\
        --folders benchmarks/results/model-fuzz/held-out benchmarks/results/model-fuzz/held-out-1060-1089 \\
        --signal benchmarks/results/model-fuzz/held-out-signal --out benchmarks/results/model-fuzz/held-out-misses

Reads each folder's ``cells/*.json`` and each signal folder's ``signal.json``
(``group_signal.py``); writes ``misses.json``, ``README.md`` (the tables), ``misses.png`` and
``manifest.json``. Runs no cell.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402
from fuzz.report import LEARNT, informative_cell, learnt_cell, visible_cell  # noqa: E402

CLUSTERED = ("fedclust", "adacfl", "cfl", "layercfl", "hicfl")
# a miss's kind, the first that applies
KINDS = {
    "iid_split": "an IID control split (its right answer is one cluster)",
    "groups_do_not_pay": "the oracle (clusters given as the true groups) beats FedAvg by 1 point or less",
    "no_trace": "the true groups show no clear trace in any array of one training's updates (group_signal.py)",
    "not_learnt": f"FedAvg below {LEARNT} after the cell's rounds: the model barely learnt the task",
    "too_few_clusters": "fewer clusters than groups (a split refused, deferred or waiting)",
    "too_many_clusters": "more clusters than groups",
    "wrong_cut": "as many clusters as groups, but not the groups (ARI < 0.9)",
}
# cells where the judge asks for what cannot be had: groups that do not pay (one cluster at
# FedAvg's accuracy is the right end, yet a miss), or groups no array of the updates shows
UNDECIDABLE = ("groups_do_not_pay", "no_trace")
# and, besides, cells whose model barely learnt the task in the cell's rounds
HARD = ("not_learnt",)


def load(folders: list[Path], signal_folders: list[Path]) -> tuple[list[dict], dict]:
    """The cell records of ``folders`` (a seed in two folders: the later one) and the signal records."""
    records: dict[int, dict] = {}
    for folder in folders:
        cells = sorted((folder / "cells").glob("*.json"))
        if not cells:
            raise SystemExit(f"fuzz_misses: {folder}: no cells/*.json (a model_fuzz.py --out folder)")
        for path in cells:
            record = json.loads(path.read_text())
            records[record["cell"]["seed"]] = {**record, "folder": folder.name}
    signal: dict = {}
    for folder in signal_folders:
        path = folder / "signal.json"
        if not path.exists():
            raise SystemExit(f"fuzz_misses: {folder}: no signal.json (a group_signal.py --out folder)")
        signal.update(json.loads(path.read_text()))
    return [records[s] for s in sorted(records)], signal


def miss_kind(record: dict, row: dict, signal: dict) -> str:
    """The kind of a missed row (``KINDS``, the first that applies)."""
    groups = len(set(record["true_groups"]))
    if record["cell"]["shift"] == "iid":
        return "iid_split"
    if informative_cell(record) is False:
        return "groups_do_not_pay"
    if visible_cell(record, signal) is False:
        return "no_trace"
    if not learnt_cell(record):
        return "not_learnt"
    if row["clusters"] < groups:
        return "too_few_clusters"
    return "too_many_clusters" if row["clusters"] > groups else "wrong_cut"


def decidable(record: dict, signal: dict, *, learnt: bool = False) -> bool:
    """Whether none of ``UNDECIDABLE`` holds of the cell (and with ``learnt``, FedAvg learnt its
    task: not ``HARD``); an IID control is decidable."""
    if record["cell"]["shift"] == "iid":
        return True
    return (informative_cell(record) is not False and visible_cell(record, signal) is not False
            and (learnt_cell(record) or not learnt))


def tally(records: list[dict], signal: dict) -> list[dict]:
    """Per strategy: cells, passes, misses by kind, and passes on the decidable cells."""
    table = []
    for name in CLUSTERED:
        rows = [(rec, r) for rec in records for r in rec["rows"] if r["strategy"] == name]
        if not rows:
            continue
        kinds = Counter(miss_kind(rec, r, signal) for rec, r in rows if not r["passes"])
        kept = [r for rec, r in rows if decidable(rec, signal)]
        learnt = [r for rec, r in rows if decidable(rec, signal, learnt=True)]
        table.append({"strategy": name, "cells": len(rows), "passes": sum(1 for _, r in rows if r["passes"]),
                      "misses": {k: kinds.get(k, 0) for k in KINDS},
                      "decidable_cells": len(kept), "decidable_passes": sum(1 for r in kept if r["passes"]),
                      "learnt_cells": len(learnt), "learnt_passes": sum(1 for r in learnt if r["passes"]),
                      "missed_cells": {k: sorted(rec["cell"]["seed"] for rec, r in rows
                                                 if not r["passes"] and miss_kind(rec, r, signal) == k)
                                       for k in KINDS}})
    return table


def per_folder(records: list[dict], signal: dict) -> str:
    """A row per folder: its cells, those undecidable, and those whose model did not learn."""
    lines = ["| folder | cells | undecidable (groups do not pay, or no trace) | of the rest, not learnt |",
             "|---|---|---|---|"]
    for folder in dict.fromkeys(rec["folder"] for rec in records):
        mine = [rec for rec in records if rec["folder"] == folder]
        out = [rec["cell"]["seed"] for rec in mine if not decidable(rec, signal)]
        hard = sum(1 for rec in mine if decidable(rec, signal) and not decidable(rec, signal, learnt=True))
        lines.append(f"| `{folder}` | {len(mine)} | {len(out)}{' (' + ', '.join(map(str, out)) + ')' if out else ''} "
                     f"| {hard} |")
    return "\n".join(lines)


def markdown(table: list[dict]) -> str:
    lines = ["| strategy | cells | passes | " + " | ".join(k.replace("_", " ") for k in KINDS)
             + " | passes where decidable | and FedAvg learnt |", "|---|---|---|" + "---|" * len(KINDS) + "---|---|"]
    for row in table:
        share = row["passes"] / row["cells"]
        lines.append(f"| {row['strategy']} | {row['cells']} | {row['passes']} ({share:.0%}) | "
                     + " | ".join(str(row["misses"][k]) for k in KINDS)
                     + f" | {_of(row['decidable_passes'], row['decidable_cells'])} "
                       f"| {_of(row['learnt_passes'], row['learnt_cells'])} |")
    return "\n".join(lines)


def _of(part: int, whole: int) -> str:
    return f"{part} of {whole}" + (f" ({part / whole:.0%})" if whole else "")


def figure(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    names = [row["strategy"] for row in table]
    left = [row["passes"] for row in table]
    ax.barh(names, left, color="#4c9a2a", label="passes")
    colours = ["#b2182b", "#aaaaaa", "#c8c8c8", "#e0e0e0", "#d95f02", "#7570b3", "#e7298a"]
    for kind, colour in zip(KINDS, colours):
        width = [row["misses"][kind] for row in table]
        ax.barh(names, width, left=left, color=colour, label=kind.replace("_", " "))
        left = [a + b for a, b in zip(left, width)]
    ax.invert_yaxis()
    ax.set_xlabel("cells")
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(1.0, 0.0))
    ax.set_title("passes and misses by kind (grey: cells set aside as undecidable or not learnt)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def readme(table: list[dict], folders: list[Path], signal_folders: list[Path], records: list[dict], signal: dict) -> str:
    kinds = "\n".join(f"- **{k.replace('_', ' ')}**: {v}" for k, v in KINDS.items())
    listed = "\n".join(f"- {row['strategy']}: " + "; ".join(
        f"{k.replace('_', ' ')} {', '.join(map(str, seeds))}" for k, seeds in row["missed_cells"].items() if seeds)
                       for row in table)
    return f"""# Why the clustered strategies miss

Every miss of the clustered strategies in {len(folders)} results folders ({len(records)} cells,
{', '.join(f'`{f.name}`' for f in folders)}), each sorted into the first kind that applies:

{kinds}

The benchmark's judge passes a cell when the groups are recovered (ARI 0.9 or more) or FedAvg
reaches 0.95 and the strategy loses at most a point to it. Two kinds of cell ask for what cannot
be had, or nearly: where the groups do not pay, one cluster at FedAvg's accuracy is the right end
and still a miss; where the groups show in no array of one training's updates, a strategy must
find them in more evidence than that (several chained trainings, several rounds), which is
seldom there (the signal is a grade, not a bound). "Passes where decidable" leaves those cells out (their passes too); the last column also
leaves out the cells whose model barely learnt the task in the cell's rounds.

Signal records: {', '.join(f'`{f.name}`' for f in signal_folders) or 'none'} (a cell
without one is never called "no trace"). Each folder's cells ran on the code of its time
(its own README and manifest).

![passes and misses by kind](misses.png)

{markdown(table)}

Where a folder's undecidable cells are more than a tenth of its cells, no strategy reaches 90 %
of them without passing a cell it cannot decide:

{per_folder(records, signal)}

Missed cells by kind:

{listed}

Written by `benchmarks/fuzz_misses.py` from the folders' cell records, which it does not run
again (`manifest.json`: command, versions, machine).
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folders", type=Path, nargs="+", required=True, help="model_fuzz.py results folders")
    parser.add_argument("--signal", type=Path, nargs="*", default=[], help="group_signal.py results folders")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    records, signal = load(args.folders, args.signal)
    config = {"folders": [f.as_posix() for f in args.folders], "signal": [f.as_posix() for f in args.signal]}
    manifest = start_manifest(config, ["benchmarks/fuzz_misses.py", *(argv if argv is not None else sys.argv[1:])])
    table = tally(records, signal)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "misses.json").write_text(json.dumps({"kinds": KINDS, "undecidable": UNDECIDABLE, "hard": HARD,
                                                      "strategies": table},
                                                     indent=1) + "\n")
    figure(table, args.out / "misses.png")
    (args.out / "README.md").write_text(readme(table, args.folders, args.signal, records, signal))
    write_manifest(args.out, manifest, config=config)
    print(markdown(table))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
