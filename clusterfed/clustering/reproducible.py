"""Is a partition of clients reproducible? A clustering decision (a one-shot cut, a split, a
merge, a layer choice) is taken only when independent evidence gives the same partition.

Two partitions of the same clients, each found on evidence the other did not use, are
compared by their adjusted Rand index (scikit-learn's ``adjusted_rand_score``: 1 for the same
partition up to names, about 0 for partitions no closer than chance). Sources of independent
evidence a strategy may use, each named in what the run says:

- two disjoint halves of the compared coordinates (``coordinate_halves``, ``cut_halves``): the
  same clients, the same round, no extra request;
- two halves of a stock client's chained requests (requests 1–5 and 6–10);
- successive rounds (the partition found in round t and in round t + 1).

``Reproduction.words()`` is the sentence a round line quotes (``coordinate halves disagree
(ARI 0.31)``). The bound an agreement must reach is the caller's (set on the development
draws of the random-model benchmark; ``DEFAULT_AGREEMENT``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import adjusted_rand_score

from clusterfed.explain.numbers import compared

DEFAULT_AGREEMENT = 0.8  # the ARI two independent partitions must reach (callers may set their own)


def agreement(labels_a: Sequence[int] | np.ndarray, labels_b: Sequence[int] | np.ndarray) -> float:
    """The adjusted Rand index of two partitions of the same clients, in client order (1.0 for
    the same partition, two single clusters included)."""
    a, b = np.asarray(labels_a), np.asarray(labels_b)
    if a.shape != b.shape:
        raise ValueError(f"partitions of {a.shape[0]} and {b.shape[0]} clients cannot be compared")
    return float(adjusted_rand_score(a, b))


@dataclass(frozen=True)
class Reproduction:
    """Two partitions of the same clients found on independent evidence (``source``: what
    each half was, in words, e.g. "coordinate halves", "requests 1–5 and 6–10", "rounds 3 and
    4"), and their agreement (ARI)."""

    labels_a: np.ndarray
    labels_b: np.ndarray
    agreement: float
    source: str

    def reproduces(self, bound: float = DEFAULT_AGREEMENT) -> bool:
        """Whether the two partitions agree at least to ``bound`` (ARI)."""
        return self.agreement >= bound

    def clusters(self) -> tuple[int, int]:
        """The number of clusters in each half's partition."""
        return len(np.unique(self.labels_a)), len(np.unique(self.labels_b))

    def words(self, bound: float = DEFAULT_AGREEMENT) -> str:
        """``"coordinate halves agree (ARI 0.94)"`` / ``"… disagree (ARI 0.31 < 0.80)"``."""
        if self.reproduces(bound):
            return f"{self.source} agree (ARI {self.agreement:.2f})"
        # printed true: 0.7996 < 0.8000, never 0.80 < 0.80
        return f"{self.source} disagree (ARI {compared(self.agreement, '<', bound)})"

    def as_record(self) -> dict[str, object]:
        """JSON values for rounds.jsonl / clusters.json."""
        return {"source": self.source, "agreement": round(self.agreement, 4),
                "clusters": list(self.clusters())}


def compare(labels_a: Sequence[int] | np.ndarray, labels_b: Sequence[int] | np.ndarray, source: str) -> Reproduction:
    """The ``Reproduction`` of two partitions found on independent evidence (chained-request
    halves, successive rounds), in the same client order."""
    a, b = np.asarray(labels_a), np.asarray(labels_b)
    return Reproduction(a, b, agreement(a, b), source)


def coordinate_halves(width: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random split of ``width`` column indices into two disjoint halves (sorted), drawn
    from ``rng`` (the caller's seeded generator, so that a run reproduces)."""
    if width < 2:
        raise ValueError(f"{width} coordinate(s) cannot be split in two halves")
    order = rng.permutation(width)
    half = width // 2
    return np.sort(order[:half]), np.sort(order[half:])


def cut_halves(X: np.ndarray, cut: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator,
               source: str = "coordinate halves") -> Reproduction:
    """Cut the clients (rows of ``X``) twice, on two disjoint random halves of the columns,
    with the caller's ``cut`` (rows -> labels, the same rule the decision uses), and compare."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"expected a clients x coordinates matrix, got shape {X.shape}")
    first, second = coordinate_halves(X.shape[1], rng)
    return compare(cut(X[:, first]), cut(X[:, second]), source)
