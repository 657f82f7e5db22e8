"""Which layers' updates separate the true groups? (LayerCFL's claim: conv for feature skew,
fc for label skew.)

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_layer_separation.py --settings rotation,label-swap,label-groups,shards \
        --seeds 0,1,2 --rounds 30 --workers 2

Digits, 20 clients, digits-cnn, FedAvg dynamics (one cluster, never split), so every layer set
is judged on the same updates. From round 2 on, for each layer set (``conv`` = last conv
layer, ``fc`` = first linear layer, ``final`` = output layer, ``all``), on the cosine
similarity of the clients' updates of that round:

- ``pure``: the complete-linkage bi-partition (CFL's proposal) puts no true group on both
  sides;
- ``best_cut_ari``: ARI against the true groups of the best-silhouette cut into 2..6 clusters;
- ``true_silhouette``: silhouette of the true grouping on ``1 − S`` (how separated the groups
  are in that layer, whatever the clustering does).

Writes ``benchmarks/results/layer_separation.json``: records and, per setting and
layer set, the fraction of rounds with a pure proposal and the mean of the two scores.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform
from sklearn.metrics import adjusted_rand_score, silhouette_score

ROOT = Path(__file__).resolve().parent

from clusterfed.experiments import settings as registry  # noqa: E402
from clusterfed.clustering.bipartition import bipartition  # noqa: E402
from clusterfed.clustering.split_scores import best_cut_silhouette, cosine_similarity_matrix  # noqa: E402
from clusterfed.config import parse_config  # noqa: E402
from clusterfed.models import select_layers  # noqa: E402
from clusterfed.simulation import simulate  # noqa: E402
from clusterfed.clustering.vectors import flatten  # noqa: E402
from clusterfed.strategies import cfl  # noqa: E402

LAYER_SETS = ("conv", "fc", "final", "all")
MAX_CUT = 6
RECORDS: list[dict] = []


def instrumented(original):
    def decide(tree, state, server_round, cluster, replies, decision, clients, reports, **given):
        if server_round >= 2 and len(replies) >= 3:
            keys = [r.key for r in replies]
            groups = np.array([clients[k].true_group for k in keys])
            for layer_set in LAYER_SETS:
                names = select_layers(state.theta0, layer_set)
                S = cosine_similarity_matrix(np.stack([flatten(r.update, names) for r in replies]))
                a, b = bipartition(S)
                D = np.clip(1.0 - S, 0.0, 2.0)
                np.fill_diagonal(D, 0.0)
                score, k = best_cut_silhouette(S, MAX_CUT)
                labels = (fcluster(linkage(squareform(D, checks=False), method="complete"), t=k, criterion="maxclust")
                          if k > 1 else np.zeros(len(keys)))
                RECORDS.append({
                    "round": server_round, "layers": layer_set, "names": names,
                    "pure": not (set(groups[a]) & set(groups[b])),
                    "best_cut_silhouette": score, "best_cut_k": k,
                    "best_cut_ari": float(adjusted_rand_score(groups, labels)),
                    "true_silhouette": float(silhouette_score(D, groups, metric="precomputed")),
                })
        return original(tree, state, server_round, cluster, replies, decision, clients, reports, **given)

    return decide


def one_run(job: tuple[str, int, int]) -> list[dict]:
    setting, seed, rounds = job
    if not getattr(cfl.decide, "instrumented", False):  # once per worker process (CFL builds its tree with it)
        cfl.decide = instrumented(cfl.decide)
        cfl.decide.instrumented = True
    RECORDS.clear()
    values = {"strategy": "cfl", "num-clients": 20, "rounds": rounds, "seed": seed,
              "out-dir": tempfile.mkdtemp(prefix="layer-separation-"), "min-split-round": rounds + 1,
              **registry.setting(setting)}
    simulate(parse_config(values), engine="inprocess", stream=None)
    print(f"done {setting} seed {seed}: {len(RECORDS)} records", flush=True)
    return [{"setting": setting, "seed": seed, **r} for r in RECORDS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default="rotation,label-swap,label-groups,shards")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "results" / "layer_separation.json"))
    args = parser.parse_args(argv)
    jobs = [(s, int(seed), args.rounds) for s in args.settings.split(",") for seed in args.seeds.split(",")]
    with get_context("fork").Pool(args.workers) as pool:
        records = [r for rows in pool.map(one_run, jobs, chunksize=1) for r in rows]
    summary: dict[str, dict] = {}
    for setting in dict.fromkeys(r["setting"] for r in records):
        for layer_set in LAYER_SETS:
            rows = [r for r in records if r["setting"] == setting and r["layers"] == layer_set]
            summary[f"{setting}/{layer_set}"] = {
                "rounds": len(rows),
                "pure_fraction": float(np.mean([r["pure"] for r in rows])),
                "best_cut_ari_mean": float(np.mean([r["best_cut_ari"] for r in rows])),
                "true_silhouette_mean": float(np.mean([r["true_silhouette"] for r in rows])),
            }
    out = {
        "command": "python benchmarks/bench_layer_separation.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "layers": {r["layers"]: r["names"] for r in records},
        "summary": summary,
        "records": records,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'setting/layers':24s} {'pure':>6s} {'cut ARI':>8s} {'true sil':>9s}")
    for name, s in summary.items():
        print(f"{name:24s} {s['pure_fraction']:6.2f} {s['best_cut_ari_mean']:8.3f} {s['true_silhouette_mean']:9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
