"""Pure pieces of IFCA (Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for
Clustered Federated Learning", NeurIPS 2020): the K starting models.

- ``random_initialisations``: K independent initialisations drawn without a framework.
  Model 0 is the given θ0; models 1..K-1 redraw every non-constant array uniformly in
  ``[-b, b]`` with ``b = max|θ0[name]|`` (PyTorch's default Linear/Conv initialisation is
  uniform in ±1/sqrt(fan_in), which this bound recovers) and keep constant arrays (batch
  norm scales and shifts, running statistics, counters) as they are. (choice)
- ``kmeanspp_seeds``: k-means++ seeding (Arthur and Vassilvitskii, "k-means++: The
  Advantages of Careful Seeding") on the rows of a matrix, e.g. clients' flattened
  warm-up models: the first seed uniformly, each next one with probability proportional
  to the squared distance to the nearest seed so far.
"""

from __future__ import annotations

import numpy as np

Arrays = dict[str, np.ndarray]


def random_initialisations(theta0: Arrays, k: int, rng: np.random.Generator,
                           names: list[str] | None = None) -> list[Arrays]:
    """K starting models: θ0 and K-1 independent redraws of its non-constant arrays among
    ``names`` (None: all; buffers such as a positional encoding are kept as they are)."""
    redrawn = set(theta0 if names is None else names)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    models = [{n: v.copy() for n, v in theta0.items()}]
    for _ in range(k - 1):
        model = {}
        for name, value in theta0.items():
            flat = np.asarray(value).ravel()
            constant = name not in redrawn or flat.size == 0 or not np.issubdtype(value.dtype, np.floating) or np.all(flat == flat[0])
            if constant:
                model[name] = value.copy()
            else:
                bound = float(np.max(np.abs(flat)))
                model[name] = rng.uniform(-bound, bound, size=value.shape).astype(value.dtype)
        models.append(model)
    return models


def kmeanspp_seeds(X: np.ndarray, k: int, rng: np.random.Generator) -> tuple[list[int], float]:
    """Indices of k rows of X chosen by k-means++ seeding, and the potential (sum over rows
    of the squared distance to the nearest seed). With fewer distinct rows than k, the
    remaining seeds are drawn uniformly from the rows not chosen yet."""
    X = np.asarray(X, dtype=np.float64)
    n = len(X)
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..{n} (the number of rows), got {k}")
    seeds = [int(rng.integers(n))]
    nearest = ((X - X[seeds[0]]) ** 2).sum(axis=1)
    while len(seeds) < k:
        total = float(nearest.sum())
        if total > 0:
            nxt = int(rng.choice(n, p=nearest / total))
        else:
            rest = [i for i in range(n) if i not in seeds]
            nxt = int(rest[rng.integers(len(rest))])
        seeds.append(nxt)
        nearest = np.minimum(nearest, ((X - X[nxt]) ** 2).sum(axis=1))
    return seeds, float(nearest.sum())


def nearest_seed(X: np.ndarray, seeds: list[int]) -> np.ndarray:
    """For every row of X, the position (in ``seeds``) of its nearest seed row (L2)."""
    X = np.asarray(X, dtype=np.float64)
    d = ((X[:, None, :] - X[seeds][None, :, :]) ** 2).sum(axis=2)
    return d.argmin(axis=1)


def flat(arrays: Arrays, names: list[str]) -> np.ndarray:
    """The named arrays of one model (or update), flattened into one float64 row."""
    return np.concatenate([np.asarray(arrays[n], dtype=np.float64).ravel() for n in sorted(names)])


def compares_words(k: int) -> str:
    """Round 1's words on what IFCA compares."""
    return (f"IFCA compares the training losses of its {k} models on each client's own data; each client trains "
            f"the model of lowest loss and belongs to its cluster")


def split_evidence(updates: dict, previous: dict, round_number: int, min_side: int = 2,
                   min_silhouette: float = 0.25):
    """The cluster whose members' updates split in two most reproducibly across two successive
    rounds: ``updates`` / ``previous`` map a client to (its cluster, its update row) this round
    and the last. Each cluster's members that trained in it both rounds (at least 2 * ``min_side``)
    are cut in two (average linkage, cosine) on each round's updates, and the cuts compared
    (``reproducible.compare``, "rounds t-1 and t"); a cut with a side smaller than ``min_side``
    counts as agreement 0, and so does one whose cosine silhouette is below ``min_silhouette`` in
    either round (each client's data is the same every round, so its own direction repeats: a
    weak cut of like clients can reproduce). Returns (cluster, Reproduction, the clients in order) of the best
    agreement, or None when no cluster had enough such members."""
    from sklearn.metrics import silhouette_score

    from clusterfed.clustering.agglomerative import cluster_into_k
    from clusterfed.clustering.reproducible import Reproduction, compare

    best = None
    for cluster in sorted({c for c, _, _ in updates.values()}):
        keys = sorted((k for k, (c, _, _) in updates.items() if c == cluster and k in previous and previous[k][0] == cluster),
                      key=lambda k: (len(k), k))
        if len(keys) < 2 * min_side:
            continue
        now = cluster_into_k(np.stack([updates[k][1] for k in keys]), 2, metric="cosine")
        before = cluster_into_k(np.stack([previous[k][1] for k in keys]), 2, metric="cosine")
        evidence = compare(now, before, f"rounds {round_number - 1} and {round_number}")
        if min(np.bincount(now, minlength=2).min(), np.bincount(before, minlength=2).min()) < min_side:
            evidence = Reproduction(evidence.labels_a, evidence.labels_b, 0.0, evidence.source)
        else:  # a client's own data repeats every round: a weak cut of like clients can reproduce too
            separation = min(silhouette_score(np.stack([updates[k][1] for k in keys]), now, metric="cosine"),
                             silhouette_score(np.stack([previous[k][1] for k in keys]), before, metric="cosine"))
            if separation < min_silhouette:
                evidence = Reproduction(evidence.labels_a, evidence.labels_b, 0.0,
                                        f"{evidence.source} (silhouette {separation:.2f} < {min_silhouette:.2f})")
        if best is None or evidence.agreement > best[1].agreement:
            best = (cluster, evidence, keys)
    return best
