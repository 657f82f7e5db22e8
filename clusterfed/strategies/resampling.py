"""How many clients a round samples (``sample_size``, every strategy's rule), and who trains
next round when some must be asked again: the CFL family's ``ask-again``
(``tree_hooks.tree_draw_sample``) keeps the repliers of a split that no earlier round could
be compared with in the next round's sample."""

from __future__ import annotations

import numpy as np


def sample_size(clients: int, fraction: float, minimum: int) -> int:
    """A ``fraction`` of ``clients``, at least ``minimum`` and 1, at most all of them."""
    return min(max(int(clients * fraction), minimum, 1), clients)


def sample_asking_again(rng: np.random.Generator, active: list[str], again: list[str], fraction: float,
                        minimum: int) -> list[str]:
    """A ``fraction`` sample of the ``active`` clients (the strategy's own size rule) holding the
    ``again`` clients still active (as many as fit), the rest drawn at random from the others;
    in ``active``'s order. At independent samples a small cluster's repliers rarely meet again
    (8 members at half participation: 2 of them in two rounds' samples, in expectation), and a
    split on evidence compares two rounds' partitions of the same clients."""
    size = sample_size(len(active), fraction, minimum)
    present = set(active)
    kept = [k for k in dict.fromkeys(again) if k in present][:size]
    taken = set(kept)
    others = [k for k in active if k not in taken]
    drawn = [others[i] for i in rng.choice(len(others), size=size - len(kept), replace=False)]
    chosen = taken | set(drawn)
    return [k for k in active if k in chosen]
