"""Server-side clustering cost versus the number of clients: one-shot path (pdist vs
blocked distances) and the two-stage sampled path.

Synthetic partial weights: the final layer of LeNet-5 (84*10 weights + 10 biases = 850
dims, float32 as clients send them), 5 true groups of unequal size (40/25/20/10/5 %),
centres N(0, 1), member noise 0.5 (within-group distances ~sqrt(2d)/2, between groups
~sqrt(2.5 d): separable, not trivial). Every case runs in a fresh subprocess that records
its wall time, tracemalloc peak (NumPy buffers allocated by the clustering) and process
peak RSS (input data included).

Cases:
  oneshot  (1k, 10k; pdist and blocked distances): cluster_auto (distances + linkage +
           auto-λ silhouette search) and cluster_by_threshold at the auto λ; ARI vs truth;
           the blocked labels equal the pdist labels.
  sampled  (10k, 100k, 1M): cluster_sampled with a seeded sample; ARI vs truth, and vs
           the full (blocked) clustering where that fits (10k).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_clustering_scale.py

Writes benchmarks/results/clustering_scale.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DIM = 850
SHARES = (0.40, 0.25, 0.20, 0.10, 0.05)
NOISE = 0.5
GEN_CHUNK = 50_000


def synthetic_partials(m: int, d: int = DIM, seed: int = 0):
    """(m, d) float32 partial weights and their true groups, generated in chunks so that
    1M clients need only the float32 matrix (3.4 GB) and one chunk."""
    import numpy as np

    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(len(SHARES), d))
    truth = rng.choice(len(SHARES), size=m, p=SHARES)
    X = np.empty((m, d), dtype=np.float32)
    for start in range(0, m, GEN_CHUNK):
        stop = min(start + GEN_CHUNK, m)
        X[start:stop] = centers[truth[start:stop]] + NOISE * rng.normal(size=(stop - start, d))
    return X, truth


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _timed(fn):
    tracemalloc.start()
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, round(seconds, 3), round(peak / 2**20, 1)


def run_case(kind: str, m: int, metric: str, method: str, sample: int, seed: int) -> dict:
    import numpy as np
    from sklearn.metrics import adjusted_rand_score

    from clusterfed.clustering import cluster_auto, cluster_by_threshold, cluster_sampled

    X, truth = synthetic_partials(m)
    rss_input = _rss_mb()
    row: dict = {"kind": kind, "clients": m, "dim": DIM, "metric": metric, "input_mb": round(X.nbytes / 2**20, 1)}
    if kind == "oneshot":
        cut, t_auto, mem_auto = _timed(lambda: cluster_auto(X, metric=metric, distances=method))
        lab, t_thr, mem_thr = _timed(lambda: cluster_by_threshold(X, cut.threshold, metric=metric, distances=method))
        row.update(
            distances=method, auto_seconds=t_auto, threshold_seconds=t_thr, auto_trace_mb=mem_auto,
            threshold_trace_mb=mem_thr, num_clusters=cut.num_clusters, threshold=cut.threshold,
            silhouette=cut.silhouette, ari_truth=float(adjusted_rand_score(truth, cut.labels)),
            threshold_cut_equals_auto=bool(np.array_equal(lab, cut.labels)),
        )
        row["labels_sha"] = __import__("hashlib").sha1(cut.labels.astype(np.int64).tobytes()).hexdigest()[:12]
    else:
        res, t, mem = _timed(lambda: cluster_sampled(X, sample, seed=seed, metric=metric))
        row.update(
            sample=sample, seed=seed, seconds=t, trace_mb=mem, num_clusters=res.num_clusters,
            ari_truth=float(adjusted_rand_score(truth, res.labels)),
        )
        if m <= 10_000:
            full, t_full, _ = _timed(lambda: cluster_auto(X, metric=metric, distances="blocked"))
            row.update(full_seconds=t_full, full_num_clusters=full.num_clusters,
                       ari_vs_full=float(adjusted_rand_score(full.labels, res.labels)))
    row["rss_input_mb"] = round(rss_input, 1)
    row["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oneshot-clients", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--sampled-clients", type=int, nargs="*", default=[10000, 100000, 1000000])
    parser.add_argument("--metrics", nargs="+", default=["l2", "cosine"])
    parser.add_argument("--sample", type=int, default=5000, help="cluster_sampled sample size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", nargs=5, metavar=("KIND", "CLIENTS", "METRIC", "METHOD", "SAMPLE"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "clustering_scale.json")
    args = parser.parse_args()

    if args.one:  # child process: one measurement, JSON on stdout
        kind, m, metric, method, sample = args.one
        print(json.dumps(run_case(kind, int(m), metric, method, int(sample), args.seed)))
        return

    cases = [("oneshot", m, met, meth, 0) for met in args.metrics for m in args.oneshot_clients
             for meth in ("pdist", "blocked")]
    cases += [("sampled", m, met, "blocked", args.sample) for met in args.metrics for m in args.sampled_clients]
    rows = []
    for case in cases:
        cmd = [sys.executable, __file__, "--one", *map(str, case), "--seed", str(args.seed)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(f"done: {case} {rows[-1]}", file=sys.stderr, flush=True)
    for r in rows:  # the blocked one-shot labels equal the pdist ones
        if r["kind"] == "oneshot" and r["distances"] == "blocked":
            ref = next(x for x in rows if x["kind"] == "oneshot" and x["distances"] == "pdist"
                       and x["clients"] == r["clients"] and x["metric"] == r["metric"])
            r["labels_equal_pdist"] = r["labels_sha"] == ref["labels_sha"]
    import numpy
    import scipy
    import sklearn

    result = {
        "benchmark": "clustering_scale",
        "command": " ".join(["PYTHONPATH=.", ".venv/bin/python", "benchmarks/bench_clustering_scale.py", *sys.argv[1:]]),
        "machine": {
            "platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": numpy.__version__, "scipy": scipy.__version__, "sklearn": sklearn.__version__,
            "load_average_at_end": os.getloadavg(),
        },
        "data": {"dim": DIM, "group_shares": SHARES, "noise": NOISE, "dtype": "float32"},
        "linkage": "average",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
