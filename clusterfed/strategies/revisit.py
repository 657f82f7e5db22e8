"""FedClust's and AdaCFL's revisits (an extension, ``revisit = true``): after the clustering
step, each round's training updates (of the whole model) are cut per cluster (into at most
sqrt(n / 2) parts of n members where the cut only beats group-free data); a cluster whose
cut reproduces in two successive rounds, sets more than single clients apart, beats
group-free rotations of the updates and has parts that point and pull apart, is split; two
clusters whose members' updates show no structure together (nor as the two clusters) and
point alike in two rounds running are merged, unless they were apart in two rounds running
before (two tasks whose models converge; with ``merge-probe``, such a pair is left to a probe
on one model, ``merge_probe.py``).
The tree and tests are the CFL family's (Sattler et al., "Clustered Federated Learning:
Model-Agnostic Distributed Multitask Optimization Under Privacy Constraints"), on the one-shot
strategies' state (``oneshot.OneShotState``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any, NamedTuple

import numpy as np

from clusterfed.clustering import stack_partials
from clusterfed.clustering.group_structure import SMALL_ROWS
from clusterfed.clustering.sketch import count_sketch
from clusterfed.clustering.oneshot import (BoundedCut, bounded_auto_cut, lone_rows, mean_cosine, most_alike,
                                          part_separation, threshold_cut)
from clusterfed.clustering.reproducible import (Reproduction, alike_before, apart_before, compare, reproduce_on_pairs,
                                                too_few_pairs)
from clusterfed.explain.generic import set_apart
from clusterfed.explain.numbers import compared
from clusterfed.core.exchange import Diagnostics, TrainReply, natural
from clusterfed.strategies.oneshot import MERGE_MIN_COSINE, OneShotParams, OneShotState, groups_tested, reproduced

# members of a cluster whose updates are cut (a cut needs 3; one more keeps a split from
# isolating a single client on one round's luck; a cut that only sets single clients apart is
# refused whatever the round, below)
REVISIT_MIN_MEMBERS = 4
# A client's own data makes its update direction persistent, so the members of one group
# cut alike round after round: reproduction alone does not make a split. A cut is a split when
# it also beats group-free rotations of the members' updates (``group_structure``: silhouette and
# the parts' separation against their own spread), its parts point apart as the merge rule
# reads them (mean-update cosine below ``MERGE_MIN_COSINE``, so that a split is not merged
# back), and (Sattler et al.'s ε2, relative to the cluster's own scale, as HiCFL's ε is in
# split_rules.relative_stability) they pull apart by at least this share of the cluster's
# update scale (its members' mean update norm in the round they were first cut): the converged
# members of one group pull apart at a small fraction of it.
REVISIT_MIN_SEPARATION = 0.5
# a cluster of fewer members than a small federation's (group_structure.SMALL_ROWS): its parts
# must point apart outright (a negative cosine: the cluster's model sits between them), Sattler et
# al.'s ε1 read on the cluster's own updates, beside the rotation test from its MIN_ROWS (a
# cluster is cut only in a round where SMALL_ROWS of its members trained, or all of a smaller
# one's: ``replies_needed``)
FEW_MEMBERS_MAX_COSINE = 0.0
# a cluster's latest cuts kept: at partial participation, where the latest shares too few of a
# round's members, the pairs of them that met in these are the evidence
REVISIT_CUTS_KEPT = 6
# the whole update's numbers kept for the split and merge tests beyond which it is sketched
# (as the CFL family's update-storage = sketch, whose default size this is)
WHOLE_SKETCH = 8192


def update_rows(replies: list[TrainReply], state: OneShotState, names: list[str] | None = None) -> np.ndarray:
    """The replies' training updates on ``names`` (default: the arrays the clustering compares),
    arrays no client changed left out."""
    names = list(state.layer_choice.keys) if names is None else list(names)
    silent = set(state.layer_choice.silent)
    names = [n for n in names if n not in silent] or names
    return stack_partials([[np.asarray(reply.update[n], np.float64) for n in names] for reply in replies])


def whole_rows(replies: list[TrainReply], state: OneShotState, whole: list[str], seed: int) -> np.ndarray:
    """The replies' training updates on every compared array ``whole``; longer than
    ``WHOLE_SKETCH`` numbers, a seeded CountSketch of them (inner products kept in expectation)."""
    X = update_rows(replies, state, whole)
    sketch = count_sketch(X.shape[1], WHOLE_SKETCH, seed)
    return X if sketch is None else np.asarray(sketch(X), np.float64)


def replies_needed(active_members: int) -> int:
    """The repliers a cluster's revisit asks of a round: ``SMALL_ROWS`` (the rotation test's rows
    beyond a small federation's), or every active member of a smaller cluster, and
    ``REVISIT_MIN_MEMBERS`` at least."""
    return max(REVISIT_MIN_MEMBERS, min(SMALL_ROWS, active_members))


def revisit(state: OneShotState, params: OneShotParams, server_round: int, replies: list[TrainReply],
            new_cluster: Any, strategy: str, whole: list[str] | None = None,
            active: Collection[str] | None = None) -> Diagnostics:
    """After a round's training (``replies``): split a cluster whose members' updates cut
    into the same partition as in the round it last trained (successive rounds: independent
    SGD draws), the cut passing ``_parts_refusal``'s tests (group-free rotations, parts
    pointing and pulling apart); merge two clusters whose members' updates show no structure
    together, whose two clusters do not beat group-free rotations (``_apart``) and whose mean
    updates point alike (cosine >= ``MERGE_MIN_COSINE``) in two rounds running, unless the two
    beat those rotations in two rounds running before (``state.revisit_apart``; rounds the pair
    is judged in: at partial participation those where enough of both trained). The updates
    read are those of every ``whole`` array (the compared arrays, sketched beyond
    ``WHOLE_SKETCH`` numbers; None: the clustering step's layer). A cluster is cut on
    ``replies_needed`` of its ``active`` members (default: all it holds), at partial
    participation over up to ``revisit-rounds`` rounds (``_pool``), and a pair compared for a
    merge only in a round where as many of each trained; one waiting for them is said and kept
    in ``state.revisit_waiting``. ``new_cluster``: the strategy's (model, inherit) -> id.
    Returns the diagnostics, with the round line's words under ``decision`` when anything was
    split, merged, refused or waits."""
    groups: dict[int, list[TrainReply]] = {}
    for reply in replies:
        if state.assignment.get(reply.key) == reply.cluster and reply.cluster in state.models:
            groups.setdefault(reply.cluster, []).append(reply)
    present = None if active is None else set(active)
    sizes = Counter(c for key, c in state.assignment.items() if present is None or key in present)
    # whether a cluster holds two tasks, or two clusters one, is the whole model's question
    # (``whole``, the compared arrays): the layer the clustering step compared is where the groups
    # showed in θ0's first epochs; once the model trains they can show elsewhere (a label swap in
    # the head), and groups that differ in one layer can train alike on another
    rows = {c: update_rows(g, state) if whole is None else whole_rows(g, state, whole, params.seed)
            for c, g in groups.items()}
    # every member trains every round at full participation: nothing to pool
    rounds = params.revisit_rounds if params.fraction_train < 1 else 1
    pooled = {c: _pool(state, server_round, c, groups[c], rows[c], replies_needed(sizes[c]), rounds, present)
              for c in sorted(groups)}
    said = [text for cluster in sorted(groups) if (text := _waiting(state, server_round, cluster, pooled[cluster],
                                                                    sizes[cluster], strategy))]
    said += [text for cluster in sorted(groups) if cluster not in state.revisit_waiting
             and (text := _maybe_split(state, params, server_round, cluster, *pooled[cluster], new_cluster, strategy))]
    # merges are judged on one round's repliers: two clusters' rows of different rounds would
    # differ by the rounds' drift
    judged = {c for c, g in groups.items() if c in state.models
              and (sizes[c] < REVISIT_MIN_MEMBERS or len(g) >= replies_needed(sizes[c]))}
    said += _merges(state, params, server_round, {c: r for c, r in rows.items() if c in judged}, strategy)
    return {"decision": "; ".join(said)} if said else {}


class Pooled(NamedTuple):
    """The rows a cluster's revisit cuts: its members' latest training updates (``keys``, ``X``)
    from rounds ``first`` to the current one."""

    keys: list[str]
    X: np.ndarray
    first: int


def _pool(state: OneShotState, server_round: int, cluster: int, group: list[TrainReply], X: np.ndarray,
          need: int, rounds: int, present: set[str] | None = None) -> Pooled:
    """This round's repliers of ``cluster`` (rows ``X``) when ``need`` of them trained; else, at
    partial participation, each member's latest update over the fewest of the last ``rounds``
    rounds that hold ``need`` members (all of them when none do; kept in ``state.revisit_pool``),
    of its ``present`` members (default: all).
    A client's own data makes its update direction persistent from round to round, as the
    reproduction test reads it: its update of a round before points as its group's do now."""
    keys = [reply.key for reply in group]
    if rounds == 1:
        return Pooled(keys, X, server_round)
    pool = state.revisit_pool.setdefault(cluster, {})
    for reply, row in zip(group, X):
        pool[reply.key] = {"round": server_round, "row": row}
    for key in [k for k, entry in pool.items() if entry["round"] <= server_round - rounds
                or state.assignment.get(k) != cluster or (present is not None and k not in present)]:
        del pool[key]
    if len(keys) >= need:
        return Pooled(keys, X, server_round)
    first = server_round
    for first in sorted({e["round"] for e in pool.values()}, reverse=True):
        if sum(e["round"] >= first for e in pool.values()) >= need:
            break
    held = sorted((k for k, e in pool.items() if e["round"] >= first), key=natural)
    return Pooled(held, np.vstack([pool[k]["row"] for k in held]), first)


def _revisit_cut(X: np.ndarray, params: OneShotParams) -> np.ndarray:
    """The auto cut of training updates (the best-silhouette cut against group-free data)."""
    labels, _ = threshold_cut(X, None, metric=params.distance, linkage=params.linkage,
                              min_silhouette=params.auto_min_silhouette, reference_draws=params.auto_reference_draws,
                              seed=params.seed, max_clusters=params.max_clusters)
    return np.asarray(labels)


def _split_cut(X: np.ndarray, params: OneShotParams) -> BoundedCut:
    """The cut a split is judged on: the auto cut of the members' updates, held to
    ``recut_max_clusters`` parts where its best cut has more parts than that and only beats
    group-free data (``bounded_auto_cut``, as AdaCFL's clustering step's is). A part with groups
    of its own is split again when it is revisited. The merge test keeps the unbounded cut: a
    merge needs no structure at any number of parts."""
    return bounded_auto_cut(X, metric=params.distance, linkage=params.linkage,
                            min_silhouette=params.auto_min_silhouette, reference_draws=params.auto_reference_draws,
                            seed=params.seed, max_clusters=params.max_clusters)


def _held_words(held: BoundedCut, params: OneShotParams) -> str:
    """Why a revisit's cut was held to few parts (``_split_cut``), in words."""
    best = held.unbounded
    return (f"best cut, into {best.num_clusters} parts, scored "
            f"{compared(best.silhouette, '<', params.auto_min_silhouette)} (below auto-min-silhouette)")


def _waiting(state: OneShotState, server_round: int, cluster: int, pooled: Pooled, size: int,
             strategy: str) -> str | None:
    """Whether ``cluster`` waits this round for repliers (``pooled`` holds fewer than
    ``replies_needed`` of its ``size`` active members over the rounds it pools): kept in
    ``state.revisit_waiting`` (since when, at most how many trained) and said; a cluster of fewer
    than ``REVISIT_MIN_MEMBERS`` is not revisited, silently. A partial sample's few repliers cut
    alike in two rounds by chance (4 shared clients in 2 parts: once in 3 or 4 rounds)."""
    need, trained = replies_needed(size), len(pooled.keys)
    if trained >= need:
        state.revisit_waiting.pop(cluster, None)
        return None
    if size < REVISIT_MIN_MEMBERS:
        return None
    waiting = state.revisit_waiting.setdefault(cluster, {"since": server_round, "trained": 0})
    waiting.update(trained=max(waiting["trained"], trained), members=size, needed=need)
    span = "" if pooled.first == server_round else f" in rounds {_span(pooled.first, server_round)}"
    return (f"{strategy}: cluster {cluster} not revisited: {trained} of its {size} members trained{span}, "
            f"fewer than the {need} its cut and merges are judged on")


def _maybe_split(state: OneShotState, params: OneShotParams, server_round: int, cluster: int,
                 keys: list[str], X: np.ndarray, first: int, new_cluster: Any, strategy: str) -> str | None:
    """Split ``cluster`` when the cut of its members' updates (``keys``, ``X``: of rounds
    ``first`` to this one) passes the parts' tests and reproduces a cut of earlier rounds'; the
    round line's words when it splits, or when a cut was found and refused (why), else None."""
    if len(keys) < REVISIT_MIN_MEMBERS:
        return None
    held = _split_cut(X, params)
    labels, bound = np.asarray(held.cut.labels), held.bound
    scale = state.revisit_scale.setdefault(cluster, float(np.linalg.norm(X, axis=1).mean()))
    parts = len(np.unique(labels))
    refused = _parts_refusal(X, labels, scale, params, bound) if parts > 1 else None
    alone = lone_rows(labels) if parts > 1 and not refused else []
    if alone:  # as the clustering step's cut (``oneshot.gate``): a real group shows once more of it trains
        refused = set_apart(", ".join(keys[i] for i in alone), subject="the cut")
    if refused:
        labels = np.zeros_like(labels)  # one group's spread, not a split: both rounds compared must pass
    current = {key: int(label) for key, label in zip(keys, labels)}
    previous = state.revisit_cuts.get(cluster)
    earlier = [] if previous is None else [*previous.get("earlier", []),
                                           {"round": previous["round"], "labels": previous["labels"],
                                            "first": previous.get("first", previous["round"])}]
    state.revisit_cuts[cluster] = {"round": server_round, "labels": current, "first": first,
                                   "earlier": earlier[-(REVISIT_CUTS_KEPT - 1):]}
    kept = earlier
    # independent evidence only: cuts of rounds before the rows cut now
    earlier = [entry for entry in earlier if entry["round"] < first]
    held_words = None if bound is None else _held_words(held, params)
    at_most = "" if held_words is None else f" (held to at most {bound}: their {held_words})"
    not_split = f"{strategy}: cluster {cluster} not split: its members' training updates cut into {parts} parts{at_most}"
    if refused:
        return f"{not_split}, but {refused}"
    if held_words is not None and parts < 2:
        return (f"{strategy}: cluster {cluster} not split: its members' training updates' {held_words}; "
                f"held to at most {bound} parts, they show no structure beyond group-free data")
    if not earlier or parts < 2:
        return None
    reproduction = _against_earlier(earlier, current, server_round, first)
    if isinstance(reproduction, str):
        return f"{strategy}: split of cluster {cluster} deferred: {reproduction}"
    if not reproduced(reproduction, params):
        if min(reproduction.clusters()) < 2:  # the earlier cut (or all pairs) found no split
            return f"{not_split}, but {reproduction.source}: the earlier cut kept these clients together"
        return f"{not_split}, but {reproduction.words(params.reproduce_agreement)}"
    members = sorted((k for k, c in state.assignment.items() if c == cluster), key=natural)
    largest = max(set(current.values()), key=list(current.values()).count)
    model = state.models.pop(cluster)
    children = {label: new_cluster(model, cluster) for label in sorted(set(current.values()))}
    for key in members:
        state.assignment[key] = children[current[key] if key in current else _last_side(key, kept, current, largest)]
    reference = state.references.pop(cluster, None)
    if reference is not None:  # a newcomer is placed by the clustering step's rows: the parent's
        state.references.update(dict.fromkeys(children.values(), reference))
    forget(state, cluster)  # each part's own scale is taken when it is first cut
    made = sorted(children.values())
    sizes = {c: sum(1 for k in members if state.assignment[k] == c) for c in made}
    state.revisits.append({"round": server_round, "action": "split", "cluster": cluster, "into": made,
                           "members": len(members), **reproduction.as_record()})
    named = ", ".join(f"{c} (a single client)" if sizes[c] == 1 else f"{c} ({sizes[c]} clients)" for c in made)
    return (f"{strategy}: cluster {cluster} ({len(members)} clients) split into clusters "
            f"{named}: its members' training updates{at_most} cut alike in "
            f"{reproduction.words(params.reproduce_agreement)}")


def forget(state: OneShotState, cluster: int) -> None:
    """Drop what the revisits (and its aggregator) kept of ``cluster``, a cluster just replaced
    by others: its cuts, wait, pooled rows, update scale, the pairs it was judged apart in."""
    state.revisit_cuts.pop(cluster, None)
    state.revisit_waiting.pop(cluster, None)
    state.revisit_pool.pop(cluster, None)
    state.revisit_scale.pop(cluster, None)
    state.revisit_apart = {p: r for p, r in state.revisit_apart.items() if not _in_pair(p, cluster)}
    state.aggregator_state.pop(cluster, None)


def _parts_refusal(X: np.ndarray, labels: np.ndarray, scale: float, params: OneShotParams,
                   max_clusters: int | None = None) -> str | None:
    """Why a cut of one round's updates is no split, or None when it beats group-free
    rotations of them (below a small federation's ``SMALL_ROWS`` members its parts must also
    point apart outright; below the test's ``MIN_ROWS`` that alone) and its parts point and
    pull apart; ``max_clusters``: the bound the cut was held to (``_split_cut``), which the
    rotations' cuts are held to as well."""
    tested = groups_tested(X, labels, params, max_clusters)
    if tested is not None and not tested.passes:
        return f"{tested.words()}: one task's spread"
    cosine = most_alike(X, labels)[0]
    bar = MERGE_MIN_COSINE if tested is not None and len(X) >= SMALL_ROWS else FEW_MEMBERS_MAX_COSINE
    if cosine >= bar:
        return f"its parts point alike (mean-update cosine {compared(cosine, '>=', bar)}): one task"
    separation = part_separation(X, labels) / scale if scale > 0 else 0.0
    if separation < REVISIT_MIN_SEPARATION:
        return (f"its parts pull apart by {compared(separation, '<', REVISIT_MIN_SEPARATION)} of the cluster's "
                "update scale: one group's spread")
    return None


def _against_earlier(earlier: list[dict[str, Any]], current: dict[str, int], server_round: int,
                     first: int) -> Reproduction | str:
    """This round's cut (of rounds ``first`` to ``server_round``) against the latest earlier one
    sharing ``REVISIT_MIN_MEMBERS`` of its clients, or (partial participation) against the pairs
    of them seen together in the earlier cuts kept; why not, in words, when neither holds enough."""
    latest = earlier[-1]
    then, now = _span(latest.get("first", latest["round"]), latest["round"]), _span(first, server_round)
    common = [key for key in current if key in latest["labels"]]
    if len(common) >= REVISIT_MIN_MEMBERS:
        return compare([latest["labels"][k] for k in common], [current[k] for k in common],
                       f"rounds {then} and {now}")
    found = reproduce_on_pairs([(e["round"], e["labels"]) for e in earlier], current, REVISIT_MIN_MEMBERS,
                               server_round)
    if found is None:
        return (f"rounds {then} and {now} share fewer than {REVISIT_MIN_MEMBERS} of its members, "
                f"{too_few_pairs(REVISIT_MIN_MEMBERS)}")
    return found[0]


def _span(first: int, last: int) -> str:
    """Rounds ``first`` to ``last`` in words: "3", or "3–5"."""
    return f"{last}" if first == last else f"{first}–{last}"


def _in_pair(pair: str, cluster: int) -> bool:
    """Whether ``cluster`` is one of the pair ``"a-b"`` (the key of ``revisit_alike`` and
    ``revisit_apart``)."""
    return str(cluster) in pair.split("-")


def _last_side(key: str, earlier: list[dict[str, Any]], current: dict[str, int], largest: int) -> int:
    """The part of this round's cut an absent member joins: in the latest earlier cut holding
    it, the one with the most of its side there less the most of the other sides (a member
    whose side is all absent now goes where the clients it was cut from are not); the largest
    on a tie."""
    for entry in reversed(earlier):
        if key in entry["labels"]:
            side = entry["labels"][key]
            score = dict.fromkeys(set(current.values()), 0)
            for other, part in current.items():
                if other in entry["labels"]:
                    score[part] += 1 if entry["labels"][other] == side else -1
            best = max(score.values())
            return largest if score[largest] == best else min(p for p, v in score.items() if v == best)
    return largest


def _merges(state: OneShotState, params: OneShotParams, server_round: int, rows: dict[int, np.ndarray],
            strategy: str) -> list[str]:
    said = []
    clusters = sorted(c for c, X in rows.items() if len(X) >= 2)
    for i, a in enumerate(clusters):
        for b in clusters[i + 1:]:
            if a not in state.models or b not in state.models:
                continue
            pair = f"{a}-{b}"
            together = np.vstack([rows[a], rows[b]])
            cosine = mean_cosine(rows[a], rows[b])
            # tested in every round the pair is judged until held (a group test per pair and round):
            # a pair apart in two judged rounds running holds two tasks, and its later likeness is
            # its models converging (their updates shrink to what the tasks share), not one task
            held, apart = state.revisit_apart.get(pair, []), None
            if len(held) < 2:
                apart = _apart(together, len(rows[a]), params)
                held = apart_before(state.revisit_apart, pair, apart, server_round) or []
            alike = (cosine >= MERGE_MIN_COSINE and len(np.unique(_revisit_cut(together, params))) == 1
                     and not (_apart(together, len(rows[a]), params) if apart is None else apart))
            seen = alike_before(state.revisit_alike, pair, alike, server_round)
            if seen is None:
                continue
            if held:
                # with merge-probe, a held pair is left to a probe on one model (``merge_probe.queue``)
                # unless one found it apart
                probe = params.merge_probe and "apart" not in [p.get("verdict") for p in pair_probes(state, a, b)]
                said.append(f"{strategy}: clusters {a} and {b} not merged: their members' training updates show no "
                            f"structure together and point alike (mean-update cosine {cosine:.2f}) in rounds {seen} "
                            f"and {server_round}, but were apart beyond group-free rotations in rounds "
                            f"{held[0]} and {held[1]}: " + ("left to a merge probe, which compares them on one model"
                                                            if probe else "two tasks whose models converge"))
                continue
            merge_into(state, server_round, a, b, {"cosine": round(cosine, 4), "rounds": [seen, server_round]})
            said.append(f"{strategy}: clusters {a} and {b} merged: their members' training updates show no structure "
                        f"together and point alike (mean-update cosine {cosine:.2f} >= {MERGE_MIN_COSINE}) in rounds "
                        f"{seen} and {server_round}")
    return said


def pair_probes(state: OneShotState, a: int, b: int) -> list[dict[str, Any]]:
    """The merge probes (``merge_probe.py``) clusters ``a`` and ``b`` were queued for together,
    either as the guest, a guest's earlier probes included."""
    return [probe for guest, latest in state.merge_probes.items()
            for probe in [latest, *latest.get("earlier", [])] if {guest, probe["host"]} == {a, b}]


def _apart(together: np.ndarray, first: int, params: OneShotParams) -> bool:
    """Whether two clusters' members (the first ``first`` rows of ``together``, then the
    other's) are a cut into groups: their clusters beat group-free rotations of their rows."""
    labels = np.r_[np.zeros(first, np.int64), np.ones(len(together) - first, np.int64)]
    tested = groups_tested(together, labels, params, max_clusters=2)
    return tested is not None and tested.passes


def merge_into(state: OneShotState, server_round: int, a: int, b: int, record: dict[str, Any], *,
               mean_models: bool = True) -> None:
    """Cluster ``b`` joins ``a``: its members, and ``a``'s model becomes the member-weighted mean
    of the two (``mean_models``; else ``a``'s model is kept); ``record``: what the merge was
    decided on, kept with it in ``state.revisits``."""
    size_a = sum(1 for c in state.assignment.values() if c == a)
    size_b = sum(1 for c in state.assignment.values() if c == b)
    wa = size_a / max(size_a + size_b, 1)
    model_b = state.models.pop(b)
    if mean_models:
        state.models[a] = {k: (wa * np.asarray(v, np.float64) + (1 - wa) * np.asarray(model_b[k], np.float64)).astype(
            np.asarray(v).dtype) for k, v in state.models[a].items()}
    for key, c in list(state.assignment.items()):
        if c == b:
            state.assignment[key] = a
    state.references.pop(b, None)
    if b in state.revisit_scale:
        state.revisit_scale[a] = max(state.revisit_scale.get(a, 0.0), state.revisit_scale.pop(b))
    for gone in (a, b):
        state.revisit_cuts.pop(gone, None)
        state.revisit_waiting.pop(gone, None)
        state.revisit_pool.pop(gone, None)
    state.aggregator_state.pop(b, None)
    state.revisit_alike = {p: r for p, r in state.revisit_alike.items() if not _in_pair(p, b)}
    # a held pair of ``a``'s stays held (its two tasks are in ``a`` still); a pending one was judged
    # on ``a`` without ``b``'s members
    state.revisit_apart = {p: r for p, r in state.revisit_apart.items()
                           if not _in_pair(p, b) and (len(r) == 2 or not _in_pair(p, a))}
    state.revisits.append({"round": server_round, "action": "merge", "clusters": [a, b], **record})
