"""Simulated newcomers, for benchmarks of online placement: a ``newcomer-fraction`` of the
clients found at first contact is held back (drawn with its own seed, apart from the
algorithm's sampling) and joins at ``newcomer-round``, as devices joining late would."""

from __future__ import annotations

import logging

import numpy as np
from flwr.supercore import log

from clusterfed.core.exchange import natural

# the held-back newcomers are drawn with their own seed, apart from the algorithm's sampling
NEWCOMER_SEED_OFFSET = 7919


class SimulatedNewcomers:
    """The clients held back from the federation until ``join_round``."""

    def __init__(self, fraction: float = 0.0, join_round: int = 10, seed: int = 0):
        self.fraction, self.join_round, self.seed = fraction, join_round, seed
        self.held_back: set[str] = set()

    def hold_back(self, keys: list[str]) -> None:
        """At first contact: draw the newcomers among ``keys``."""
        if self.fraction <= 0:
            return
        keys = sorted(keys, key=natural)
        count = int(round(self.fraction * len(keys)))
        rng = np.random.default_rng(self.seed + NEWCOMER_SEED_OFFSET)
        self.held_back = {keys[i] for i in rng.choice(len(keys), size=count, replace=False)}

    def release(self, server_round: int) -> None:
        """They join at ``join_round``."""
        if self.held_back and server_round >= self.join_round:
            log(logging.INFO, "round %s: %d newcomers join", server_round, len(self.held_back))
            self.held_back = set()
