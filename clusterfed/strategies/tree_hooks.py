"""The CFL family's round hooks that only hand the round to the bi-partition tree
(``bipartitioning.BiPartitionTree``), written once: CFL, LayerCFL and HiCFL bind them in their
class bodies (``admit = tree_admit``), so each is the strategy's own method, not one inherited
from a base."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clusterfed.core.exchange import RETURN_UPDATE
from clusterfed.strategies.resampling import evidence_sample


def placements(train_asks: Callable[..., list], rnd: Any, descent: Any) -> Any:
    """A descent's requests ``(keys, model, extra)`` run as the strategy's own placement asks in round ``rnd``."""
    replies = None
    while True:
        try:
            keys, model, extra = descent.send(replies)
        except StopIteration as done:
            return done.value
        replies = yield train_asks(rnd, keys, models={k: model for k in keys}, extra=extra,
                                   phase="placement")


def tree_train_instructions(strategy: Any, rnd: Any, key: str) -> dict[str, Any]:
    """Every trainer returns its update (the splits compare updates)."""
    return {"return": RETURN_UPDATE}


def tree_draw_sample(strategy: Any, rnd: Any) -> list[str]:
    """Placing a provisional member asks it for work: sample before placement (the strategy's
    own sample, FedAvg's at the same seed), then, beyond it, the clients ``ask-again`` named last
    round and each cluster that may split topped up to ``split-min-repliers`` of its members
    (``resampling.evidence_sample``): those train for the split test's evidence only
    (``rnd.evidence_only``), the sample is averaged."""
    state, params = strategy.state, strategy.params
    again, state.asked_again = state.asked_again, ()  # named only with ask-again on, at fraction-train < 1
    sample = strategy.sample_active(rnd)
    asked = evidence_sample(state, params, rnd.number, list(rnd.active), sample,
                            evidence=strategy.bipartition.evidence(state), again=again)
    rnd.evidence_only = frozenset(asked).difference(sample)  # their updates judge splits, not the average
    return asked


def tree_admit(strategy: Any, rnd: Any, keys: list[str]) -> Any:
    """Newcomers descend the tree: every one while the tree is its root (no request), then those
    sampled this round (a descent trains them; the others wait, unplaced, until sampled)."""
    tree = strategy.state.tree
    if not tree.node(tree.root_id).is_leaf:
        keys = rnd.reachable(keys)
    return placements(strategy.train_asks, rnd, strategy.bipartition.admit(strategy.state, rnd.number, keys))


def tree_before_train(strategy: Any, rnd: Any) -> Any:
    """Sampled members placed provisionally at a split they sat out descend from it now."""
    return placements(strategy.train_asks, rnd, strategy.bipartition.place_provisional(
        strategy.state, rnd.reachable(strategy.placed(rnd))))
