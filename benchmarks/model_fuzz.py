"""Every strategy on models and data drawn at random: the fuzz harness.

Each seed draws a cell (``benchmarks/fuzz/cell.py``): a model family (MLP, CNN, ResNet-style
with BatchNorm / GroupNorm / no norm, a small vision transformer, a GRU / LSTM reading rows, a
multi-head net), its width, depth, activation, dropout, frozen leading share, the head's place
in the state_dict and auxiliary heads, the optimizer, learning rate and local epochs; the data
(MNIST or scikit-learn's digits), the shift (label swap, rotation, label skew, or an IID control
with no groups), 2–5 groups, 6–40 clients, full or half participation. Every registered
strategy then runs on it with its defaults, stock Flower-style ClientApps (clusterfed's client
helper only where ``strategy.requires()`` names a capability a stock client lacks), on the
in-process grid, and is judged against FedAvg in the same cell. Each train message seeds torch
from the cell, the client, the round and the message's phase and count (``fuzz.run.SeededApp``:
common random numbers), so strategies asking a client the same training draw the same dropout.

    PYTHONPATH=$PWD:$PWD/tests:$PWD/benchmarks python benchmarks/model_fuzz.py --seeds 0-29 --out DIR
    make bench-fuzz SEEDS=0-29                     # into benchmarks/results/model-fuzz/dev

Development seeds are 0–999. Seeds from 1000 on are the held-out range, run once, when the work
they measure is finished: the script refuses them without ``--held-out``. A cell already in
``--out`` (``cells/<seed>.json`` with the same rounds) keeps its rows: only the strategies it
lacks run (``--strategies oracle`` adds the oracle's row to a folder).

Writes to ``--out``: ``cells/<seed>.json`` (the cell and one row per strategy), ``summary.md``,
``summary.csv``, ``summary.json`` (per strategy), ``cells.md`` (every row), ``heatmap.png``,
``README.md`` (with ``NOTES.md``, a person's reading, where the folder has one) and ``manifest.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# tests/ before benchmarks/: tests/model_matrix (the package) shadows benchmarks/model_matrix.py
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402
from fuzz.cell import HELD_OUT_START, draw_cell  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "model-fuzz" / "dev"
DEFAULT_ROUNDS = 10


class HeldOutRefused(SystemExit):
    pass


def parse_seeds(text: str) -> list[int]:
    """``"0-29,40,50-52"`` → the seeds, in order, without repeats."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            first, last = (int(v) for v in part.split("-", 1))
            if last < first:
                raise SystemExit(f"model_fuzz: seed range {part!r} runs backwards")
            seeds.extend(range(first, last + 1))
        else:
            seeds.append(int(part))
    if any(seed < 0 for seed in seeds):
        raise SystemExit("model_fuzz: seeds are >= 0")
    return list(dict.fromkeys(seeds))


def check_held_out(seeds: list[int], held_out: bool) -> None:
    """Refuse held-out seeds (>= 1000) unless ``held_out``; and development seeds with it."""
    late = [s for s in seeds if s >= HELD_OUT_START]
    if late and not held_out:
        raise HeldOutRefused(f"model_fuzz: seeds {late[0]}… are the held-out range (>= {HELD_OUT_START}), run once "
                             f"when the work is done: pass --held-out to run them")
    if held_out and len(late) != len(seeds):
        raise HeldOutRefused(f"model_fuzz: --held-out runs only seeds >= {HELD_OUT_START}")


def check_signal(signal: Path | None) -> None:
    """Refuse a ``--signal`` that is not a ``group_signal.py`` record in this repository, before any work."""
    if signal is None:
        return
    path = Path(signal).resolve()
    if not path.is_file():
        raise SystemExit(f"model_fuzz: --signal {signal}: no such file (benchmarks/group_signal.py writes signal.json)")
    if not path.is_relative_to(ROOT):
        raise SystemExit(f"model_fuzz: --signal {signal}: outside this repository; the manifest names it by its "
                         f"path in the repository")
    try:
        found = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise SystemExit(f"model_fuzz: --signal {signal}: not JSON ({error})") from None
    if not isinstance(found, dict) or any(not isinstance(v, dict) or "chance" not in v for v in found.values()):
        raise SystemExit(f"model_fuzz: --signal {signal}: not a group_signal.py record (seed -> best, chance)")


