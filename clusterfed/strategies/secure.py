"""Secure aggregation (SecAgg+ per cluster) in the round skeleton: what the base's secure
training step does, as functions of the values it is handed (no object of its own, no call
back into the strategy).

- ``settings``: the protocol's settings a run uses (equal weights under dp_*);
- ``check_dp``: distributed DP's check, before round 1, of the protocol's rounding against
  the clipping norm;
- ``by_cluster``: the trainers grouped by cluster; ``secure_groups``: the groups run under
  the protocol, one SecAgg+ instance each (a ``SecureTrain``), small groups held back first;
- ``aggregate_sums``: each cluster's new model from its unmasked mean, with noise under dp_*
  (``add_noise``), and the round's diagnostics; ``sums_train_loss``: the round's train loss.

The strategy keeps its hooks (``secure_train``, which IFCA overrides, ``secure_groups``,
``aggregate_sums``, ``after_secure_train``: ``clusterfed.strategies.base``) and hands these
functions its state, parameters and accountant. Strategies whose training rounds read
individual updates refuse secure aggregation with one of the sentences below
(``secure_refusal``, re-exported by the base).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from clusterfed import privacy
from clusterfed.core.contract import StrategyParamsError
from clusterfed.core.exchange import Arrays, Ask, Diagnostics, GroupSum, SecureSums, SecureTrain, Steps
from clusterfed.secagg import split_groups

# ``secure_refusal`` sentences of the strategies whose training rounds read individual updates
COMPARES_UPDATES_EVERY_ROUND = (
    "the CFL family (CFL, LayerCFL, HiCFL) compares the individual updates of every round in which a split may "
    "happen, which secure aggregation hides from the server (only each cluster's sum is revealed); run it without "
    "secure_aggregation, or use FedClust, AdaCFL or IFCA, whose training rounds work from cluster sums")
READS_EACH_CLIENTS_MODEL = (
    "ClientSelection clusters every client's latest model each round and trains one representative per group, "
    "whose update a sum of one would reveal: there is no group sum to secure; run it without secure_aggregation")
EACH_CLIENT_ALONE = ("Local trains every client alone (a cluster of one), which secure aggregation cannot hide: "
                     "there is no sum")


def settings(secagg: Any, dp: Any) -> Any:
    """The protocol's settings a run uses: ``secagg`` (``params.secagg``), with equal weights
    under dp_* (the noise is calibrated to an equally weighted mean of clipped updates)."""
    if dp is not None and secagg.weight_key is not None:
        return secagg.model_copy(update={"weight_key": None})
    return secagg


def check_dp(name: str, dp: Any, secagg: Any, theta0: Arrays) -> None:
    """Distributed DP (dp_* with secure_aggregation): StrategyParamsError, before round 1, when
    the protocol's rounding of one update (sqrt(values) * 2 r / steps, which the noise must
    also cover) exceeds a tenth of dp_clipping_norm: the stated clipping norm would not be
    the update's bound; raise secagg-quantization-range or lower secagg-clipping-range."""
    if dp is None or secagg is None or dp.clipping_norm <= 0:
        return
    rounding = privacy.secure_sensitivity(0.0, secagg, theta0)
    if rounding > 0.1 * dp.clipping_norm:
        raise StrategyParamsError(
            f"{name}: dp_clipping_norm = {dp.clipping_norm:g} with secure_aggregation: the protocol's "
            f"rounding can move one update by up to {rounding:.3g} (sqrt(values) * 2 * secagg_clipping_range / "
            f"secagg_quantization_range), more than a tenth of the clipping norm, so the noise would not give "
            f"the stated guarantee at that norm; raise secagg_quantization_range or lower secagg_clipping_range")


def by_cluster(trainers: list[str], assignment: dict[str, int]) -> dict[int, list[str]]:
    """The ``trainers`` grouped by their cluster in ``assignment``, in trainer order."""
    groups: dict[int, list[str]] = defaultdict(list)
    for key in trainers:
        groups[assignment[key]].append(key)
    return dict(groups)


