"""What each strategy keeps per client between rounds, at 1,000 to 10,000 clients.

Every strategy of the list is driven directly (no clients run, no training): its asks are
answered with synthetic float32 replies (``bench_scale_speed._answer``: N(0, 0.01²) updates,
10 examples per client, so CFL's ``similarity-decay = auto`` sums updates, its largest
storage) for ``--rounds`` rounds after admitting every client. Splits and merges are held off
(``min-split-round`` past the run) so that what is measured is the state kept while a
cluster is watched. Two measures per row:

- ``arrays_kb_per_client``: the bytes of the NumPy arrays in the strategy's state, beyond
  the cluster models (``theta0``, ``models``, the models kept at splits and in routes,
  IFCA's candidates), per client;
- ``retained_kb_per_client``: tracemalloc's count of everything allocated since before the
  admission and still alive at the end (Python objects included), beyond the cluster
  models, per client.

    PYTHONPATH=$PWD python benchmarks/bench_memory.py            # the table of the results folder
    PYTHONPATH=$PWD python benchmarks/bench_memory.py --quick    # 200 / 400 clients, for a look

Writes ``benchmarks/results/memory/summary.json``, ``README.md`` and ``manifest.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from collections import deque
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
OUT = HERE / "results" / "memory"

BIPARTITIONING = ("cfl", "layercfl", "hicfl")
# fields holding cluster models (not per-client state) and the route entry holding one
MODEL_FIELDS = ("theta0", "models", "split_models", "cluster_start", "candidates")
ROUTE_MODEL = "model"

# (setting whose model is used, clients, strategies, run-config extras); "default" = the
# strategy's defaults (update-storage = auto for the CFL family). The strategies whose storage
# did not change (FedAvg, the oracle, IFCA, FedClust, AdaCFL) were measured at 1,000 and 10,000
# clients by bench_scale_speed.py (results/scale_speed/), and are not measured again here.
ROWS = [
    ("synthetic-rotation-10000", 10000, "cfl,layercfl,hicfl,selection", {}),
    ("mnist-rotation", 2000, "cfl,layercfl,hicfl,selection", {}),
    ("mnist-rotation", 1000, "cfl,layercfl,hicfl", {"update-storage": "exact"}),
]
QUICK_ROWS = [("mnist-rotation", 200, "cfl,layercfl,hicfl", {"update-storage": "exact"}),
              ("mnist-rotation", 400, "cfl,layercfl,hicfl", {"update-storage": "sketch"})]


def array_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of every NumPy array reachable from ``obj`` through dicts, lists, tuples, sets,
    deques, dataclasses and own objects' attributes (each array counted once), skipping
    cluster models (``MODEL_FIELDS`` keys, a route's ``model``)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(array_bytes(v, seen) for k, v in obj.items() if k not in MODEL_FIELDS and k != ROUTE_MODEL)
    if isinstance(obj, (list, tuple, set, frozenset, deque)):
        return sum(array_bytes(v, seen) for v in obj)
    if is_dataclass(obj) and not isinstance(obj, type):
        return sum(array_bytes(getattr(obj, f.name), seen) for f in fields(obj) if f.name not in MODEL_FIELDS)
    if type(obj).__module__.startswith("clusterfed") and hasattr(obj, "__dict__"):
        return array_bytes(vars(obj), seen)
    return 0


def build(strategy_name: str, clients: int, shapes: dict[str, tuple[int, ...]], extra: dict[str, Any]):
    """The strategy with ``clients`` known clients (four true groups, 10 examples each),
    initialised on a zero model of ``shapes``; splits and merges held off. Returns it, the
    client keys and ``rounds(server_round)``: the ``Round`` a driver would hand it (every
    client active, the client table, the train config)."""
    from types import MappingProxyType

    from clusterfed.config import parse_config
    from clusterfed.core.exchange import ClientInfo, Round

    values = {"strategy": strategy_name, "num-clients": clients, "out-dir": "/tmp/unused"}
    if strategy_name in BIPARTITIONING:
        values[f"{strategy_name}.min-split-round"] = 10_000
    values.update({f"{strategy_name}.{k}": v for k, v in extra.items()})
    strategy = parse_config(values).build_strategy()
    train_config = {"lr": 0.05, "local-epochs": 1}
    strategy.init({n: np.zeros(shape, np.float32) for n, shape in shapes.items()}, train_config)
    keys = [str(i) for i in range(clients)]
    table = {key: ClientInfo(key, 10, i % 4) for i, key in enumerate(keys)}

    def rounds(server_round: int) -> Round:
        return Round(server_round, list(keys), dict(train_config), MappingProxyType(table))

    return strategy, keys, rounds


def drive(strategy, keys: list[str], rounds, count: int, seed: int = 0) -> int:
    """Admit ``keys`` and run ``count`` rounds (``rounds(r)``: round r's ``Round``) on synthetic
    replies; returns the bytes of the largest batch of replies."""
    from bench_scale_speed import _answer

    rng = np.random.default_rng(seed)
    uploads = _answer(strategy.admit(rounds(1), keys), rng)
    for server_round in range(1, count + 1):
        uploads = max(uploads, _answer(strategy.round(rounds(server_round)), rng))
    return uploads


def measure(setting: str, strategy_name: str, clients: int, rounds: int, extra: dict[str, Any]) -> dict[str, Any]:
    from bench_scale_speed import model_shapes

    shapes = model_shapes(setting)
    model_bytes = int(sum(np.prod(s) for s in shapes.values()) * 4)
    gc.collect()
    tracemalloc.start()
    strategy, keys, round_of = build(strategy_name, clients, shapes, extra)
    gc.collect()
    base, _ = tracemalloc.get_traced_memory()
    started = time.perf_counter()
    drive(strategy, keys, round_of, rounds)
    seconds = time.perf_counter() - started
    gc.collect()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    kept = current - base - (len(strategy.models) - 1) * model_bytes  # one model existed at base
    storage = getattr(strategy.state, "sketched", None)
    return {"setting": setting, "strategy": strategy_name, "clients": clients, "rounds": rounds,
            "update_storage": extra.get("update-storage", "auto" if strategy_name in BIPARTITIONING else None),
            "sketched": storage, "model_numbers": model_bytes // 4, "clusters": len(strategy.models),
            "arrays_kb_per_client": round(array_bytes(strategy.state) / clients / 1024, 2),
            "retained_kb_per_client": round(kept / clients / 1024, 2), "seconds": round(seconds, 1)}


def key_of(row: dict[str, Any]) -> str:
    """The row's key in summary.json: setting, clients, strategy and storage."""
    storage = row["update_storage"] or "-"
    return f"{row['setting']}-{row['clients']}-{row['strategy']}-{storage}"


def write_readme(rows: list[dict[str, Any]], command: str) -> None:
    lines = ["# Server memory per client between rounds", "",
             f"`{command}` (`benchmarks/bench_memory.py`; numbers in `summary.json`, machine and commit in "
             "`manifest.json`)." + ("" if not (pieces := sorted(OUT.glob("manifest-*.json"))) else
                                      " Rows measured beside it in pieces (`--clients N --out <piece>`, added with "
                                      "`--merge <piece>/summary.json`): " + ", ".join(f"`{p.name}`" for p in pieces)
                                      + "."), "",
             "Each strategy driven with synthetic float32 replies (no training), every client admitted and "
             "then a few rounds with splits and merges held off. *arrays* = the NumPy arrays of the strategy's "
             "state beyond the cluster models; *retained* = everything still allocated (tracemalloc), "
             "Python objects included, beyond the cluster models. `auto` = the default "
             "`update-storage` (exact up to `sketch-above` = 1,000 clients, sketched above).", "",
             "| model numbers | clients | strategy | update-storage | sketched | arrays KB / client | "
             "retained KB / client |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model_numbers']} ({r['setting']}) | {r['clients']} | {r['strategy']} | "
                     f"{r['update_storage'] or '–'} | {'–' if r['sketched'] is None else r['sketched']} | "
                     f"{r['arrays_kb_per_client']} | {r['retained_kb_per_client']} |")
    lines += ["", "## What was and was not re-run", "",
              "- The table above: every row measured by this script (synthetic replies; no training).",
              "- `clustering-mnist-pairs-400/`: CFL and LayerCFL trained at 400 MNIST clients (digit pairs), "
              "seed 0, 12 rounds, once with `update-storage = exact` and once with `sketch` "
              "(`benchmarks/experiments/memory-sketch.toml`; its own `manifest.json`). One seed and fewer rounds "
              "than the scale grids, to fit on 2 shared cores. CFL's sketched run followed the exact one (the same "
              "splits to round 6, ARI within a few hundredths after); LayerCFL's (its conv layer, 25,050 weights, "
              "sketched to 8,192) split differently from its first split on and ended with fewer, mixed clusters "
              "and a lower accuracy (`clustering.json`, `clustering-mnist-pairs-400/comparison.csv`): one seed "
              "cannot tell a systematic loss from the spread between runs, and LayerCFL at scale with compact "
              "storage needs more seeds or a larger `sketch-dim` before it is trusted.",
              "- HiCFL's sampled storage was checked in training only on the synthetic cases of "
              "`tests/test_memory.py` (the same split, in the same round, as exact storage); no HiCFL training run "
              "with it was made here.",
              "- FedAvg, the oracle, IFCA, FedClust and AdaCFL were not measured again: their storage did not "
              "change; their rows (1,000 MNIST and 1,000 / 10,000 digits-CNN clients) are in "
              "`benchmarks/results/scale_speed/` (`results.json`, `memory`).",
              "- The scale grids (`benchmarks/results/scale/`) were not re-run: at 400 and 1,000 clients the "
              "default (`auto`, `sketch-above` = 1,000) keeps the exact storage they ran with, and the "
              "10,000-client grids run FedClust and the references only, whose storage did not change."]
    (OUT / "README.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    global OUT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a few small rows, not written to the results folder")
    parser.add_argument("--update", default="", help="comma-separated strategies: measure only their rows and "
                                                     "replace them in the existing summary.json")
    parser.add_argument("--clients", default="", help="comma-separated client counts: only the rows of the plan "
                                                      "with these (a piece run beside another; --out its folder)")
    parser.add_argument("--out", default=str(OUT), help="results folder (default benchmarks/results/memory)")
    parser.add_argument("--clustering", action="store_true",
                        help="summarise the exact-vs-sketch runs (clustering-*/<label>/seed*/rounds.jsonl, not "
                             "committed) round by round into clustering.json")
    parser.add_argument("--merge", default="", help="a piece's summary.json: add its rows to the results folder's "
                                                    "summary.json (and its manifest as manifest-<piece>.json)")
    args = parser.parse_args()
    from clusterfed.experiments.manifest import start_manifest, write_manifest

    OUT = Path(args.out).resolve()
    if args.clustering:
        (OUT / "clustering.json").write_text(json.dumps(clustering_rounds(OUT), indent=1) + "\n")
        return 0
    if args.merge:
        piece = Path(args.merge).resolve()
        summary = json.loads((OUT / "summary.json").read_text())
        rows = list(summary["rows"].values()) + list(json.loads(piece.read_text())["rows"].values())
        planned = {(setting, clients, name, extra.get("update-storage", "auto" if name in BIPARTITIONING else None))
                   for setting, clients, names, extra in ROWS
                   for name in names.split(",")}
        measured = {(r["setting"], r["clients"], r["strategy"], r["update_storage"]) for r in rows}
        save(rows, summary["rounds"], summary.get("command", "PYTHONPATH=$PWD python benchmarks/bench_memory.py"),
             complete=planned <= measured)
        (OUT / f"manifest-{piece.parent.name}.json").write_text((piece.parent / "manifest.json").read_text())
        return 0

    plan = QUICK_ROWS if args.quick else ROWS
    if args.clients:
        plan = [row for row in plan if str(row[1]) in args.clients.split(",")]
    only = set(args.update.split(",")) if args.update else None
    rows = [] if only is None else [r for r in json.loads((OUT / "summary.json").read_text())["rows"].values()
                                    if r["strategy"] not in only]
    manifest = start_manifest({"rows": plan, "rounds": args.rounds, "update": args.update})
    command = "PYTHONPATH=$PWD python benchmarks/bench_memory.py" + (f" --rounds {args.rounds}" if args.rounds != 3 else "")
    for setting, clients, names, extra in plan:
        for name in names.split(","):
            if only is not None and name not in only:
                continue
            rows.append(measure(setting, name, clients, args.rounds, extra))
            r = rows[-1]
            print(f"{setting:>26} {clients:>6} {name:>9} {str(r['update_storage']):>6}: arrays "
                  f"{r['arrays_kb_per_client']:8.2f} KB/client, retained {r['retained_kb_per_client']:8.2f} "
                  f"KB/client ({r['seconds']} s)", flush=True)
            if not args.quick:  # after every row: a run cut short keeps what it measured
                save(rows, args.rounds, command, complete=len(rows) == sum(len(n.split(",")) for *_, n, _ in plan))
                if only is None:
                    write_manifest(OUT, manifest)
                else:  # the rows measured again later have a manifest of their own
                    write_manifest(OUT, manifest).rename(OUT / f"manifest-update-{'-'.join(sorted(only))}.json")
    return 0


def clustering_rounds(folder: Path) -> dict[str, Any]:
    """Per grid and run label: ARI, number of clusters and mean accuracy of every round."""
    out: dict[str, Any] = {}
    for path in sorted(folder.glob("clustering-*/*/seed*/rounds.jsonl")):
        rounds = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        grid, label, seed = path.parts[-4], path.parts[-3], path.parts[-2]
        out.setdefault(grid, {})[f"{label}-{seed}"] = {
            "ari": [round(r["ari"], 4) for r in rounds], "clusters": [r["num_clusters"] for r in rounds],
            "accuracy": [round(r["accuracy"], 4) for r in rounds],
            "final_ari": round(rounds[-1]["ari"], 4), "final_clusters": rounds[-1]["num_clusters"]}
    return out


def save(rows: list[dict[str, Any]], rounds: int, command: str, complete: bool) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = list({key_of(r): r for r in rows}.values())  # a row measured again replaces the earlier one
    at_10000 = [r["retained_kb_per_client"] for r in rows if r["clients"] == 10000]
    summary = {"rounds": rounds, "complete": complete, "command": command, "rows": {key_of(r): r for r in rows},
               "max_retained_kb_per_client_at_10000": max(at_10000) if at_10000 else None}
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    write_readme(rows, command)


if __name__ == "__main__":
    sys.exit(main())