def seeds_text(seeds: list[int]) -> str:
    """``[0, 1, 2, 4, 5]`` → ``"0-2,4-5"`` (``parse_seeds``'s inverse)."""
    parts: list[str] = []
    for seed in sorted(seeds):
        if parts and seed == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{seed}"
        else:
            parts.append(str(seed))
    return ",".join(parts)


def earlier_record(out: Path, seed: int, rounds: int) -> dict | None:
    """The cell's record already in ``out`` with the same rounds (its rows are kept), or None."""
    path = out / "cells" / f"{seed}.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if record["rounds"] == rounds else None


def finished(out: Path, seed: int, rounds: int, strategies: list[str]) -> bool:
    """Whether ``out`` holds the cell with these rounds and every one of ``strategies``."""
    record = earlier_record(out, seed, rounds)
    return record is not None and set(strategies) <= {r["strategy"] for r in record["rows"]}


def earlier_runs(out: Path) -> list[dict]:
    """The runs that wrote cells into ``out`` before this one (a resumed folder keeps them):
    each one's commit, command, start, end and the cells it had done."""
    path = out / "manifest.json"
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    keep = ("git", "command", "started", "ended", "machine", "cells_done")
    return [*old.get("earlier_runs", []), {k: old[k] for k in keep if k in old}]


def progress(done: int, total: int, record: dict, elapsed: float) -> str:
    parts = []
    for r in record["rows"]:
        mark = "err" if r["error"] else ("ok" if r["passes"] else "miss")
        ari = "-" if r["ari"] is None else f"{r['ari']:.2f}"
        parts.append(f"{r['strategy']} {mark} {ari}/{r['clusters'] if r['clusters'] is not None else '-'}")
    fedavg = record["rows"][0]["accuracy"]
    return (f"[{done}/{total}] {record['label']}: FedAvg {fedavg if fedavg is not None else '-'}; "
            + ", ".join(parts) + f" ({record['seconds']:.0f} s; {elapsed / 60:.1f} min in all)")


