"""How many clients a round samples (``sample_size``, every strategy's rule), and who trains
beyond the sample for the CFL family's split test (``tree_hooks.tree_draw_sample``): its
``ask-again`` asks the repliers of a split that no earlier round could be compared with again
in the next round, and its ``split-min-repliers`` tops each cluster that may split up to that
many of its members (``evidence_sample``, by ``top_up``); neither changes the sample."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable
from typing import Any

import numpy as np


def sample_size(clients: int, fraction: float, minimum: int) -> int:
    """A ``fraction`` of ``clients``, at least ``minimum`` and 1, at most all of them."""
    return min(max(int(clients * fraction), minimum, 1), clients)


def top_up(rng: np.random.Generator, sample: list[str], groups: dict[Any, list[str]], need: int,
           first: dict[Any, Container[str]]) -> set[str]:
    """The keys of ``sample`` with each of ``groups`` (id -> its members) holding at least
    ``need`` of its members (all of them when fewer): those in ``first[id]`` drawn before the
    others, each pool at random from ``rng``."""
    chosen = set(sample)
    for group, members in groups.items():
        missing = min(need, len(members)) - len(chosen.intersection(members))
        if missing <= 0:
            continue
        earlier = first.get(group, ())
        for pool in ([k for k in members if k not in chosen and k in earlier],
                     [k for k in members if k not in chosen and k not in earlier]):
            picked = [pool[i] for i in rng.permutation(len(pool))[:missing]]
            chosen.update(picked)
            missing -= len(picked)
    return chosen


def evidence_sample(state: Any, params: Any, server_round: int, active: list[str], sample: list[str], *,
                    evidence: bool, again: Iterable[str] = ()) -> list[str]:
    """``split-min-repliers`` (the CFL family on ``evidence``, at ``fraction-train`` < 1, from the
    round before ``min-split-round``): ``sample`` with each leaf that may split (``min-split-size``
    placed members or more, not a final merged leaf) topped up to that many of its ``active``
    placed members (all when fewer; provisional ones descend first), its last partition's clients
    first (``top_up``); in ``active``'s order. A split compares two rounds' partitions of the
    same clients, and tells groups from one task's spread only on enough of them. The clients
    added are drawn by a generator of their own (``params.seed`` and the round), so the
    strategy's samples, and a cluster that never splits, stay those of a run without them. The
    ``again`` clients (``ask-again``: a deferred split's repliers) still active are asked first,
    beyond the sample, and count towards each leaf's number."""
    asked = set(sample).union(again)
    sample = [k for k in active if k in asked]
    need = params.split_min_repliers
    if not need or params.fraction_train >= 1 or not evidence or server_round < params.min_split_round - 1:
        return sample
    by_leaf = defaultdict(list)
    for key in active:
        if key in state.assignment:
            by_leaf[state.assignment[key]].append(key)
    may_split = {c: m for c, m in by_leaf.items() if c not in state.merged and len(m) >= params.min_split_size}
    last = {c: (state.proposals.get(c) or [{}])[-1].get("best", {}) for c in may_split}
    chosen = top_up(np.random.default_rng([params.seed, server_round]), sample, may_split, need, last)
    return [k for k in active if k in chosen]
