"""Would pooling each client's updates over the rounds it trained show the true groups better than
its latest update (what a revisit cuts at partial participation)? A probe on fuzz cells: FedAvg
runs the cell's rounds at the cell's participation, each sampled client's update of every
trainable array (from round 2 on) is kept, and three rows per client are cut into as many
clusters as the cell has groups (average linkage, cosine distance): its latest update, the mean
of its last two (unit) updates, the mean of all of them. Each view is scored by the true groups'
silhouette and the cut's ARI against them.

    PYTHONPATH=$PWD:$PWD/tests:$PWD/benchmarks python benchmarks/update_pooling.py --seeds 18,56 \\
        --out benchmarks/results/model-fuzz/dev-update-pooling

It reads the true groups and is given their number, so it bounds what a view could give a
strategy; nothing in the product may read it. Development seeds only (0–999).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402

VIEWS = ("latest", "last two", "all")


def pooled_views(history: list[np.ndarray]) -> dict[str, np.ndarray]:
    """A client's rows by view, from its updates in the order it trained: the latest, the mean of
    the last two and of all, each update scaled to unit length first (a round's update norm
    shrinks as the model learns; the direction is what the cosine cut reads)."""
    unit = [u / max(float(np.linalg.norm(u)), 1e-12) for u in history]
    return {"latest": history[-1], "last two": np.mean(unit[-2:], axis=0), "all": np.mean(unit, axis=0)}


def view_scores(rows: np.ndarray, groups: list[int], k: int) -> dict[str, float]:
    """The true ``groups``' silhouette under the cosine distance between ``rows`` and the ARI of
    their average-linkage cut into ``k`` clusters."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from sklearn.metrics import adjusted_rand_score, silhouette_score
    from sklearn.metrics.pairwise import cosine_distances

    cut = fcluster(linkage(rows, "average", metric="cosine"), k, "maxclust")
    return {"silhouette": round(float(silhouette_score(cosine_distances(rows), groups, metric="precomputed")), 3),
            "ari": round(float(adjusted_rand_score(groups, cut)), 2)}


def histories(cell, rounds: int) -> dict[int, list[np.ndarray]]:
    """Each client's updates (every trainable array, flattened) in the rounds 2 to ``rounds`` it
    was sampled in, under FedAvg at ``cell``'s participation (a seeded sample each round)."""
    import torch

    from fuzz.models import build_model
    from fuzz.signal import apply_mean_update, client_updates

    torch.manual_seed(cell.seed)
    model = build_model(cell)
    rng = np.random.default_rng(cell.seed)
    kept: dict[int, list[np.ndarray]] = {c: [] for c in range(cell.clients)}
    for server_round in range(1, rounds + 1):
        sampled = sorted(int(c) for c in rng.choice(cell.clients, max(1, round(cell.clients * cell.participation)),
                                                    replace=False))
        updates = client_updates(cell, model, sampled)
        if server_round >= 2:
            for client, update in zip(sampled, updates):
                kept[client].append(np.concatenate([a.ravel() for a in update.values()]).astype(np.float64))
        apply_mean_update(model, updates)
    return kept


def cell_record(seed: int, rounds: int) -> dict:
    """One cell's scores per view, over the clients that trained at least once after round 1."""
    from fuzz.cell import draw_cell
    from fuzz.data import true_groups

    cell = draw_cell(seed)
    kept, groups = histories(cell, rounds), true_groups(cell)
    seen = [c for c in sorted(kept) if kept[c]]
    views = [pooled_views(kept[c]) for c in seen]
    truth = [groups[c] for c in seen]
    return {"seed": seed, "family": cell.family, "shift": cell.shift, "groups": cell.groups,
            "clients": cell.clients, "participation": cell.participation, "clients_seen": len(seen),
            "mean_trainings": round(float(np.mean([len(kept[c]) for c in seen])), 2),
            "views": {v: view_scores(np.stack([x[v] for x in views]), truth, cell.groups) for v in VIEWS}}