def readme(out: Path, records: list[dict], table_md: str, manifest: dict, earlier: dict[str, str] | None = None) -> str:
    from fuzz.run import MAX_LOSS_PP
    from fuzz.signal import CLEAR
    from model_matrix.cells import CEILING, MIN_ARI

    seeds = [rec["cell"]["seed"] for rec in records]
    rounds = sorted({rec["rounds"] for rec in records})
    seconds = [rec["seconds"] for rec in records]
    notes = out / "NOTES.md"  # a person's reading of the numbers, kept across --report-only
    reading = f"\n## What the table shows\n\n{notes.read_text().strip()}\n" if notes.exists() else ""
    held_out = " --held-out" if seeds and min(seeds) >= HELD_OUT_START else ""
    # the folder's own strategies: without them a rerun would add every strategy the folder lacks
    strategies = list(dict.fromkeys(row["strategy"] for rec in records for row in rec.get("rows", [])))
    only = f" --strategies {','.join(strategies)}" if strategies else ""
    only += f" --rounds {rounds[0]}" if rounds and rounds != [DEFAULT_ROUNDS] else ""
    only += f" --judge-at {','.join(earlier)}" if earlier else ""
    # the same runs judged at an earlier round: what a run of that many rounds ends with
    at_rounds = "".join(f"""
## Per strategy after round {r} of the same runs

Each run's clusters and accuracy as they stood after round {r}, judged against FedAvg's and the
oracle's of that round: the clusters and accuracy a run of {r} rounds ends with (no strategy's
decisions read how many rounds are left). Costs (bytes, seconds, trainings) are the whole run's.
A miss is counted as naming its reason when round {r}'s line carries the strategy's own words;
that line lacks what a run's last line adds on why it ends so, so fewer misses name it here than
a {r}-round run's would. Every cell and strategy: `cells-round-{r}.md`.

{table}
""" for r, table in (earlier or {}).items())
    git = manifest.get("git", {})
    commit = git.get("commit", git) if isinstance(git, dict) else git
    return f"""# Every strategy on models and data drawn at random

What ran: `benchmarks/model_fuzz.py` on {len(records)} cells (seeds {seeds_text(seeds)}), each drawn at
random by `benchmarks/fuzz/cell.py` from its seed alone: a model written as an outside user writes
one (an MLP, a CNN, a ResNet-style net with BatchNorm / GroupNorm / no norm, a small vision
transformer, a GRU or LSTM reading image rows, a multi-head net; width, depth, activation,
dropout, a frozen leading share of the trunk, the head first / last / not last in the
state_dict, auxiliary heads), its optimizer, learning rate and local epochs, the data (MNIST or
scikit-learn's digits; 128 training and 64 test images per client), the shift between the true
groups (label swap, rotation, label skew; or an IID control with no groups), 2–5 groups, 6–40
clients, all or half of them trained per round. Every strategy ran {', '.join(map(str, rounds))} rounds with its
defaults (only `fraction_train` set to the cell's participation) and stock Flower-style
ClientApps; a strategy whose `requires()` names a capability a stock client lacks (IFCA's
choice among models, AdaCFL's label statistics) ran with the same task through clusterfed's
client helper (the `client` column of `cells.md`). Code: commit `{commit}` (`manifest.json`: versions,
machine, command). Seconds per cell (all strategies): median {sorted(seconds)[len(seconds) // 2]:.0f},
max {max(seconds):.0f}, on a shared 2-core machine.

How to run it again (a cell already in the folder is skipped):

    PYTHONPATH=$PWD:$PWD/tests:$PWD/benchmarks python benchmarks/model_fuzz.py{held_out} --seeds {seeds_text(seeds)}{only} --out {out.as_posix()}

## How a cell is judged

- accuracy: each client's test accuracy under its own cluster's final model, averaged over the
  clients (a client never placed is served the largest cluster's model); FedAvg's in the same cell
  is the reference;
- **passes**: the clusters recover the true groups (ARI ≥ {MIN_ARI}; in an IID control: one
  cluster), or FedAvg reaches {CEILING} and the strategy loses at most {MAX_LOSS_PP:g} point against it;
  clusters and ARI count the clients the run placed (one never sampled while the run placed
  clients as they came is in no cluster);
- loss vs FedAvg: FedAvg's accuracy minus the strategy's, in percentage points (> 0 is a loss);
- an IID control has no groups: the right answer is one cluster;
- the oracle (clusters given as the true groups, read from the helper's clients) is the second
  reference: a cell where it beats FedAvg by more than {MAX_LOSS_PP:g} point is one where finding the
  groups pays within the cell's rounds (with the IID controls, the "groups help" column); where
  it does not, the task was not learnt far enough in those rounds for the groups to matter;
- the groups show in the updates when the best silhouette of the true groups over the clients'
  updates of any array (round 1, or after four rounds of FedAvg) is at least {CLEAR:g} and above what
  it reaches with the groups shuffled (`benchmarks/group_signal.py`, given as `--signal`; the
  column is "-" without it): where they do not, one training's updates do not tell them apart
  (a grade of how hard the cell is, not a bound: a strategy that gathers more evidence can
  still find them);
- a miss names its reason when the run's last round line carries the strategy's own words
  beyond the driver's counts (what it compared, decided, or why it ended so).

## Per strategy

{table_md}

FedAvg's row is the reference (one cluster: it passes only in IID controls or at the ceiling);
the oracle's, where the folder has one, is the other.
Every cell and strategy: `cells.md`; the raw rows (bytes up/down, trainings per client, the last
round line, the one-cluster reason): `cells/<seed>.json`.

![cells × strategies: ARI, ✓ passes, ✗ misses](heatmap.png)
{at_rounds}{reading}"""


