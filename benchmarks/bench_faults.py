"""Accuracy and ARI under client faults: fedclust, cfl and hicfl on digits label-swap.

    PYTHONPATH=$PWD python benchmarks/bench_faults.py --rounds 50 --seeds 0,1,2 --out benchmarks/results/faults_label_swap

Each total fault rate is split equally over the four kinds (the client raises, NaN/Inf
weights, wrong shape or missing/extra array, a reply later than the timeout; the late
ones wait on the in-process engine's virtual clock). Writes results.json (one row per
strategy × rate × seed), manifest.json (``clusterfed.experiments.manifest``) and table.md
(mean ± population std over seeds, ``clusterfed.experiments.stats``, and the change from the
clean run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from clusterfed.experiments.manifest import start_manifest, write_manifest
from clusterfed.experiments.stats import mean_std

STRATEGIES = ("fedclust", "cfl", "hicfl")
RATES = (0.0, 0.1, 0.2, 0.4)


def one_run(strategy: str, rate: float, seed: int, rounds: int) -> dict:
    from clusterfed.config import parse_config
    from clusterfed.experiments.settings import setting
    from clusterfed.simulation import simulate

    each = rate / 4
    with tempfile.TemporaryDirectory() as tmp:
        config = parse_config({**setting("digits-label-swap"), "strategy": strategy, "rounds": rounds,
                               "seed": seed, "out-dir": tmp, "checkpoint": False, "timeout": 600, "fault-delay": 1000,
                               "fault-rate": each, "fault-nan-rate": each, "fault-shape-rate": each,
                               "fault-slow-rate": each, "target-coverage": 0.5})
        started = time.perf_counter()
        summary = simulate(config, engine="inprocess", stream=None)
    return {"strategy": strategy, "fault_rate": rate, "seed": seed, "final_accuracy": summary["final_accuracy"],
            "final_ari": summary["final_ari"], "num_clusters": summary["num_clusters"], "faults": summary["faults"],
            "failures": summary["failures"], "rejected": summary["rejected"],
            "wall_seconds": round(time.perf_counter() - started, 1)}


def table(rows: list[dict]) -> str:
    lines = ["| strategy | fault rate | final accuracy | Δ vs clean (pp) | ARI | faults counted (per run) |",
             "|---|---|---|---|---|---|"]
    for strategy in STRATEGIES:
        clean = [r["final_accuracy"] for r in rows if r["strategy"] == strategy and r["fault_rate"] == 0]
        for rate in RATES:
            sel = [r for r in rows if r["strategy"] == strategy and r["fault_rate"] == rate]
            if not sel:
                continue
            acc = [r["final_accuracy"] for r in sel]
            ari = [r["final_ari"] for r in sel]
            counted = statistics.mean(sum(r["faults"].values()) for r in sel)
            delta = 100 * (statistics.mean(acc) - statistics.mean(clean)) if clean else float("nan")
            lines.append(f"| {strategy} | {rate:.0%} | {mean_std(acc).format(3)} | {delta:+.1f} | "
                         f"{statistics.mean(ari):.2f} | {counted:.0f} |")
    lines += ["", "Per seed (final accuracy / ARI):", "", "| strategy | fault rate | " +
              " | ".join(f"seed {s}" for s in sorted({r['seed'] for r in rows})) + " |",
              "|---|---|" + "---|" * len({r['seed'] for r in rows})]
    for strategy in STRATEGIES:
        for rate in RATES:
            sel = sorted((r for r in rows if r["strategy"] == strategy and r["fault_rate"] == rate),
                         key=lambda r: r["seed"])
            if sel:
                lines.append(f"| {strategy} | {rate:.0%} | " + " | ".join(
                    f"{r['final_accuracy']:.3f} / {r['final_ari']:.2f}" for r in sel) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="benchmarks/results/faults_label_swap")
    parser.add_argument("--table-only", action="store_true", help="rewrite table.md from results.json")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = json.loads((out / "results.json").read_text()) if args.table_only else []
    manifest = start_manifest({"strategies": STRATEGIES, "rates": RATES, **vars(args)})
    seeds = [int(s) for s in args.seeds.split(",")]
    total = len(STRATEGIES) * len(RATES) * len(seeds)
    for strategy in STRATEGIES if not args.table_only else ():
        for rate in RATES:
            for seed in seeds:
                rows.append(one_run(strategy, rate, seed, args.rounds))
                r = rows[-1]
                print(f"[{len(rows)}/{total}] {strategy} rate {rate:.0%} seed {seed}: acc {r['final_accuracy']:.3f} "
                      f"ARI {r['final_ari']:.2f} faults {r['faults']} ({r['wall_seconds']}s)", flush=True)
                (out / "results.json").write_text(json.dumps(rows, indent=1))
    command = f"python benchmarks/bench_faults.py --rounds {args.rounds} --seeds {args.seeds} --out {args.out}"
    (out / "table.md").write_text(f"Digits, label-swap, 20 clients, {args.rounds} rounds, seeds {args.seeds}.\n"
                                  f"Command: `{command}`\n\n{table(rows)}\n")
    if not args.table_only:
        write_manifest(out, manifest)
    print(table(rows))


if __name__ == "__main__":
    main()
