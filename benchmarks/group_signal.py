"""Whether the fuzz cells' true groups leave any trace in the clients' updates (``fuzz/signal.py``):
per cell, the best silhouette of the true groups over every trained array, at round 1 and after
four rounds of FedAvg, beside what the strategies did in a fuzz results folder.

    PYTHONPATH=$PWD:$PWD/tests:$PWD/benchmarks python benchmarks/group_signal.py --seeds 10-49 \\
        --judged benchmarks/results/model-fuzz/dev-10-29 --out benchmarks/results/model-fuzz/group-signal

Writes ``signal.json`` (every array's silhouette per cell), ``README.md`` (a row per cell),
``signal.png`` (best silhouette against the strategies that passed) and ``manifest.json``.
A cell already in ``signal.json`` is not run again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402
from fuzz.cell import draw_cell  # noqa: E402
from fuzz.signal import CLEAR, shows_groups  # noqa: E402
from model_fuzz import check_held_out, earlier_runs, parse_seeds  # noqa: E402

CLUSTERED = ("cfl", "layercfl", "hicfl", "fedclust", "adacfl")


def faint(s: dict) -> bool:
    """No clear trace of the groups: the best silhouette below ``CLEAR`` or no higher than chance."""
    return shows_groups(s) is False


def judged_rows(folders: list[Path]) -> dict[int, dict[str, dict]]:
    """seed -> strategy -> row, later folders overriding earlier ones."""
    rows: dict[int, dict[str, dict]] = {}
    for folder in folders:
        for path in sorted((folder / "cells").glob("*.json")):
            record = json.loads(path.read_text())
            rows.setdefault(record["cell"]["seed"], {}).update({r["strategy"]: r for r in record["rows"]})
    return rows


def table(signal: dict[str, dict], rows: dict[int, dict[str, dict]]) -> str:
    lines = ["| seed | cell | FedAvg | oracle | best true-group silhouette (round, array) | chance | "
             "all arrays r1 / r5 | clustered strategies passing |", "|---|---|---|---|---|---|---|---|"]
    for seed in sorted(signal, key=int):
        s, r = signal[seed], rows.get(int(seed), {})
        fedavg, oracle = (r.get(k, {}).get("accuracy") for k in ("fedavg", "oracle"))
        passing = [n for n in CLUSTERED if r.get(n, {}).get("passes")]
        best = "— (IID control)" if s["best"] is None else f"{s['best']:.2f} (r{s['best_round']}, `{s['best_array']}`)"
        together = " / ".join("—" if v is None else f"{v:.2f}" for v in s["all_arrays"].values()) or "—"
        chance = "—" if s["chance"] is None else f"{s['chance']:.2f}" + (" (no trace)" if faint(s) else "")
        lines.append(f"| {seed} | {s['label']} | {fedavg} | {oracle} | {best} | {chance} | {together} | "
                     f"{len(passing)} of {len([n for n in CLUSTERED if n in r])} |")
    return "\n".join(lines)


def figure(signal: dict[str, dict], rows: dict[int, dict[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(s["best"], sum(1 for n in CLUSTERED if rows.get(int(seed), {}).get(n, {}).get("passes")), seed, faint(s))
              for seed, s in signal.items() if s["best"] is not None]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for no_trace, label, colour in ((False, "groups show", "tab:blue"), (True, "no clear trace (below 0.2 or chance)", "tab:red")):
        chosen = [p for p in points if p[3] == no_trace]
        ax.scatter([p[0] for p in chosen], [p[1] for p in chosen], s=18, color=colour, label=label)
    for x, y, seed, _ in points:
        if y < len(CLUSTERED):
            ax.annotate(seed, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_xlabel("best silhouette of the true groups in the clients' updates (any array, round 1 or 5)")
    ax.set_ylabel("clustered strategies passing")
    ax.set_yticks(range(len(CLUSTERED) + 1))
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def readme(signal: dict, rows: dict, manifest: dict, judged: list[Path]) -> str:
    grouped = [s for s in signal.values() if s["best"] is not None]
    none = sorted(int(k) for k, s in signal.items() if faint(s))
    return f"""# Do the groups leave a trace in the updates?