def report(out: Path, manifest: dict | None = None, signal: Path | None = None) -> list[dict]:
    """The tables, heat map and README of ``out``; ``signal``: a ``group_signal.py`` folder's
    ``signal.json`` for the column of cells whose groups show in the updates (kept in the
    manifest for later reports)."""
    from fuzz.report import at_round, heatmap, judged_rounds, load_records, markdown, write_tables

    records = load_records(out)
    if not records:
        return []
    manifest = manifest or json.loads((out / "manifest.json").read_text())
    if signal is not None:  # checked (check_signal) before the manifest names it
        manifest["signal"] = Path(signal).resolve().relative_to(ROOT).as_posix()
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    found = json.loads((ROOT / manifest["signal"]).read_text()) if manifest.get("signal") else None
    table = write_tables(out, records, found)
    heatmap(records, out / "heatmap.png")
    earlier = {r: markdown(write_tables(out, at_round(records, r), found, suffix=f"-round-{r}"))
               for r in judged_rounds(records)}
    (out / "README.md").write_text(readme(out, records, markdown(table), manifest, earlier))
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-9", help="seeds and ranges: 0-29,40,50-52 (development: 0-999)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--strategies", default=None, help="comma-separated (default: every registered one the "
                                                          "harness runs; FedAvg always runs first)")
    parser.add_argument("--judge-at", default="", help="rounds before the last at which every run is judged too "
                                                        "(comma-separated; what a run of that many rounds ends with)")
    parser.add_argument("--held-out", action="store_true", help=f"run held-out seeds (>= {HELD_OUT_START}): once, at the end")
    parser.add_argument("--report-only", action="store_true", help="rewrite the tables, figure and README from --out")
    parser.add_argument("--signal", type=Path, default=None, help="a group_signal.py signal.json: the pass share "
                                                                     "where the groups show in the updates")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    check_held_out(seeds, args.held_out)
    check_signal(args.signal)
    if args.report_only:
        report(args.out, signal=args.signal)
        print(f"rewrote the report in {args.out}")
        return
    import logging

    from fuzz.run import STRATEGIES, run_cell
    from model_matrix.cells import one_thread

    strategies = ["fedavg", *[s for s in (args.strategies.split(",") if args.strategies else STRATEGIES)
                              if s and s != "fedavg"]]
    try:
        judge_at = tuple(sorted({int(r) for r in args.judge_at.split(",") if r.strip()}))
    except ValueError:
        judge_at = (0,)  # not a round: refused below, with the value given
    if any(not 0 < r < args.rounds for r in judge_at):
        raise SystemExit(f"model_fuzz: --judge-at {args.judge_at}: rounds from 1 to {args.rounds - 1} (before the last)")
    config = {"seeds": args.seeds, "rounds": args.rounds, "strategies": strategies, "held_out": args.held_out,
              **({"judge_at": list(judge_at)} if judge_at else {})}
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = start_manifest(config, ["benchmarks/model_fuzz.py", *(argv if argv is not None else sys.argv[1:])])
    earlier = earlier_runs(args.out)
    logging.getLogger("flwr").setLevel(logging.CRITICAL)
    one_thread()
    started, todo = time.perf_counter(), [s for s in seeds if not finished(args.out, s, args.rounds, strategies)]
    print(f"{len(seeds) - len(todo)} of {len(seeds)} cells already in {args.out}; running {len(todo)}", flush=True)
    for done, seed in enumerate(todo, 1):
        record = run_cell(draw_cell(seed), strategies, args.rounds, args.out,
                          earlier=earlier_record(args.out, seed, args.rounds), judge_at=judge_at)
        print(progress(done, len(todo), record, time.perf_counter() - started), flush=True)
        write_manifest(args.out, manifest, config=config, earlier_runs=earlier, cells_done=sorted(
            int(p.stem) for p in (args.out / "cells").glob("*.json")))
    write_manifest(args.out, manifest, config=config, earlier_runs=earlier,
                   cells_done=sorted(int(p.stem) for p in (args.out / "cells").glob("*.json")))
    report(args.out, json.loads((args.out / "manifest.json").read_text()), args.signal)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
