"""Why the clustered strategies miss on the random-model benchmark: every miss of every given
``model_fuzz.py`` results folder sorted into one kind (the first that applies, in the order of
``KINDS``), pooled over the folders, beside the pass share with the misses left out that end as a
strategy should when it cannot tell (one cluster at FedAvg's accuracy where the groups do not pay
or show no trace in the updates).

    PYTHONPATH=$PWD:$PWD/tests:$PWD/benchmarks python benchmarks/fuzz_misses.py \\
        --folders benchmarks/results/model-fuzz/held-out benchmarks/results/model-fuzz/held-out-1060-1089 \\
        --signal benchmarks/results/model-fuzz/held-out-signal --out benchmarks/results/model-fuzz/held-out-misses

Reads each folder's ``cells/*.json``, each signal folder's ``signal.json``
(``group_signal.py``) and, where a folder has a ``<folder>-before`` sibling (the same cells run
on the code before the clustering-decision work), that folder's cells; writes ``misses.json``,
``README.md`` (the tables: misses by kind, the code before beside, pass shares by cell trait), ``misses.png``, ``where.png`` and ``manifest.json``. Runs no cell.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402
from fuzz.report import LEARNT, at_round, informative_cell, learnt_cell, load_records, visible_cell  # noqa: E402
from fuzz.run import MAX_LOSS_PP  # noqa: E402
from model_fuzz import check_signal  # noqa: E402

CLUSTERED = ("fedclust", "adacfl", "cfl", "layercfl", "hicfl")
# the rounds every pooled cell is judged at (the held-out ranges' budget); a folder run longer
# with ``--judge-at`` this round is read as it stood then (``pooled_view``)
POOLED_ROUNDS = 10
# a miss's kind, the first that applies; the three after iid_split are misses that end as a
# strategy should when it cannot tell: one cluster, within a point of FedAvg
KINDS = {
    "error": "the run failed (its error is in the cell record)",
    "iid_split": "an IID control split (its right answer is one cluster)",
    "groups_do_not_pay": "one cluster at FedAvg's accuracy where the oracle (clusters given as the true groups) "
                         "beats FedAvg by 1 point or less: the right end, scored a miss",
    "no_trace": "one cluster at FedAvg's accuracy where the true groups show no clear trace in any array of one "
                "training's updates (group_signal.py: a grade, not a bound)",
    "not_learnt": f"one cluster at FedAvg's accuracy where FedAvg stayed below {LEARNT} in the cell's rounds: the "
                  "model barely learnt the task",
    "too_few_clusters": "fewer clusters than groups (a split refused, deferred or waiting)",
    "too_many_clusters": "more clusters than groups",
    "wrong_cut": "as many clusters as groups, but not the groups (ARI < 0.9)",
}
# misses left out of the pass share beside the plain one, and with them the not-learnt ones
EXCUSED = ("groups_do_not_pay", "no_trace")
HARD = ("not_learnt",)
# the cell traits the passes are broken down by (``where_they_miss``): a cell record -> its value
TRAITS = {
    "shift": lambda record: record["cell"]["shift"],
    "family": lambda record: record["cell"]["family"],
    "participation": lambda record: _participation(record["cell"]["participation"]),
    "dataset": lambda record: record["cell"]["dataset"],
    "FedAvg learnt": lambda record: _learnt(record),
}


def _participation(fraction: float) -> str:
    if fraction >= 1:
        return "all clients"
    return "half the clients" if fraction == 0.5 else f"{fraction:.0%} of the clients"


def _learnt(record: dict) -> str:
    if not any(r["strategy"] == "fedavg" and r.get("accuracy") is not None for r in record["rows"]):
        return "no FedAvg row"
    return f"yes (>= {LEARNT})" if learnt_cell(record) else f"no (< {LEARNT})"


def pooled_view(records: list[dict]) -> list[dict]:
    """The records at the pooled tables' budget, ``POOLED_ROUNDS``: a cell run longer and judged
    at that round too (``model_fuzz.py --judge-at``) is read as it stood then (``fuzz.report.at_round``:
    what a run of that many rounds ends with); other records as they are."""
    key = str(POOLED_ROUNDS)
    return [{**at_round([record], key)[0], "judged_from": record["rounds"]}
            if record.get("rounds", POOLED_ROUNDS) != POOLED_ROUNDS and key in record.get("groups_help_at_round", {})
            else record for record in records]


def load(folders: list[Path], signal_folders: list[Path]) -> tuple[list[dict], dict]:
    """The cell records of ``folders`` (a seed in two folders: the later one; ``pooled_view``) and
    the signal records (each checked by ``model_fuzz.check_signal``), or one message before
    anything is written."""
    records: dict[int, dict] = {}
    for folder in folders:
        found = pooled_view(load_records(folder))
        if not found:
            raise SystemExit(f"fuzz_misses: {folder}: no cells/*.json (a model_fuzz.py --out folder)")
        records.update((record["cell"]["seed"], {**record, "folder": folder.name}) for record in found)
    signal: dict = {}
    for folder in signal_folders:
        check_signal(folder / "signal.json")
        signal.update(json.loads((folder / "signal.json").read_text()))
    return [records[s] for s in sorted(records)], signal


def load_before(folders: list[Path]) -> dict[int, dict]:
    """The cell records of each folder's ``<folder>-before`` sibling, where it has one, by seed
    (tagged with the folder they stand beside): the same cells on the code before."""
    before: dict[int, dict] = {}
    for folder in folders:
        sibling = folder.parent / f"{folder.name}-before"
        for record in load_records(sibling) if (sibling / "cells").is_dir() else []:
            before[record["cell"]["seed"]] = {**record, "folder": folder.name}
    return before


def outcome(pairs: list[tuple[dict, dict]]) -> dict:
    """Over (cell record, row) pairs: the passes, the IID controls and those ending as one
    cluster, and the cells ending more than ``MAX_LOSS_PP`` points below FedAvg."""
    iid = [r for rec, r in pairs if rec["cell"]["shift"] == "iid"]
    return {"passes": sum(1 for _, r in pairs if r["passes"]), "iid_controls": len(iid),
            "iid_one_cluster": sum(1 for r in iid if r.get("clusters") == 1),
            "below_fedavg": sum(1 for _, r in pairs if (r.get("loss_pp") or 0.0) > MAX_LOSS_PP)}


def before_and_after(records: list[dict], before: dict[int, dict]) -> list[dict]:
    """Per clustered strategy, over the cells where both the code before (``before``) and the
    folders' code ran it: the cells and each code's ``outcome``."""
    table = []
    for name in CLUSTERED:
        now = [(rec, r) for rec, r in rows_of(records, name)
               if any(b["strategy"] == name for b in before.get(rec["cell"]["seed"], {}).get("rows", []))]
        if not now:
            continue
        then = rows_of([before[rec["cell"]["seed"]] for rec, _ in now], name)
        table.append({"strategy": name, "cells": len(now), "before": outcome(then), "now": outcome(now)})
    return table


def before_markdown(table: list[dict]) -> str:
    lines = ["| strategy | cells run by both | passes: before → now | IID controls one cluster: before → now | "
             f"cells more than {MAX_LOSS_PP:g} point below FedAvg: before → now |", "|---|---|---|---|---|"]
    for row in table:
        b, n = row["before"], row["now"]
        lines.append(f"| {row['strategy']} | {row['cells']} | {_of(b['passes'], row['cells'])} → "
                     f"{_of(n['passes'], row['cells'])} | {b['iid_one_cluster']} → {n['iid_one_cluster']} of "
                     f"{n['iid_controls']} | {b['below_fedavg']} → {n['below_fedavg']} |")
    return "\n".join(lines)


_CODE_OF_BLOB: dict[str, str] = {}  # a file's git blob -> its code without docstrings (blobs recur across commits)


def _code_of(source: bytes) -> str:
    """A module's ``ast`` dump with every docstring left out (comments the parser drops)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def code_fingerprint(commit: str, package: str = "clusterfed") -> str | None:
    """A hash of ``package``'s Python code at ``commit`` with its docstrings and comments left
    out: two commits whose strategies differ only in words hash alike. None when git cannot read
    the commit (a shallow clone, no git)."""
    def git(*args: str, stdin: bytes | None = None) -> bytes:
        return subprocess.run(["git", "-C", str(ROOT), *args], input=stdin, capture_output=True, check=True).stdout

    try:
        files = sorted((path, sha) for line in git("ls-tree", "-r", commit, package).decode().splitlines()
                       for meta, path in [line.split("\t", 1)] for sha in [meta.split()[2]] if path.endswith(".py"))
        missing = [sha for _, sha in files if sha not in _CODE_OF_BLOB]
        if missing:  # one cat-file for every blob not read yet: "<sha> blob <size>\n<content>\n" each
            out, at = git("cat-file", "--batch", stdin="\n".join(missing).encode() + b"\n"), 0
            for sha in missing:
                header_end = out.index(b"\n", at)
                size = int(out[at:header_end].split()[2])
                _CODE_OF_BLOB[sha] = _code_of(out[header_end + 1:header_end + 1 + size])
                at = header_end + 1 + size + 1
    except (subprocess.CalledProcessError, FileNotFoundError, SyntaxError, IndexError, ValueError):
        return None
    digest = hashlib.sha256()
    for path, sha in files:
        digest.update(f"{path}\0{_CODE_OF_BLOB[sha]}\0".encode())
    return digest.hexdigest()


