"""Server-side clustering cost versus the number of clients.

Synthetic partial weights: 4 true groups, dimension 650 (digits-CNN final layer) and 850
(LeNet-5 final layer, 84*10 + 10). For each (clients, dimension) a fresh subprocess times
each stage (pdist, linkage, threshold cut, k cut, auto search) and records the peak
Python-tracked memory (tracemalloc: NumPy buffers) and the process peak RSS.

    .venv/bin/python benchmarks/bench_clustering_scale.py [--clients 1000 10000] [--dims 650 850]

Writes benchmarks/results/clustering_scale.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GROUPS = 4


def synthetic_partials(m: int, d: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(GROUPS, d))
    truth = rng.integers(GROUPS, size=m)
    # Within-group distances ~ sqrt(2d)/2, between groups ~ sqrt(2.5 d): separable, not trivial.
    X = centers[truth] + 0.5 * rng.normal(size=(m, d))
    return X, truth


def measure_one(m: int, d: int, max_clusters: int | None) -> dict:
    import numpy as np
    from scipy.cluster import hierarchy
    from sklearn.metrics import adjusted_rand_score

    from clusterfed.clustering.agglomerative import (
        _linkage_from_condensed,
        _silhouettes_of_cuts,
        cluster_auto,
    )
    from clusterfed.clustering.distances import pairwise_distances

    X, truth = synthetic_partials(m, d)
    rss_before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stages: dict[str, dict[str, float]] = {}
    tracemalloc.start()

    def stage(name, fn):
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] - base
        stages[name] = {"seconds": round(seconds, 3), "peak_mb": round(peak / 2**20, 1)}
        return out

    dist = stage("pdist", lambda: pairwise_distances(X, "l2"))
    Z = stage("linkage_average", lambda: _linkage_from_condensed(dist, "average"))
    lam = float(Z[-GROUPS, 2] + Z[-GROUPS - 1, 2]) / 2  # a λ between the 4- and 5-cluster cuts
    stage("fcluster_distance", lambda: hierarchy.fcluster(Z, t=lam, criterion="distance"))
    labels_k = stage("fcluster_maxclust", lambda: hierarchy.fcluster(Z, t=GROUPS, criterion="maxclust"))
    k_max = m - 1 if max_clusters is None else min(m - 1, max_clusters)
    stage("auto_search", lambda: _silhouettes_of_cuts(dist, Z, m, k_max))
    del dist, Z
    cut = stage(
        "cluster_auto_end_to_end", lambda: cluster_auto(X, metric="l2", linkage="average", max_clusters=max_clusters)
    )
    total_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "clients": m,
        "dim": d,
        "groups": GROUPS,
        "max_clusters": max_clusters,
        "condensed_mb": round(m * (m - 1) / 2 * 8 / 2**20, 1),
        "stages": stages,
        "server_clustering_seconds": round(
            sum(stages[s]["seconds"] for s in ("pdist", "linkage_average", "fcluster_distance")), 3
        ),
        "auto_num_clusters": cut.num_clusters,
        "auto_silhouette": cut.silhouette,
        "auto_threshold": cut.threshold,
        "auto_ari": float(adjusted_rand_score(truth, cut.labels)),
        "k_cut_ari": float(adjusted_rand_score(truth, labels_k)),
        "tracemalloc_peak_mb": round(total_peak / 2**20, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_before_mb": round(rss_before_mb, 1),
    }


def print_table(rows: list[dict]) -> None:
    cols = [
        "pdist", "linkage_average", "fcluster_distance", "fcluster_maxclust", "auto_search", "cluster_auto_end_to_end"
    ]
    head = f"{'clients':>7} {'dim':>4} " + " ".join(f"{c[:14]:>14}" for c in cols)
    head += f" {'K':>3} {'ARI':>5} {'trace MB':>9} {'RSS MB':>8}"
    print(head)
    for r in rows:
        cells = " ".join(f"{r['stages'][c]['seconds']:>13.2f}s" for c in cols)
        print(
            f"{r['clients']:>7} {r['dim']:>4} {cells} {r['auto_num_clusters']:>3} {r['auto_ari']:>5.2f}"
            f" {r['tracemalloc_peak_mb']:>9.0f} {r['peak_rss_mb']:>8.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--dims", type=int, nargs="+", default=[650, 850])
    parser.add_argument("--max-clusters", type=int, default=100, help="cluster_auto candidate cap (0 = all cuts)")
    parser.add_argument("--one", type=int, nargs=2, metavar=("CLIENTS", "DIM"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "clustering_scale.json")
    args = parser.parse_args()
    max_clusters = None if args.max_clusters == 0 else args.max_clusters

    if args.one:  # child process: one measurement, JSON on stdout
        print(json.dumps(measure_one(args.one[0], args.one[1], max_clusters)))
        return

    rows = []
    for m in args.clients:
        for d in args.dims:
            cmd = [sys.executable, __file__, "--one", str(m), str(d), "--max-clusters", str(args.max_clusters)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(f"done: {m} clients, dim {d}", file=sys.stderr, flush=True)
    import numpy
    import scipy
    import sklearn

    result = {
        "benchmark": "clustering_scale",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "numpy": numpy.__version__,
            "scipy": scipy.__version__,
            "sklearn": sklearn.__version__,
        },
        "metric": "l2",
        "linkage": "average",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
