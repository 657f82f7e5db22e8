"""The model matrix: users' own models and ClientApps against every clustered strategy.

Models (tests/model_matrix/models.py: an MLP, a BatchNorm ResNet-style CNN, a GRU, a
Transformer encoder, an MLP with a 0-d buffer, a float16 MLP, and a client behaving as
Flower's quickstart-pytorch one on CIFAR-shaped data; then the models written as outside
users write them: a MobileNetV2-style CNN, a frozen backbone under a trainable head, a
classifier whose head precedes an auxiliary decoder, an Embedding + LSTM, and the
quickstart client at its example's lr 0.1) × shifts (concept: a label
permutation per group; covariate: a per-group input transform) × strategies (FedAvg as the
reference; FedClust, AdaCFL(share_label_stats=False), CFL, LayerCFL, HiCFL with the stock
ClientApp; IFCA and AdaCFL through clusterfed's client helper). 12 clients in 3 groups,
15 rounds, each cell in-process through the users' own ServerApp ``main``.

    PYTHONPATH=$PWD:$PWD/tests python benchmarks/model_matrix.py            # or: make bench-models
    PYTHONPATH=$PWD:$PWD/tests python benchmarks/model_matrix.py --models gru --strategies fedavg,cfl
    PYTHONPATH=$PWD:$PWD/tests python benchmarks/model_matrix.py --models user --out DIR   # the users' models only

``--models``, ``--shifts`` and ``--strategies`` choose the cells (FedAvg, the reference, always
runs); the README written names the command that reruns exactly those cells. ``--before DIR``
(an earlier run of the same cells, e.g. on other code) adds a before → after table to the
README, also with ``--report-only``.

Writes to ``--out`` (default benchmarks/results/model-matrix): ``cells.json`` (one row per
cell), ``README.md`` (the table), ``summary.json`` (the verdict counts), ``matrix.png`` (ARI and accuracy gain over FedAvg as
heatmaps) and ``manifest.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402
from model_matrix.cells import (CEILING, MIN_ARI, MIN_GAIN, MODEL_NAMES, NUM_CLIENTS, ROUNDS,  # noqa: E402
                                SPLITTING_ROUNDS, STRATEGY_NAMES, USER_MODELS, Cell, one_thread, rounds_for, run_cell,
                                verdict)
from model_matrix.data import NUM_GROUPS, SHIFTS  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "model-matrix"


def names(text: str, allowed: tuple[str, ...], what: str,
          aliases: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The comma-separated names of ``text``, an alias standing for its names."""
    chosen = [alias for name in text.split(",") if name.strip()
              for alias in (aliases or {}).get(name.strip(), (name.strip(),))]
    unknown = [name for name in chosen if name not in allowed]
    if unknown:
        raise SystemExit(f"model_matrix: unknown {what} {', '.join(unknown)} (one of {', '.join(allowed)})")
    return chosen


def run_matrix(models, shifts, strategies, rounds: int | None) -> list[dict]:
    """Every cell, FedAvg first in each (model, shift) row, run for as many rounds as the
    longest cell so that each cell is compared with FedAvg after as many rounds as it ran;
    one progress line per cell."""
    strategies = ["fedavg", *[s for s in strategies if s != "fedavg"]]
    total, rows, started = len(models) * len(shifts) * len(strategies), [], time.perf_counter()
    for model in models:
        for shift in shifts:
            fedavg_curve: dict[int, float] = {}
            for strategy in strategies:
                cell_rounds = rounds or (max(map(rounds_for, strategies)) if strategy == "fedavg" else
                                         rounds_for(strategy))
                cell, _ = run_cell(model, shift, strategy, rounds=cell_rounds)
                if strategy == "fedavg":
                    fedavg_curve = cell.accuracy_by_round
                fedavg_accuracy = fedavg_curve.get(cell_rounds)
                row = {**cell.row(), "fedavg_accuracy": fedavg_accuracy,
                       "gain": None if cell.accuracy is None or fedavg_accuracy is None
                       else round(cell.accuracy - fedavg_accuracy, 4),
                       "verdict": verdict(cell, fedavg_accuracy)}
                rows.append(row)
                print(progress(len(rows), total, row, time.perf_counter() - started), flush=True)
    return rows


def progress(done: int, total: int, row: dict, elapsed: float) -> str:
    accuracy = "-" if row["accuracy"] is None else f"{row['accuracy']:.3f}"
    ari = "-" if row["ari"] is None else f"{row['ari']:.2f}"
    text = (f"[{done:3d}/{total}] {row['model']} × {row['shift']} × {row['strategy']}: accuracy {accuracy} "
            f"(FedAvg {row['fedavg_accuracy']}), ARI {ari}, {row['clusters'] or '-'} cluster(s), {row['verdict']} "
            f"({row['seconds']:.1f} s, {trainings_text(row)} trainings per client; {elapsed / 60:.1f} min in all)")
    return text + (f"\n      {row['reason']}" if row["reason"] else "")


def fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def trainings_text(row: dict) -> str:
    """``25 (11)``: train messages per client over the run (in the round with the most); ``-``
    in a run from before they were counted."""
    if row.get("trainings") is None:
        return "-"
    return f"{row['trainings']:g} ({row['peak_trainings']:g})"


def table(rows: list[dict]) -> str:
    lines = ["| model | shift | strategy | client | rounds | trainings per client (most in one round) | accuracy | "
             "FedAvg | gain | ARI | clusters | compared (where named) | verdict | one-cluster reason, miss reason or error |",
             "|---" * 14 + "|"]
    for row in rows:
        reason = (row["reason"] or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {row['model']} | {row['shift']} | {row['strategy']} | {row['client']} | {row['rounds']} | "
                     f"{trainings_text(row)} | {fmt(row['accuracy'])} | {fmt(row['fedavg_accuracy'])} | "
                     f"{fmt(row['gain'])} | "
                     f"{fmt(row['ari'], 2)} | {row['clusters'] if row['clusters'] is not None else '-'} | "
                     f"{', '.join(row.get('compared') or [])} | {row['verdict']} | {reason} |")
    return "\n".join(lines)


def verdict_counts(rows: list[dict]) -> dict[str, int]:
    """How many cells (FedAvg's reference cells aside) got each verdict, most first."""
    counts: dict[str, int] = {}
    for row in rows:
        if row["strategy"] != "fedavg":
            counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def write_summary(rows: list[dict], out: Path) -> None:
    """summary.json: the verdict counts, for docs to bind (``counts`` keyed by a slug of
    the verdict: holds, fedavg_at_ceiling, fails, refused)."""
    counts = verdict_counts(rows)
    slugs = {verdict.split(":")[0].lower().replace(" ", "_"): n for verdict, n in counts.items()}
    (out / "summary.json").write_text(json.dumps({"cells": sum(counts.values()), "counts": slugs, "verdicts": counts},
                                                 indent=1) + "\n")


def cell_text(row: dict | None) -> str:
    if row is None:
        return "not run"
    return (f"{fmt(row['accuracy'])} / {fmt(row['ari'], 2)} / {row['clusters'] if row['clusters'] is not None else '-'}"
            f" / {trainings_text(row)}")


def comparison(rows: list[dict], before: Path) -> str:
    """The before → after section: each cell's accuracy / ARI / clusters and verdict in
    ``before``'s cells.json and in ``rows``."""
    earlier_rows = json.loads((before / "cells.json").read_text())["cells"]
    earlier = {(r["model"], r["shift"], r["strategy"]): r for r in earlier_rows}
    lines = [f"## Before → after\n\nBefore: `{before.as_posix()}` (its `manifest.json` says which code). "
             "Each cell: accuracy / ARI / clusters / trainings per client (most in one round).\n",
             "| model | shift | strategy | before | after | verdict before → after | accuracy change |",
             "|---" * 7 + "|"]
    for row in rows:
        old = earlier.get((row["model"], row["shift"], row["strategy"]))
        change = "-" if old is None or None in (old["accuracy"], row["accuracy"]) else \
            f"{row['accuracy'] - old['accuracy']:+.3f}"
        lines.append(f"| {row['model']} | {row['shift']} | {row['strategy']} | {cell_text(old)} | {cell_text(row)} | "
                     f"{old['verdict'] if old else '-'} → {row['verdict']} | {change} |")
    return "\n".join(lines) + "\n"


def readme(rows: list[dict], command: str, seconds: float, before: Path | None = None) -> str:
    counts = verdict_counts(rows)
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    return f"""# The model matrix: your model and your ClientApp against each clustered strategy

Numbers from `cells.json` beside this file (`manifest.json`: commit, versions, machine load).
{NUM_CLIENTS} clients in {NUM_GROUPS} groups (client i is in group i mod {NUM_GROUPS}), 64 training and 32 test
examples each, one local epoch of SGD with momentum 0.9 a round, the last round's evaluation
accuracy averaged over the clients by `num-examples` after the cell's rounds (by default {ROUNDS};
{SPLITTING_ROUNDS['cfl']} for CFL, LayerCFL and HiCFL, which split one cluster in two at a time), FedAvg's after as
many rounds. ARI: the clusters against the true groups. Trainings per client: the train messages
each client's ClientApp got (a stock client trains once per message), averaged over the
clients, the most in one round in brackets (where a chained clustering step shows).
Generated by `{command}` in {seconds / 60:.1f} min.
The same cells on other code (a checkout of it, the folder of your choice):
`{rerun_command(rows)}`.

A cell **holds** when its clusters recover the groups (ARI ≥ {MIN_ARI}) and its accuracy beats
FedAvg's by at least {MIN_GAIN}. Where FedAvg itself reaches {CEILING} (one model fits every group,
as a CNN does with rotated images) there is no margin to win: such a cell reads **FedAvg at
ceiling** if it loses at most 0.02 (its ARI then says whether it split anyway), else **fails**.
A strategy that needs the client helper (IFCA; AdaCFL's label statistics) is
refused before round 1 with a stock client: that is its true stop reason.

Cells: {summary}.

{table(rows)}

![ARI and accuracy gain over FedAvg per cell](matrix.png)
""" + ("" if before is None else "\n" + comparison(rows, before))


