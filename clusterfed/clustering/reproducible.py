"""Is a partition of clients reproducible? A clustering decision (a one-shot cut, a split, a
merge, a layer choice) is taken only when independent evidence gives the same partition.

Two partitions of the same clients, each found on evidence the other did not use, are
compared by their adjusted Rand index (scikit-learn's ``adjusted_rand_score``: 1 for the same
partition up to names, about 0 for partitions no closer than chance). Sources of independent
evidence a strategy may use, each named in what the run says:

- two disjoint halves of the compared coordinates (``coordinate_halves``, ``cut_halves``): the
  same clients, the same round, no extra request;
- two halves of a stock client's chained requests (requests 1–5 and 6–10);
- successive rounds (the partition found in round t and in round t + 1);
- at partial participation, where no two rounds share enough clients, the pairs of this
  round's clients last seen together in an earlier round (``compare_pairs``): whether each
  pair sat on one side then and now, agreement by Cohen's kappa, which on all pairs of two
  partitions is their adjusted Rand index (Warrens, "On the equivalence of Cohen's kappa and
  the Hubert-Arabie adjusted Rand index", Journal of Classification 2008).

``Reproduction.words()`` is the sentence a round line quotes (``coordinate halves disagree
(ARI 0.31)``). The bound an agreement must reach is the caller's (set on the development
draws of the random-model benchmark; ``DEFAULT_AGREEMENT``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import adjusted_rand_score, cohen_kappa_score

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
    pairs: bool = False  # labels are pairs' co-membership (1: one side), not clients' clusters

    def reproduces(self, bound: float = DEFAULT_AGREEMENT) -> bool:
        """Whether the two partitions agree at least to ``bound`` (ARI)."""
        return self.agreement >= bound

    def clusters(self) -> tuple[int, int]:
        """The number of clusters in each half's partition (pairs: 2 where some pairs sit
        together and some apart, 1 where all sit alike)."""
        return len(np.unique(self.labels_a)), len(np.unique(self.labels_b))

    def words(self, bound: float = DEFAULT_AGREEMENT) -> str:
        """``"coordinate halves agree (ARI 0.94)"`` / ``"… disagree (ARI 0.31 < 0.80)"``
        (pairs: ``"… agree (pair ARI 0.94 over 12 pairs)"``)."""
        measure = "pair ARI" if self.pairs else "ARI"
        over = f" over {len(self.labels_a)} pairs" if self.pairs else ""
        if self.reproduces(bound):
            return f"{self.source} agree ({measure} {self.agreement:.2f}{over})"
        # printed true: 0.7996 < 0.8000, never 0.80 < 0.80
        return f"{self.source} disagree ({measure} {compared(self.agreement, '<', bound)}{over})"

    def as_record(self) -> dict[str, object]:
        """JSON values for rounds.jsonl / clusters.json."""
        if self.pairs:
            return {"source": self.source, "agreement": round(self.agreement, 4), "pairs": len(self.labels_a)}
        return {"source": self.source, "agreement": round(self.agreement, 4),
                "clusters": list(self.clusters())}


def compare(labels_a: Sequence[int] | np.ndarray, labels_b: Sequence[int] | np.ndarray, source: str) -> Reproduction:
    """The ``Reproduction`` of two partitions found on independent evidence (chained-request
    halves, successive rounds), in the same client order."""
    a, b = np.asarray(labels_a), np.asarray(labels_b)
    return Reproduction(a, b, agreement(a, b), source)


def compare_pairs(together_a: Sequence[bool] | np.ndarray, together_b: Sequence[bool] | np.ndarray,
                  source: str) -> Reproduction:
    """The ``Reproduction`` of two sets of pair judgements found on independent evidence: for each
    pair of clients, whether it sat on one side in ``a`` (an earlier round where both replied) and
    in ``b`` (this round). Agreement is Cohen's kappa of the two, the adjusted Rand index when the
    pairs are all pairs of two partitions (Warrens 2008); 1.0 when both say the same constant."""
    a, b = np.asarray(together_a, dtype=int), np.asarray(together_b, dtype=int)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"pair judgements of shapes {a.shape} and {b.shape} cannot be compared")
    if len(np.unique(a)) == 1 and len(np.unique(b)) == 1:
        kappa = 1.0 if a[0] == b[0] else 0.0
    else:
        kappa = float(cohen_kappa_score(a, b))
    return Reproduction(a, b, kappa, source, pairs=True)


def pairs_seen_together(earlier: Sequence[tuple[int, Mapping[Hashable, int]]], now: Mapping[Hashable, int]
                        ) -> tuple[list[bool], list[bool], list[int], set[Hashable]]:
    """For each pair of ``now``'s clients (client -> label), the latest of the ``earlier``
    partitions (``(round, client -> label)``, oldest first) holding both: whether it put them on
    one side, whether ``now`` does, and that round; and the clients those pairs cover."""
    keys = list(now)
    then, present, rounds, covered = [], [], [], set()
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            for rnd, labels in reversed(earlier):
                if a in labels and b in labels:
                    then.append(labels[a] == labels[b])
                    present.append(now[a] == now[b])
                    rounds.append(rnd)
                    covered.update((a, b))
                    break
    return then, present, rounds, covered


def reproduce_on_pairs(earlier: Sequence[tuple[int, Mapping[Hashable, int]]], now: Mapping[Hashable, int],
                       need: int, server_round: int) -> tuple[Reproduction, int] | None:
    """At partial participation, where no earlier partition shares ``need`` of ``now``'s clients:
    ``now`` against the pairs of them last seen together in ``earlier`` (``pairs_seen_together``,
    ``compare_pairs``), and the latest earlier round used. None unless the pairs cover ``need``
    clients and number at least need·(need − 1)/2, what one round sharing ``need`` would give."""
    then, present, rounds, covered = pairs_seen_together(earlier, now)
    if len(covered) < need or len(then) < need * (need - 1) // 2:
        return None
    first, last = min(rounds), max(rounds)
    span = f"round {first}" if first == last else f"rounds {first}–{last}"
    return compare_pairs(then, present, f"pairs seen together in {span} and round {server_round}"), last


def alike_before(memory: dict[str, int], pair: str, alike: bool, server_round: int) -> int | None:
    """Two clusters judged alike (a merge) in successive rounds: when ``alike`` this round,
    ``memory[pair]`` becomes ``server_round`` and the round it was last alike in is returned
    (None: the first time); when not, the pair is forgotten (None)."""
    if not alike:
        memory.pop(pair, None)
        return None
    seen = memory.get(pair)
    memory[pair] = server_round
    return seen


def apart_before(memory: dict[str, list[int]], pair: str, apart: bool, server_round: int) -> list[int] | None:
    """Two clusters found apart in successive rounds the pair is judged in (a round it is not
    judged in does not count): the rounds (two) once they were; then kept, whatever later
    rounds find. A first round apart is kept as pending in ``memory[pair]``, and forgotten when
    the pair's next judged round does not find them apart. None while not held apart."""
    held = memory.get(pair, [])
    if len(held) < 2:
        held = [*held, server_round] if apart else []
        if held:
            memory[pair] = held
        else:
            memory.pop(pair, None)
    return held if len(held) == 2 else None


def too_few_pairs(need: int) -> str:
    """What a deferral for want of pairs says (``reproduce_on_pairs`` gave None)."""
    return f"nor did {need * (need - 1) // 2} pairs of {need} of them meet in earlier rounds"


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