def by_code(records: list[dict], commits: dict[str, str], before: dict[int, dict]) -> list[dict]:
    """The folders grouped by the strategies' code they ran (``code_fingerprint`` of each
    folder's commit; a folder whose code cannot be read stands alone), in the order of their
    first folder: per group its folders, commits and cells, and per clustered strategy its cells
    and ``outcome`` (``before``: the code before's on those of its cells it ran, with the group's
    own ``outcome`` on the same cells as ``now``)."""
    fingerprints = {folder: code_fingerprint(commit) if commit else None for folder, commit in commits.items()}
    groups: dict[str, list[str]] = {}
    for folder in dict.fromkeys(rec["folder"] for rec in records):
        groups.setdefault(fingerprints.get(folder) or f"folder:{folder}", []).append(folder)
    out = []
    for folders in groups.values():
        mine = [rec for rec in records if rec["folder"] in folders]
        strategies = {}
        for name in CLUSTERED:
            rows = rows_of(mine, name)
            if rows:
                then = rows_of([before[rec["cell"]["seed"]] for rec, _ in rows if rec["cell"]["seed"] in before], name)
                both = {rec["cell"]["seed"] for rec, _ in then}
                now_there = [(rec, r) for rec, r in rows if rec["cell"]["seed"] in both]
                strategies[name] = {"cells": len(rows), **outcome(rows), "share": outcome(rows)["passes"] / len(rows),
                                    "before": {"cells": len(then), **outcome(then), "now": outcome(now_there)}
                                    if then else None}
        out.append({"folders": folders, "commits": [commits.get(f, "") for f in folders], "cells": len(mine),
                    "strategies": strategies})
    return out