def rerun_command(rows: list[dict], out: str = "OUT") -> str:
    """The command that runs exactly the models, shifts and strategies of ``rows`` into ``out``."""
    chosen = {key: ",".join(dict.fromkeys(row[key] for row in rows)) for key in ("model", "shift", "strategy")}
    return (f"PYTHONPATH=$PWD:$PWD/tests python benchmarks/model_matrix.py --models {chosen['model']} "
            f"--shifts {chosen['shift']} --strategies {chosen['strategy']} --out {out}")


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    strategies = [s for s in dict.fromkeys(r["strategy"] for r in rows) if s != "fedavg"]
    lines = list(dict.fromkeys((r["model"], r["shift"]) for r in rows))
    by_cell = {(r["model"], r["shift"], r["strategy"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.1 * len(strategies) * 2, 1.2 + 0.42 * len(lines)))
    for ax, key, title, cmap, limits in ((axes[0], "ari", "ARI vs the true groups", "viridis", (0, 1)),
                                         (axes[1], "gain", "accuracy − FedAvg's", "RdBu", (-0.7, 0.7))):
        values = np.full((len(lines), len(strategies)), np.nan)
        for i, (model, shift) in enumerate(lines):
            for j, strategy in enumerate(strategies):
                value = by_cell.get((model, shift, strategy), {}).get(key)
                if value is not None:
                    values[i, j] = value
                    dark = value < 0.45 if key == "ari" else abs(value) > 0.45
                    ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
        ax.imshow(values, cmap=cmap, vmin=limits[0], vmax=limits[1], aspect="auto")
        ax.set_xticks(range(len(strategies)), strategies, rotation=40, ha="right", fontsize=8)
        ax.set_yticks(range(len(lines)), [f"{m} · {s}" for m, s in lines], fontsize=8)
        ax.set_title(title + " (blank: stopped)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_again(out: Path, before: Path | None = None) -> None:
    """README.md and matrix.png again from ``out``'s cells.json and manifest.json."""
    rows = json.loads((out / "cells.json").read_text())["cells"]
    for row in rows:
        cell = Cell(**{key: row[key] for key in Cell.__dataclass_fields__ if key in row})
        row["verdict"] = verdict(cell, row["fedavg_accuracy"])
    manifest = json.loads((out / "manifest.json").read_text())
    command = "python " + " ".join(manifest["command"])
    (out / "README.md").write_text(readme(rows, command, manifest["wall_seconds"], before))
    write_summary(rows, out)
    figure(rows, out / "matrix.png")
    print(f"rewrote {out / 'README.md'}, summary.json and {out / 'matrix.png'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--models", default=",".join(MODEL_NAMES),
                        help=f"from {', '.join(MODEL_NAMES)}; 'user' for {', '.join(USER_MODELS)}")
    parser.add_argument("--shifts", default=",".join(SHIFTS))
    parser.add_argument("--strategies", default=",".join(STRATEGY_NAMES), help=f"from {', '.join(STRATEGY_NAMES)}")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"rounds for every cell (default: {ROUNDS}; {SPLITTING_ROUNDS} for CFL's family)")
    parser.add_argument("--before", type=Path, default=None,
                        help="a folder of an earlier run of the same cells: README.md adds a before → after table")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite README.md, summary.json and matrix.png from --out's cells.json (verdicts recomputed)")
    args = parser.parse_args(argv)
    if args.report_only:
        report_again(args.out, args.before)
        return
    models = names(args.models, MODEL_NAMES, "model", {"user": USER_MODELS})
    shifts = names(args.shifts, SHIFTS, "shift")
    strategies = names(args.strategies, STRATEGY_NAMES, "strategy")
    config = {"models": models, "shifts": shifts, "strategies": strategies, "rounds": args.rounds or {"default": ROUNDS, **SPLITTING_ROUNDS},
              "num_clients": NUM_CLIENTS, "num_groups": NUM_GROUPS}
    manifest = start_manifest(config)
    logging.getLogger("flwr").setLevel(logging.CRITICAL)  # the progress lines are the log
    one_thread()
    started = time.perf_counter()
    rows = run_matrix(models, shifts, strategies, args.rounds)
    seconds = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cells.json").write_text(json.dumps({"config": config, "cells": rows}, indent=1) + "\n")
    command = "python benchmarks/model_matrix.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "README.md").write_text(readme(rows, command.strip(), seconds, args.before))
    write_summary(rows, args.out)
    figure(rows, args.out / "matrix.png")
    write_manifest(args.out, manifest, config=config)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