For every cell (`benchmarks/fuzz/cell.py`), each client trains the cell's model once with the
cell's own loop, from the start model (round 1) and from FedAvg's model after four rounds of every
client (round 5). For each trained array, and for all of them together, the silhouette of the
**true** groups under the cosine distance between the clients' updates is scored. It reads the
true groups, so no strategy can use it: it says how far the groups show in one training's
updates. A silhouette near 0 means the groups are as mixed in those updates as clients of one
population. It grades how hard a cell is and is not a bound: a strategy that gathers more
evidence (several chained trainings in its clustering round, updates over several rounds) can
find groups this does not see.
The best over many arrays is itself inflated by luck (a bias of 2 numbers on 6 clients scores
high at random), so each cell also gets its chance level: the 95th percentile of the same best
with the group labels shuffled (100 shuffles). Below {CLEAR}, or no higher than chance, we read
as no clear trace.

{len(none)} of the {len(grouped)} cells with groups show no clear trace on any array in either round:
{", ".join(map(str, none)) or "none"}. Strategies judged from: {", ".join(f"`{p.as_posix()}`" for p in judged) or "none"}.
{code_line(manifest)}

![best true-group silhouette against the clustered strategies passing](signal.png)

{table(signal, rows)}
"""


def code_line(manifest: dict) -> str:
    """The README's line naming the commit that computed signal.json, and the one that rewrote it."""
    line = f"Code: `signal.json` computed at commit `{manifest.get('git', {}).get('commit', '?')}`"
    if manifest.get("earlier_runs"):
        commits = ", ".join(f"`{run.get('git', {}).get('commit', '?')}`" for run in manifest["earlier_runs"])
        line += f" (its earlier cells at {commits})"
    if manifest.get("note"):
        line += f" ({manifest['note']})"
    if manifest.get("report"):
        line += f", this README and the figure rewritten from it at `{manifest['report']['git'].get('commit', '?')}`"
    return line + " (`manifest.json`: command, versions, machine)."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="10-49")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "model-fuzz" / "group-signal")
    parser.add_argument("--judged", type=Path, nargs="*", default=[], help="fuzz results folders (later ones override)")
    parser.add_argument("--held-out", action="store_true")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    check_held_out(seeds, args.held_out)
    lacking = [p.as_posix() for p in args.judged if not (p / "cells").is_dir()]
    if lacking:
        raise SystemExit(f"group_signal: --judged {', '.join(lacking)}: no cells/ folder (a model_fuzz.py --out folder)")
    from fuzz.signal import cell_signal
    from model_matrix.cells import one_thread

    one_thread()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "signal.json"
    signal = json.loads(path.read_text()) if path.exists() else {}
    config = {"seeds": args.seeds, "rounds": [1, 5], "judged": [p.as_posix() for p in args.judged]}
    manifest = start_manifest(config, ["benchmarks/group_signal.py", *(argv if argv is not None else sys.argv[1:])])
    started = time.perf_counter()
    todo = [s for s in seeds if "chance" not in signal.get(str(s), {})]  # a record without one is of older code
    for done, seed in enumerate(todo, 1):
        cell = draw_cell(seed)
        signal[str(seed)] = {"label": cell.label(), **cell_signal(cell)}
        path.write_text(json.dumps(signal, indent=1))
        found = signal[str(seed)]
        said = "— (IID)" if found["best"] is None else f"{found['best']:.2f} (chance {found['chance']:.2f})"
        print(f"[{done}/{len(todo)}] {cell.label()}: best true-group silhouette {said} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    rows = judged_rows(args.judged)
    kept = args.out / "manifest.json"
    if todo or not kept.exists():  # cells added to a signal.json an earlier run began: that run stays on record
        write_manifest(args.out, manifest, config=config, earlier_runs=earlier_runs(args.out))
    else:  # nothing computed: the manifest stays the record of the run that computed signal.json
        record = json.loads(kept.read_text())
        record["report"] = {"git": manifest["git"], "command": manifest["command"], "rewritten": manifest["started"],
                            "judged": config["judged"],
                            "what": "README.md and signal.png rewritten from signal.json (no cell run again)"}
        kept.write_text(json.dumps(record, indent=1) + "\n")
    figure(signal, rows, args.out / "signal.png")
    (args.out / "README.md").write_text(readme(signal, rows, json.loads((args.out / "manifest.json").read_text()),
                                               args.judged))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
