"""Flower's aggregators inside each cluster: server optimisers, and robust aggregation under attack.

    PYTHONPATH=$PWD python benchmarks/bench_aggregators.py --rounds 10 --seeds 0,1 --out benchmarks/results/aggregators

Two grids on the built-in digits task (20 clients, in-process engine):

- optimisers: FedClust and CFL on ``digits-pairs`` with the weighted mean (``fedavg``),
  FedAdam and FedAvgM as every cluster's aggregator (each cluster its own optimiser state);
- attacks: FedClust on ``digits-four-pairs`` (five clients per true group) while a fifth of
  the clients (``fault-attackers = 0.2``, the same clients all run) send every update
  sign-flipped (−4 × update) or scaled (4 × update), aggregated by the weighted mean,
  FedTrimmedAvg, Krum or FedMedian per cluster.

Writes results.json (one row per run, with each cluster's final accuracy), summary.json
(means over seeds, plain keys for the docs), table.md, aggregators.png and manifest.json
(``clusterfed.experiments.manifest``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from clusterfed.experiments.manifest import start_manifest, write_manifest

OPTIMISER_SETTING = "digits-pairs"
ATTACK_SETTING = "digits-four-pairs"
OPTIMISER_STRATEGIES = ("fedclust", "cfl")
ATTACK_STRATEGIES = ("fedclust",)
# label -> the run config's aggregator value
OPTIMISERS = {"fedavg": "fedavg", "fedadam": "fedadam(eta=0.01)", "fedavgm": "fedavgm(server_momentum=0.5)"}
ROBUST = {"fedavg": "fedavg", "fedtrimmedavg": "fedtrimmedavg(beta=0.2)", "krum": "krum(num_malicious_nodes=1)",
          "fedmedian": "fedmedian"}
ATTACKS = ("sign-flip", "scale")
ATTACKERS = 0.2
FACTOR = 4.0


def one_run(setting_name: str, strategy: str, label: str, aggregator: str, seed: int, rounds: int,
            attack: str | None) -> dict:
    from clusterfed.config import parse_config
    from clusterfed.experiments.settings import setting
    from clusterfed.faults import is_attacker
    from clusterfed.simulation import simulate

    faults = {"fault-attackers": ATTACKERS, "fault-attack": attack, "fault-attack-factor": FACTOR} if attack else {}
    with tempfile.TemporaryDirectory() as tmp:
        config = parse_config({**setting(setting_name), "strategy": strategy, "rounds": rounds, "seed": seed,
                               "out-dir": tmp, "checkpoint": False, "aggregator": aggregator, **faults})
        started = time.perf_counter()
        summary = simulate(config, engine="inprocess", stream=None)
        rows = [json.loads(line) for line in (Path(tmp) / "rounds.jsonl").read_text().splitlines()]
    last = rows[-1]
    clients = last["client_accuracy"]
    known = {"seed": seed, "fault-attackers": ATTACKERS, "num-clients": config.num_clients}
    attackers = sorted((k for k in map(str, range(config.num_clients)) if attack and is_attacker(known, k)), key=int)
    honest = [v for k, v in clients.items() if k not in attackers]
    fallbacks = sum(len(r.get("aggregator_fallback", {})) for r in rows)
    return {"setting": setting_name, "strategy": strategy, "aggregator": label, "aggregator_config": aggregator,
            "attack": attack, "seed": seed, "final_accuracy": summary["final_accuracy"],
            "honest_accuracy": statistics.mean(honest) if honest else None,
            "worst_cluster_accuracy": min(c["accuracy"] for c in last["clusters"].values()),
            "cluster_accuracy": {c: round(v["accuracy"], 4) for c, v in last["clusters"].items()},
            "cluster_sizes": {c: v["size"] for c, v in last["clusters"].items()},
            "final_ari": summary["final_ari"], "num_clusters": summary["num_clusters"], "attackers": attackers,
            "attackers_evaluated": sum(1 for k in attackers if k in clients),
            "clients_evaluated": len(clients),
            "rejected_replies": summary["rejected"], "failures": summary["failures"],
            "fallback_cluster_rounds": fallbacks, "wall_seconds": round(time.perf_counter() - started, 1)}


def mean_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]  # rows of an older run may lack a key
    return round(statistics.mean(values), 4) if values else None


def cell(rows: list[dict]) -> dict:
    return {"accuracy": mean_of(rows, "final_accuracy"), "honest_accuracy": mean_of(rows, "honest_accuracy"),
            "worst_cluster_accuracy": mean_of(rows, "worst_cluster_accuracy"), "ari": mean_of(rows, "final_ari"),
            "clusters": mean_of(rows, "num_clusters"), "fallback_cluster_rounds": sum(r["fallback_cluster_rounds"] for r in rows),
            "attackers": statistics.mean(len(r["attackers"]) for r in rows) if rows else None,
            "attackers_evaluated": mean_of(rows, "attackers_evaluated"), "rejected_replies": mean_of(rows, "rejected_replies"),
            "runs": len(rows)}


def summarise(rows: list[dict]) -> dict:
    optimisers = {s: {label: cell([r for r in rows if r["attack"] is None and r["strategy"] == s and r["aggregator"] == label])
                      for label in OPTIMISERS} for s in OPTIMISER_STRATEGIES}
    attacks = {a: {s: {label: cell([r for r in rows if r["attack"] == a and r["strategy"] == s and r["aggregator"] == label])
                       for label in ROBUST} for s in ATTACK_STRATEGIES} for a in ATTACKS}
    return {"optimisers": optimisers, "attacks": attacks}


def table(summary: dict, rows: list[dict]) -> str:
    lines = [f"Server optimisers per cluster ({OPTIMISER_SETTING}), mean over seeds:", "",
             "| strategy | aggregator | accuracy | worst cluster | ARI | clusters |", "|---|---|---|---|---|---|"]
    for s, cells in summary["optimisers"].items():
        for label, c in cells.items():
            lines.append(f"| {s} | {OPTIMISERS[label]} | {c['accuracy']:.3f} | {c['worst_cluster_accuracy']:.3f} | "
                         f"{c['ari']:.2f} | {c['clusters']:.1f} |")
    lines += ["", f"Attacks ({ATTACK_SETTING}, {ATTACKERS:.0%} of clients, factor {FACTOR:g}), mean over seeds:", "",
              "| attack | strategy | aggregator | accuracy (all) | accuracy (honest) | worst cluster | ARI | clusters | "
              "fallback cluster-rounds |", "|---|---|---|---|---|---|---|---|---|"]
    for a, by_strategy in summary["attacks"].items():
        for s, cells in by_strategy.items():
            for label, c in cells.items():
                lines.append(f"| {a} | {s} | {ROBUST[label]} | {c['accuracy']:.3f} | {c['honest_accuracy']:.3f} | "
                             f"{c['worst_cluster_accuracy']:.3f} | {c['ari']:.2f} | {c['clusters']:.1f} | "
                             f"{c['fallback_cluster_rounds']} |")
    lines += ["", "Per run (final accuracy / ARI / number of attackers):", ""]
    lines += [f"- {r['strategy']} {r['aggregator']} {r['attack'] or 'clean'} seed {r['seed']}: "
              f"{r['final_accuracy']:.3f} / {r['final_ari']:.2f} / {len(r['attackers'])}"
              + (f" (attackers {', '.join(r['attackers'])}; {r['attackers_evaluated']} evaluated at the end; "
                 f"{r['rejected_replies']} replies rejected)" if r["attack"] else "") for r in rows]
    return "\n".join(lines)


def figure(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def bars(ax, labels: list[str], series: dict[str, list[float]], ylabel: str, title: str) -> None:
        for i, (name, values) in enumerate(series.items()):
            ax.bar([x + 0.38 * i for x in range(len(labels))], values, width=0.36, label=name)
        ax.set_xticks([x + 0.19 for x in range(len(labels))], labels)
        ax.set_ylim(0, 1)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend()

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    bars(axes[0], list(OPTIMISERS),
         {s: [summary["optimisers"][s][label]["accuracy"] for label in OPTIMISERS] for s in OPTIMISER_STRATEGIES},
         "final accuracy", f"server optimisers per cluster ({OPTIMISER_SETTING})")
    bars(axes[1], list(ROBUST),
         {a: [summary["attacks"][a][ATTACK_STRATEGIES[0]][label]["honest_accuracy"] for label in ROBUST] for a in ATTACKS},
         "final accuracy of honest clients", f"{ATTACK_STRATEGIES[0]}, {ATTACKERS:.0%} attackers ({ATTACK_SETTING})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--out", default="benchmarks/results/aggregators")
    parser.add_argument("--table-only", action="store_true", help="rewrite summary, table and figure from results.json")
    parser.add_argument("--only", choices=("optimisers", "attacks"),
                        help="run this grid only, keeping the other grid's rows of results.json (the manifest names "
                             "the commit they came from)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [(OPTIMISER_SETTING, s, label, spec, None) for s in OPTIMISER_STRATEGIES for label, spec in OPTIMISERS.items()]
    runs += [(ATTACK_SETTING, s, label, spec, a) for a in ATTACKS for s in ATTACK_STRATEGIES for label, spec in ROBUST.items()]
    manifest = start_manifest({"optimisers": OPTIMISERS, "robust": ROBUST, "attacks": ATTACKS, "attackers": ATTACKERS,
                               "factor": FACTOR, **vars(args)})
    previous = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else []
    rows = previous if args.table_only else []
    kept = {}
    if args.only and not args.table_only:
        runs = [r for r in runs if (r[4] is None) == (args.only == "optimisers")]
        rows = [r for r in previous if (r["attack"] is None) != (args.only == "optimisers")]
        kept = {"rows_kept_from": json.loads((out / "manifest.json").read_text())["git"],
                "rows_kept": "optimisers" if args.only == "attacks" else "attacks"}
    total = len(rows) + len(runs) * len(seeds)
    for setting_name, strategy, label, spec, attack in runs if not args.table_only else ():
        for seed in seeds:
            rows.append(one_run(setting_name, strategy, label, spec, seed, args.rounds, attack))
            r = rows[-1]
            print(f"[{len(rows)}/{total}] {strategy} {spec} {attack or 'clean'} seed {seed}: acc {r['final_accuracy']:.3f} "
                  f"ARI {r['final_ari']:.2f} ({r['wall_seconds']}s)", flush=True)
            (out / "results.json").write_text(json.dumps(rows, indent=1))
    summary = summarise(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    command = (f"python benchmarks/bench_aggregators.py --rounds {args.rounds} --seeds {args.seeds} --out {args.out}"
               + (f" --only {args.only}" if args.only else ""))
    seeds_of = {grid: ",".join(str(s) for s in sorted({r["seed"] for r in rows if (r["attack"] is None) == clean}))
                for grid, clean in (("optimisers", True), ("attacks", False))}
    (out / "table.md").write_text(f"Digits, 20 clients, {args.rounds} rounds; seeds {seeds_of['optimisers']} "
                                  f"(optimisers), {seeds_of['attacks']} (attacks).\n"
                                  f"Command: `{command}`\n\n{table(summary, rows)}\n")
    figure(summary, out / "aggregators.png")
    if not args.table_only:
        write_manifest(out, manifest, **kept)
    print(table(summary, rows))


if __name__ == "__main__":
    main()
