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
    p: int
    d: int
    action: str  # no-signal | hold | decrease | increase | keep


class ClusterCountController:
    """State machine for p. ``update(r, round)`` returns p for the next round."""

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
        self.history: list[CountStep] = []

    def annealing_keep_probability(self, round: int) -> float:
        return 1.0 - math.exp(-max(int(round), 0) / self.anneal_tau)

    def experience_keep_probability(self, p: int | None = None) -> float:
        good, bad = self.experience.get(self.p if p is None else p, (0, 0))
        return (good + 1) / (good + bad + 2)

    def update(self, loss_reduction_ratio: float | None, round: int) -> int:
        """Feed round ``round``'s loss-reduction ratio (None: no signal, e.g. the first
        round); returns p for the next round."""
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
        self.history.append(CountStep(int(round), r, self.p, self.d, action))
        return self.p
