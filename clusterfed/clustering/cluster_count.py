"""Adaptive number of clusters p for cluster-based client selection (Chen & Chen).

Each round the clients are cut into p clusters and one client per cluster trains. p follows
a TCP-like rule on the loss-reduction ratio r = (L_{i-1} - L_i) / L_{i-1}:
  r > w:  p <- max(1, p - d), d <- 2d        (d starts at 1: additive, then exponential)
  r <= w: p <- min(m, 2p),    d <- 1
and after a change p is held for ``hold_rounds`` rounds. Stabilizers, applied when r <= w:
  annealing:  keep p with probability 1 - exp(-round / anneal_tau), growing with the round
              (the paper gives no formula: (choice), like the temperature of simulated
              annealing falling over time);
  experience: keep p with probability (good + 1) / (good + bad + 2), the Laplace-smoothed
              share of earlier rounds at this p with r > w (good) vs r <= w (bad).
A kept p also ends a run of good rounds, so d is reset to 1 (choice).

Floor (choice, beyond the paper): ``floor`` is the least number of clusters the cut may
have, set by the caller each round (the selection sets it to the number of groups its
clients' clustering shows). The rule above runs unchanged on its own p; the cut, which
``update`` returns, is ``max(p, floor)``. With the default floor of 1 the cut is the
paper's p, which may fall to 1: one client then trains the global model on its own data
alone, its training loss keeps falling, so the rule keeps p at 1 while the global model
forgets every other group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

STABILIZERS = ("none", "annealing", "experience")
DEFAULT_ANNEAL_TAU = 50.0


def loss_reduction_ratio(prev: float | None, cur: float | None) -> float | None:
    """r = (prev - cur) / prev; None when there is no previous loss or a value is not
    finite; 0 when prev <= 0 (a zero loss cannot be reduced)."""
    if prev is None or cur is None:
        return None
    prev, cur = float(prev), float(cur)
    if not (math.isfinite(prev) and math.isfinite(cur)):
        return None
    if prev <= 0:
        return 0.0
    return (prev - cur) / prev


@dataclass
class CountStep:
    """One call of ``update``: the p chosen for the next round and why."""

    round: int
    ratio: float | None
    p: int  # the cut for the next round: max(the rule's p, floor)
    d: int
    action: str  # no-signal | hold | decrease | increase | keep
    # defaults: a checkpoint written before the floor existed restores without them
    rule_p: int | None = None  # the paper's rule's own p
    floor: int = 1


class ClusterCountController:
    """State machine for p. ``update(r, round)`` returns the cut for the next round."""

    floor = 1  # class default: a checkpoint written before the floor existed restores with it

    def __init__(
        self,
        m: int,
        w: float,
        hold_rounds: int = 0,
        stabilizer: str = "none",
        rng: np.random.Generator | int | None = None,
        *,
        anneal_tau: float = DEFAULT_ANNEAL_TAU,
    ) -> None:
        if int(m) < 1:
            raise ValueError(f"m (number of clients) must be >= 1, got {m}")
        if int(hold_rounds) < 0:
            raise ValueError(f"hold_rounds must be >= 0, got {hold_rounds}")
        if stabilizer not in STABILIZERS:
            raise ValueError(f"unknown stabilizer {stabilizer!r}; expected one of {STABILIZERS}")
        if not anneal_tau > 0:
            raise ValueError(f"anneal_tau must be > 0, got {anneal_tau}")
        self.m = int(m)
        self.w = float(w)
        self.hold_rounds = int(hold_rounds)
        self.stabilizer = stabilizer
        self.anneal_tau = float(anneal_tau)
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.p = self.m  # the paper starts with one cluster per client
        self.d = 1
        self.hold_left = 0
        self.experience: dict[int, list[int]] = {}  # p -> [good, bad] rounds spent at p
        self.floor = 1
        self.history: list[CountStep] = []

    @property
    def cut(self) -> int:
        """Number of clusters to cut into: the rule's p, never below ``floor``."""
        return max(self.p, min(self.floor, self.m))

    def set_floor(self, floor: int) -> int:
        """Set the least number of clusters of the cut (clipped to [1, m]); returns the cut."""
        self.floor = min(max(int(floor), 1), self.m)
        return self.cut

    def annealing_keep_probability(self, round: int) -> float:
        return 1.0 - math.exp(-max(int(round), 0) / self.anneal_tau)

    def experience_keep_probability(self, p: int | None = None) -> float:
        good, bad = self.experience.get(self.p if p is None else p, (0, 0))
        return (good + 1) / (good + bad + 2)

    def update(self, loss_reduction_ratio: float | None, round: int) -> int:
        """Feed round ``round``'s loss-reduction ratio (None: no signal, e.g. the first
        round); returns the cut for the next round (``cut``: p, never below ``floor``)."""
        r = loss_reduction_ratio
        if r is None or not math.isfinite(r):
            return self._record(round, None, "no-signal")
        good = r > self.w
        # Probability from *earlier* rounds at this p, before this round is counted.
        keep_by_experience = self.experience_keep_probability()
        self.experience.setdefault(self.p, [0, 0])[0 if good else 1] += 1

        if self.hold_left > 0:
            self.hold_left -= 1
            return self._record(round, r, "hold")
        if good:
            new_p, action = max(1, self.p - self.d), "decrease"
            self.d = min(2 * self.d, self.m)  # d beyond m changes nothing (p >= 1)
        else:
            self.d = 1
            if self.stabilizer == "annealing" and self.rng.random() < self.annealing_keep_probability(round):
                new_p, action = self.p, "keep"
            elif self.stabilizer == "experience" and self.rng.random() < keep_by_experience:
                new_p, action = self.p, "keep"
            else:
                new_p, action = min(self.m, 2 * self.p), "increase"
        if new_p != self.p:
            self.p = new_p
            self.hold_left = self.hold_rounds
        return self._record(round, r, action)

    def _record(self, round: int, r: float | None, action: str) -> int:
        self.history.append(CountStep(int(round), r, self.cut, self.d, action, self.p, self.floor))
        return self.cut
