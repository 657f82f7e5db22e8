"""How many clients a round samples (``sample_size``, every strategy's rule), and who trains
next round when some must be asked again: the CFL family's ``ask-again``
(``tree_hooks.tree_draw_sample``) keeps the repliers of a split that no earlier round could
be compared with in the next round's sample, and its ``split-min-repliers`` tops each cluster
that may split up to that many of its members (``evidence_sample``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

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


def evidence_sample(state: Any, params: Any, server_round: int, active: list[str], sample: list[str], *,
                    evidence: bool) -> list[str]:
    """``split-min-repliers`` (the CFL family on ``evidence``, at ``fraction-train`` < 1, from the
    round before ``min-split-round``): ``sample`` with each leaf that may split (``min-split-size``
    placed members or more, not a final merged leaf) topped up to that many of its ``active``
    placed members (all when fewer; provisional ones descend first), its last partition's clients
    first, each group at random; in ``active``'s order. A split compares two rounds' partitions
    of the same clients, and tells groups from one task's spread only on enough of them."""
    need = params.split_min_repliers
    if not need or params.fraction_train >= 1 or not evidence or server_round < params.min_split_round - 1:
        return sample
    chosen, by_leaf = set(sample), defaultdict(list)
    for key in active:
        if key in state.assignment:
            by_leaf[state.assignment[key]].append(key)
    for cluster, members in by_leaf.items():
        missing = min(need, len(members)) - len(chosen.intersection(members))
        if cluster in state.merged or len(members) < params.min_split_size or missing <= 0:
            continue
        last = (state.proposals.get(cluster) or [{}])[-1].get("best", {})
        for pool in ([k for k in members if k not in chosen and k in last],
                     [k for k in members if k not in chosen and k not in last]):
            picked = [pool[i] for i in state.rng.permutation(len(pool))[:missing]]
            chosen.update(picked)
            missing -= len(picked)
    return [k for k in active if k in chosen]