def summary(records: list[dict], min_ari: float = 0.9) -> dict:
    """Per view: the cells whose cut recovers the groups (ARI >= ``min_ari``), the mean ARI and
    silhouette; and, against the latest update, the cells each view gains and loses."""
    out = {}
    for view in VIEWS:
        ari = [r["views"][view]["ari"] for r in records]
        out[view] = {"recovered": sum(a >= min_ari for a in ari), "mean_ari": round(float(np.mean(ari)), 3),
                     "mean_silhouette": round(float(np.mean([r["views"][view]["silhouette"] for r in records])), 3),
                     "gains": [r["seed"] for r in records if r["views"][view]["ari"] >= min_ari > r["views"]["latest"]["ari"]],
                     "losses": [r["seed"] for r in records if r["views"]["latest"]["ari"] >= min_ari > r["views"][view]["ari"]]}
    return out


def readme(out: Path, records: list[dict], totals: dict, manifest: dict, rounds: int) -> str:
    """The folder's README: the views' totals, the figure, every cell, then ``out``'s NOTES.md."""
    lines = ["# Pooling a client's updates over its rounds: a probe", "",
             f"What ran: `benchmarks/update_pooling.py` on {len(records)} development cells (`manifest.json`: "
             f"command, commit `{manifest['git']['commit']}`, versions, machine): FedAvg for {rounds} rounds at "
             "each cell's participation; per client that trained after round 1, its latest update, the mean of its "
             "last two and the mean of all its (unit) updates, each cut into as many clusters as the cell has "
             "groups (average linkage, cosine). The number of groups is given and the true groups score the "
             "cut: a bound on what each view could give a strategy, not a strategy's result.", "",
             "| view | cells whose cut recovers the groups (ARI ≥ 0.9) | mean ARI | mean true-group silhouette | "
             "gains over the latest update | losses |", "|---|---|---|---|---|---|"]
    for view, t in totals.items():
        lines.append(f"| {view} | {t['recovered']} of {len(records)} | {t['mean_ari']:.2f} | "
                     f"{t['mean_silhouette']:.3f} | {', '.join(map(str, t['gains'])) or '—'} | "
                     f"{', '.join(map(str, t['losses'])) or '—'} |")
    lines += ["", "![ARI of each view per cell](pooling.png)", "", "Every cell (`pooling.json` has the same):", "",
              "| seed | cell | trainings per client (mean) | " + " | ".join(f"{v}: ARI / silhouette" for v in VIEWS) + " |",
              "|---|---|---|" + "---|" * len(VIEWS)]
    for r in records:
        cells = " | ".join(f"{r['views'][v]['ari']:.2f} / {r['views'][v]['silhouette']:.2f}" for v in VIEWS)
        lines.append(f"| {r['seed']} | {r['family']}, {r['shift']}, {r['groups']} groups × {r['clients']} clients, "
                     f"participation {r['participation']} | {r['mean_trainings']} | {cells} |")
    notes = out / "NOTES.md"
    return "\n".join(lines) + "\n" + (f"\n{notes.read_text()}" if notes.exists() else "")


def figure(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 0.3 * len(records)), 3.2))
    x = np.arange(len(records))
    for i, view in enumerate(VIEWS):
        ax.bar(x + (i - 1) * 0.27, [r["views"][view]["ari"] for r in records], 0.27, label=view)
    ax.axhline(0.9, color="k", lw=0.6, ls="--")
    ax.set_xticks(x, [str(r["seed"]) for r in records], rotation=90, fontsize=7)
    ax.set_ylabel("ARI of the cut (k = groups)")
    ax.set_xlabel("development cell (seed)")
    ax.legend(fontsize=7, ncol=3, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    from model_fuzz import parse_seeds

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", required=True, help="development seeds, e.g. 18,56,100-120")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    if any(s >= 1000 for s in seeds) or args.rounds < 3:
        parser.error("seeds must be development seeds (0-999) and --rounds at least 3")
    config = {"seeds": seeds, "rounds": args.rounds}
    manifest = start_manifest(config, ["benchmarks/update_pooling.py", *(argv if argv is not None else sys.argv[1:])])
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for i, seed in enumerate(seeds, 1):
        records.append(cell_record(seed, args.rounds))
        print(f"[{i}/{len(seeds)}] #{seed}: " + ", ".join(
            f"{v} ARI {records[-1]['views'][v]['ari']:.2f}" for v in VIEWS), flush=True)
    totals = summary(records)
    (args.out / "pooling.json").write_text(json.dumps({"cells": records, "summary": totals}, indent=1) + "\n")
    figure(records, args.out / "pooling.png")
    write_manifest(args.out, manifest, config=config)
    (args.out / "README.md").write_text(readme(args.out, records, totals, manifest, args.rounds))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