def secure_groups(number: int, groups: dict[int, list[str]], protocol_settings: Any,
                  asks_of: Callable[[list[str]], list[Ask]]) -> Steps:
    """Run ``groups`` (cluster -> trainer keys) of round ``number`` under secure aggregation,
    each trainer asked what ``asks_of(keys)`` asks; the small-group rule applied first
    (``clusterfed.secagg.split_groups``: a group below the minimum is not asked, its model
    kept). Returns (``SecureSums`` with ``held`` set, the diagnostics)."""
    secure, held = split_groups(groups, protocol_settings)
    keys = [key for cluster in sorted(secure) for key in secure[cluster]]
    sums = (yield SecureTrain(asks_of(keys), {c: secure[c] for c in sorted(secure)}, protocol_settings,
                              session=f"round-{number}")) if keys else SecureSums()
    sums.held = {cluster: (len(groups[cluster]), why) for cluster, why in held.items()}
    return sums, {}


def add_noise(state: Any, cluster: int, outcome: GroupSum, dp: Any, protocol_settings: Any) -> dict[str, Any]:
    """Distributed DP: noise on ``cluster``'s unmasked mean of ``m`` client-clipped updates,
    of std ``z * C' / m`` where C' = the clipping norm plus the protocol's worst-case rounding
    of one update (``privacy.secure_sensitivity``); each member's update went into one more
    release (``state.dp_releases``). Returns what was released."""
    m = len(outcome.members)
    sensitivity = privacy.secure_sensitivity(dp.clipping_norm, protocol_settings, outcome.mean)
    std = dp.noise_multiplier * sensitivity / m if m else 0.0
    state.models[cluster] = privacy.add_noise(state.models[cluster], std, state.rng)
    if std > 0:
        for key in outcome.members:
            state.dp_releases[key] = state.dp_releases.get(key, 0) + 1
    return {"sampled": m, "noise_std": std}


def aggregate_sums(state: Any, sums: SecureSums, dp: Any, protocol_settings: Any, accountant: Any) -> Diagnostics:
    """Each cluster's new model in ``state`` (a ``ClusteredState``) from its unmasked mean
    (``GroupSum``): the aggregation never sees one client's update. Under ``dp`` the clients
    clipped their updates (the mod) and the mean is of equal weights; Gaussian noise goes on
    each cluster's mean here (``add_noise``). Clusters held back or whose protocol failed keep
    their models. Returns the diagnostics: ``secure_aggregation`` (per cluster), ``privacy``
    (``accountant``'s report, when there is one), and the round line's words (``decision``)."""
    state.aggregator_state = {c: s for c, s in state.aggregator_state.items() if c in state.models}
    released: dict[int, dict[str, Any]] = {}
    record: dict[str, Any] = {}
    words = []
    for cluster, outcome in sorted(sums.items()):
        if not isinstance(outcome, GroupSum):
            record[str(cluster)] = {"failed": outcome}
            words.append(f"cluster {cluster} failed ({outcome}), its model kept")
            continue
        if cluster not in state.models:
            continue
        state.models[cluster] = outcome.mean
        if dp is not None:
            released[cluster] = add_noise(state, cluster, outcome, dp, protocol_settings)
        record[str(cluster)] = {"members": len(outcome.members), "dropped": outcome.dropped,
                                "clipped": outcome.clipped, "bytes_down": outcome.bytes_down,
                                "bytes_up": outcome.bytes_up}
    held = getattr(sums, "held", {})
    for cluster, (size, why) in sorted(held.items()):
        record[str(cluster)] = {"held_back": why}
        words.append(f"cluster {cluster} held back ({size} trainer{'s' if size != 1 else ''}, below the minimum "
                     f"of {protocol_settings.minimum_group_size()}: not asked to train, model kept, never "
                     f"summed in the clear)")
    summed = [s for s in sums.values() if isinstance(s, GroupSum)]
    dropped = sum(len(s.dropped) for s in summed)
    sentence = (f"secure aggregation: {len(summed)} cluster sum{'s' if len(summed) != 1 else ''} of "
                f"{sum(len(s.members) for s in summed)} clients"
                + (f" ({dropped} dropped out, tolerated)" if dropped else "")
                + "".join(f"; {w}" for w in words))
    diagnostics: Diagnostics = {"secure_aggregation": record, "decision": sentence}
    if accountant is not None:
        diagnostics["privacy"] = accountant.report(state.dp_releases, state.assignment, released)
    return diagnostics


def sums_train_loss(sums: SecureSums) -> float | None:
    """The mean train loss the clients of the summed clusters reported in the clear."""
    losses = [loss for s in sums.values() if isinstance(s, GroupSum) for loss in s.losses.values()]
    return float(np.mean(losses)) if losses else None