def by_code_markdown(groups: list[dict]) -> str:
    names = [n for n in CLUSTERED if any(n in g["strategies"] for g in groups)]
    lines = ["| folders | commits | cells | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for g in groups:
        cells = []
        for name in names:
            row = g["strategies"].get(name)
            if row is None:
                cells.append("—")
                continue
            then = row["before"]
            cells.append(_of(row["passes"], row["cells"])
                         + (f"; before: {then['passes']} of {then['cells']}" if then else ""))
        shown = ", ".join(f"`{f}`" for f in g["folders"])
        lines.append(f"| {shown} | {', '.join(c[:7] for c in g['commits'])} | {g['cells']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cell_kind(record: dict, signal: dict) -> str | None:
    """Why no decision may be asked of a grouped cell: ``groups_do_not_pay``, ``no_trace`` or
    ``not_learnt`` (the first that holds), else None (an IID control: None)."""
    if record["cell"]["shift"] == "iid":
        return None
    if informative_cell(record) is False:
        return "groups_do_not_pay"
    if visible_cell(record, signal) is False:
        return "no_trace"
    return None if learnt_cell(record) else "not_learnt"


def miss_kind(record: dict, row: dict, signal: dict) -> str:
    """The kind of a missed row (``KINDS``, the first that applies): a cell's kind counts only for a
    row that ended as one cluster within a point of FedAvg; any other ending is the strategy's."""
    if row.get("error") or row.get("clusters") is None:
        return "error"
    if record["cell"]["shift"] == "iid":
        return "iid_split"
    groups = len(set(record["true_groups"]))
    excused = cell_kind(record, signal)
    if excused and row["clusters"] == 1 and (row.get("loss_pp") or 0.0) <= MAX_LOSS_PP:
        return excused
    if row["clusters"] < groups:
        return "too_few_clusters"
    return "too_many_clusters" if row["clusters"] > groups else "wrong_cut"


def rows_of(records: list[dict], name: str) -> list[tuple[dict, dict]]:
    """Each record holding a row of strategy ``name``, with that row."""
    return [(rec, r) for rec in records for r in rec["rows"] if r["strategy"] == name]


def ran(records: list[dict]) -> list[str]:
    """The clustered strategies with a row in any of ``records``, in ``CLUSTERED``'s order."""
    return [name for name in CLUSTERED if rows_of(records, name)]


def tally(records: list[dict], signal: dict) -> list[dict]:
    """Per strategy: cells, passes, misses by kind, the passes in cells of an excused kind, and the
    pass share with the excused misses (and the not-learnt ones) left out."""
    table = []
    for name in CLUSTERED:
        rows = rows_of(records, name)
        if not rows:
            continue
        missed = [(rec["cell"]["seed"], miss_kind(rec, r, signal)) for rec, r in rows if not r["passes"]]
        kinds = Counter(kind for _, kind in missed)
        passes = sum(1 for _, r in rows if r["passes"])
        excused = sum(kinds[k] for k in EXCUSED)
        table.append({"strategy": name, "cells": len(rows), "passes": passes, "share": passes / len(rows),
                      "misses": {k: kinds.get(k, 0) for k in KINDS},
                      "passes_in_excused_cells": sum(1 for rec, r in rows
                                                     if r["passes"] and cell_kind(rec, signal) in EXCUSED),
                      "judged_cells": len(rows) - excused,
                      "judged_learnt_cells": len(rows) - excused - sum(kinds[k] for k in HARD),
                      "missed_cells": {k: sorted(seed for seed, kind in missed if kind == k) for k in KINDS}})
    return table


def any_passes(records: list[dict]) -> tuple[int, int]:
    """The cells where at least one clustered strategy passes, and the cells with a clustered
    strategy's row: the pass share of the strategies taken together, each cell by its best."""
    cells = [rec for rec in records if any(r["strategy"] in CLUSTERED for r in rec["rows"])]
    return sum(1 for rec in cells if any(r["strategy"] in CLUSTERED and r["passes"] for r in rec["rows"])), len(cells)


def where_they_miss(records: list[dict]) -> list[dict]:
    """Per value of each of ``TRAITS`` (sorted by cells): the cells and, per clustered strategy,
    its cells and passes there."""
    out = []
    for trait, value_of in TRAITS.items():
        values = Counter(value_of(rec) for rec in records)
        for value, cells in sorted(values.items(), key=lambda item: (-item[1], item[0])):
            mine = [rec for rec in records if value_of(rec) == value]
            strategies = {name: {"cells": len(rows), "passes": sum(1 for _, r in rows if r["passes"])}
                          for name in CLUSTERED if (rows := rows_of(mine, name))}
            out.append({"trait": trait, "value": value, "cells": cells, "strategies": strategies})
    return out


def _where_names(where: list[dict]) -> list[str]:
    """The clustered strategies with a share in ``where``, in ``CLUSTERED``'s order."""
    return [n for n in CLUSTERED if any(n in w["strategies"] for w in where)]


def where_markdown(where: list[dict]) -> str:
    names = _where_names(where)
    lines = ["| trait | cells | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for w in where:
        shares = [_of(w["strategies"][n]["passes"], w["strategies"][n]["cells"]) if n in w["strategies"] else "—"
                  for n in names]
        lines.append(f"| {w['trait']}: {w['value']} | {w['cells']} | " + " | ".join(shares) + " |")
    return "\n".join(lines)


def where_figure(where: list[dict], path: Path) -> None:
    """A heat map of the pass shares: a row per trait value, a column per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = _where_names(where)
    share = np.array([[w["strategies"][n]["passes"] / w["strategies"][n]["cells"] if n in w["strategies"] else np.nan
                       for n in names] for w in where])
    fig, ax = plt.subplots(figsize=(6.5, 0.32 * len(where) + 1.2))
    shown = ax.imshow(share, cmap="RdYlGn", vmin=0.3, vmax=1.0, aspect="auto")
    fig.colorbar(shown, ax=ax, label="share passed (30 % and below alike)", shrink=0.6)
    for (i, j), value in np.ndenumerate(share):
        if not np.isnan(value):
            ax.text(j, i, f"{value:.0%}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_yticks(range(len(where)), [f"{w['trait']}: {w['value']} ({w['cells']})" for w in where], fontsize=7)
    ax.set_title("share of each strategy's cells passed, by cell trait (all cells in brackets)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def per_folder(records: list[dict], signal: dict, commits: dict[str, str] | None = None,
               before: dict[int, dict] | None = None) -> str:
    """A row per folder: the commit its cells ran on (``commits``: folder name -> commit), its
    cells, those where the groups do not pay, show no trace (with a signal record), and whose
    model did not learn, and each clustered strategy's passes, with the code before's on the
    same cells in brackets where ``before`` (seed -> record) ran that strategy on all of them."""
    commits, before = commits or {}, before or {}
    names = ran(records)
    lines = ["| folder | commit | cells | groups do not pay | no trace | signal record | "
             "not learnt (of the other grouped cells) | " + " | ".join(names) + " | any of them |",
             "|---|---|---|---|---|---|---|" + "---|" * (len(names) + 1)]
    for folder in dict.fromkeys(rec["folder"] for rec in records):
        mine = [rec for rec in records if rec["folder"] == folder]
        of_cell = [(rec["cell"]["seed"], cell_kind(rec, signal)) for rec in mine]
        kinds = {k: [seed for seed, kind in of_cell if kind == k] for k in ("groups_do_not_pay", "no_trace", "not_learnt")}
        shown = {k: f"{len(v)}" + (f" ({', '.join(map(str, v))})" if v and k != "not_learnt" else "")
                 for k, v in kinds.items()}
        has_signal = any(str(rec["cell"]["seed"]) in signal for rec in mine)
        passes = [_passes(mine, name, before) for name in names]
        passed, judged = any_passes(mine)
        together = passed if judged else "—"
        lines.append(f"| `{folder}` | {commits.get(folder, '')[:7]} | {len(mine)} | {shown['groups_do_not_pay']} | "
                     f"{shown['no_trace']} | {'yes' if has_signal else 'no (none counted)'} | {shown['not_learnt']} | "
                     + " | ".join(passes) + f" | {together} |")
    return "\n".join(lines)


def _passes(mine: list[dict], name: str, before: dict[int, dict]) -> str:
    """A folder's passes of strategy ``name`` ("—" where it did not run), then in brackets the code
    before's on the same cells where it ran them all."""
    rows = rows_of(mine, name)
    if not rows:
        return "—"
    then = rows_of([before[rec["cell"]["seed"]] for rec in mine if rec["cell"]["seed"] in before], name)
    shown = str(sum(1 for _, r in rows if r["passes"]))
    return shown + (f" ({sum(1 for _, r in then if r['passes'])})" if len(then) == len(rows) else "")


def markdown(table: list[dict]) -> str:
    lines = ["| strategy | cells | passes | passes where the groups do not pay or show no trace | "
             + " | ".join(k.replace("_", " ") for k in KINDS)
             + " | passes with the excused misses left out | and the not-learnt ones |",
             "|---|---|---|---|" + "---|" * len(KINDS) + "---|---|"]
    for row in table:
        share = row["passes"] / row["cells"]
        lines.append(f"| {row['strategy']} | {row['cells']} | {row['passes']} ({share:.0%}) | "
                     f"{row['passes_in_excused_cells']} | "
                     + " | ".join(str(row["misses"][k]) for k in KINDS)
                     + f" | {_of(row['passes'], row['judged_cells'])} | {_of(row['passes'], row['judged_learnt_cells'])} |")
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
    colours = ["#000000", "#b2182b", "#aaaaaa", "#c8c8c8", "#e0e0e0", "#d95f02", "#7570b3", "#e7298a"]
    for kind, colour in zip(KINDS, colours):
        width = [row["misses"][kind] for row in table]
        ax.barh(names, width, left=left, color=colour, label=kind.replace("_", " "))
        left = [a + b for a, b in zip(left, width)]
    ax.invert_yaxis()
    ax.set_xlabel("cells")
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(1.0, 0.0))
    ax.set_title("passes and misses by kind (grey: one cluster at FedAvg's accuracy in a cell of that kind)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def folder_commits(folders: list[Path]) -> dict[str, str]:
    """Each folder's commit, from its ``manifest.json`` (none: left out)."""
    out = {}
    for folder in folders:
        manifest = folder / "manifest.json"
        if manifest.exists():
            out[folder.name] = json.loads(manifest.read_text()).get("git", {}).get("commit", "")
    return out


def readme(table: list[dict], where: list[dict], folders: list[Path], signal_folders: list[Path], records: list[dict],
           signal: dict, before: dict[int, dict] | None = None) -> str:
    before = before or {}
    compared = before_and_after(records, before)
    groups = by_code(records, folder_commits(folders), before)
    before_folders = sorted({rec["folder"] for rec in before.values()})
    before_commits = sorted(set(folder_commits([f.parent / f"{f.name}-before" for f in folders
                                                if f.name in before_folders]).values()))
    then = (f"""
## The code before, on the same cells

{len(before_folders)} of the folders have a `-before` sibling: the same cells run on the code before
the clustering-decision work (commit{'s' if len(before_commits) > 1 else ''} {', '.join(f'`{c[:7]}`' for c in before_commits)}; each sibling's manifest says how it
ran: the later ones give that code the benchmark's seeding of each client's training). Over the
cells both ran, each strategy's passes, IID controls ending as one cluster, and cells ending more
than {MAX_LOSS_PP:g} point below FedAvg:

{before_markdown(compared)}
""" if compared else "")
    kinds = "\n".join(f"- **{k.replace('_', ' ')}**: {v}" for k, v in KINDS.items())
    commits = folder_commits(folders)
    listed = "\n".join(f"- {row['strategy']}: " + "; ".join(
        f"{k.replace('_', ' ')} {', '.join(map(str, seeds))}" for k, seeds in row["missed_cells"].items() if seeds)
                       for row in table)
    longer = sorted({rec["folder"] for rec in records if rec.get("judged_from")})
    read_at = (f" Every cell is judged at round {POOLED_ROUNDS}: "
               f"{', '.join(f'`{name}`' for name in longer)} ran longer and "
               f"{'is' if len(longer) == 1 else 'are'} read as each run stood after round {POOLED_ROUNDS} "
               "(what a run of that many rounds ends with; its own README gives the longer runs).") if longer else ""
    return f"""# Why the clustered strategies miss

Every miss of the clustered strategies in {len(folders)} results folders ({len(records)} cells,
{', '.join(f'`{f.name}`' for f in folders)}), each sorted into the first kind that applies.{read_at}

{kinds}

The benchmark's judge passes a cell when the groups are recovered (ARI 0.9 or more) or FedAvg
reaches 0.95 and the strategy loses at most a point to it. Three kinds of miss end as a strategy
should when it cannot tell, one cluster within a point of FedAvg, in cells where that is the right
end or nearly: where the groups do not pay (the judge asks for them anyway); where they show no
clear trace in any array of one training's updates (a grade, not a bound: a strategy that gathers
more evidence can still find them, and some did: a column counts the passes in cells where the
groups do not pay or show no trace); where the model barely learnt its task. A strategy that
split such a cell wrongly, or lost more than a point, is counted by what it did. The two last
columns leave the first two of those kinds of miss out of the cells, then the third as well.

Signal records: {', '.join(f'`{f.name}`' for f in signal_folders) or 'none'} (a cell
without one is never called "no trace"). Each folder's cells ran on the code of its time
(its own README and manifest).

![passes and misses by kind](misses.png)

{markdown(table)}

Taken together, each cell by the best of them, the clustered strategies pass
{_of(*any_passes(records))} cells: a cell that none of them passes is missed by every rule here,
whichever of the strategies that ran a user picks (each folder's, on its commit).

How many cells of each folder are of those kinds (a folder without a signal record counts no
cell as without a trace; "not learnt" counts the grouped cells where FedAvg stayed below
{LEARNT} that are of neither kind before it), and each strategy's passes there (a range of 30
cells moves by a few cells from draw to draw; each folder on the code of its commit; in brackets,
where the folder has a `-before` sibling, the code before's passes on the same cells):

{per_folder(records, signal, commits, before)}

The same, pooled over the folders that ran the same strategies' code (the `clusterfed` package's
code at the folder's commit, docstrings and comments aside: folders apart in time share a row when
only words changed between them), the pass share of each, and after it the code before's passes
over those of the cells it ran:

{by_code_markdown(groups)}
{then}
## Where they miss

The share of cells each strategy passes, by a trait of the cell. Read it as where to look, not
as a measure: the folders ran on {len(set(commits.values()))} commits, pooled here; a strategy
missing from a folder (the CFL family from `held-out-1210-1239`) leaves its column over fewer
cells (the "cells" column counts all); the traits overlap (many rotation cells are also cells whose model
barely learnt), and each row is a plain share, not adjusted for the others.

![pass shares by cell trait](where.png)

{where_markdown(where)}

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
    before = load_before(args.folders)
    config = {"folders": [f.as_posix() for f in args.folders], "signal": [f.as_posix() for f in args.signal]}
    manifest = start_manifest(config, ["benchmarks/fuzz_misses.py", *(argv if argv is not None else sys.argv[1:])])
    table = tally(records, signal)
    where = where_they_miss(records)
    args.out.mkdir(parents=True, exist_ok=True)
    together, cells = any_passes(records)
    (args.out / "misses.json").write_text(json.dumps({"kinds": KINDS, "excused": EXCUSED, "hard": HARD,
                                                      "strategies": table, "where_they_miss": where,
                                                      "before_and_after": before_and_after(records, before),
                                                      "by_code": by_code(records, folder_commits(args.folders), before),
                                                      "any_of_them": {"cells": cells, "passes": together,
                                                                      "share": together / cells if cells else None}},
                                                     indent=1) + "\n")
    figure(table, args.out / "misses.png")
    where_figure(where, args.out / "where.png")
    (args.out / "README.md").write_text(readme(table, where, args.folders, args.signal, records, signal, before))
    write_manifest(args.out, manifest, config=config)
    print(markdown(table))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
