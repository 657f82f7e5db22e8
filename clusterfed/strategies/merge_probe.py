"""FedClust's and AdaCFL's merge probe (an extension, ``merge-probe = true``, with ``revisit``):
a cluster that a revisit split off is compared, on one shared model, with the cluster its
members' updates point most alike to; so are two clusters the revisits hold apart once their
updates on their own models point alike.

Why: the revisits' merge test (``revisit.py``) reads two clusters' members' training updates,
each taken on its own cluster's model. A part split off a cluster that held two tasks trains
from that cluster's model, a model of the mixture it left, so it and the cluster of its own task
point apart however alike their tasks are, and the merge test never joins them: the run ends
with more clusters than tasks. And two clusters apart in two rounds running are held apart by
the merge test for good (their later likeness read as two tasks whose models converge), which
also keeps apart the two parts of one task that a split cut early, on the spread of its
clients' own data. On one model the question is the merge test's own.

In a probe round, the part's members (the guests) train their own cluster's model as in any
round, and then, in a second exchange of the round, the other cluster's (the host's) model for
evidence only: those updates are compared, never averaged, so a probe costs the guests a
training, not a round of progress. The guests join the host, whose model is kept, when in two
probe rounds running nothing in the members' updates sets the two clusters apart (the auto cut
of their updates does not lie along them: a cut of one task's spread crosses both; as two
clusters they do not beat group-free rotations of the updates) and their mean updates point
alike (cosine at least ``MERGE_MIN_COSINE``), as the revisits' merges are judged (Sattler et
al., "Clustered Federated Learning: Model-Agnostic Distributed Multitask Optimization Under
Privacy Constraints"). The
first probe round that finds them apart ends the probe; the pair is not probed again. A cluster
takes part in one probe at a time. A probe runs in the first round after it was queued where
neither cluster is in another probe and each has 2 active members. Where fewer of either
cluster's members trained than the revisits judge a cluster on (``revisit.replies_needed``, every
member of a smaller one), active members beyond the round's sample (and beyond its members
whose training failed) are asked too, in the second exchange, as the CFL family's
``split-min-repliers`` does (at partial participation, a round where enough of both were sampled
may never come).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any

import numpy as np
from sklearn.metrics import adjusted_rand_score

from clusterfed.clustering.oneshot import mean_cosine
from clusterfed.core.exchange import Arrays, Diagnostics, Round, TrainReply
from clusterfed.explain.numbers import compared
from clusterfed.strategies import revisit
from clusterfed.strategies.oneshot import MERGE_MIN_COSINE, OneShotParams, OneShotState
from clusterfed.strategies.resampling import top_up

# probe rounds that must find the two clusters alike before they merge (a merge reproduces)
ALIKE_ROUNDS = 2


def train(strategy: Any, rnd: Round, trainers: list[str]) -> Any:
    """The base's training step (``ClusteredStrategy.train``), then, when a probe runs, a second
    exchange: the guests, and host members beyond those of the sample that replied, on the
    host's model, their replies kept as ``rnd.evidence_replies`` (never averaged)."""
    replies = yield strategy.train_asks(rnd, trainers)
    # a sampled member whose training failed is replaced as the top-up's (not asked again this round)
    replied = {r.key for r in replies}
    models, beyond = train_models(strategy.state, strategy.params, rnd, [k for k in trainers if k in replied],
                                  failed={k for k in trainers if k not in replied})
    if models or beyond:
        asked = [k for k in rnd.active if k in models or k in beyond]
        rnd.evidence_replies = list((yield strategy.train_asks(rnd, asked, models=models, evidence=True)))
    return replies, {}


def after_train(strategy: Any, rnd: Round, replies: list[TrainReply]) -> Diagnostics | None:
    """After the round's training: the clusters revisited on the replies of those that trained
    their own cluster's model (``revisit.revisit``), the probes that ran judged (``judge``), and
    the clusters a split made, and the held pairs that point alike, queued for a probe
    (``queue``). Returns the diagnostics."""
    state, params, name = strategy.state, strategy.params, type(strategy).__name__
    if not (params.revisit and state.clustered):
        return None
    whole = strategy.compared_names()
    own = [r for r in replies if r.key not in rnd.evidence_only]
    diagnostics = revisit.revisit(state, params, rnd.number, own, strategy.new_cluster, name, whole=whole,
                                  active=rnd.active)
    said = [diagnostics["decision"]] if "decision" in diagnostics else []
    said += judge(state, params, rnd.number, own, rnd.evidence_replies, whole, name)
    said += queue(state, params, rnd.number, own, whole, name)
    return {**diagnostics, "decision": "; ".join(said)} if said else diagnostics


def train_models(state: OneShotState, params: OneShotParams, rnd: Round, trainers: list[str],
                 failed: Collection[str] = ()) -> tuple[dict[str, Arrays], list[str]]:
    """The round's guests (key -> the host's model they train in the second exchange), and the
    host's active members beyond the sample asked in it too: each pending probe
    whose two clusters are in no other probe this round and have 2 active members each, its
    guests and host members topped up beyond ``trainers`` (those that trained this round) to
    ``revisit.replies_needed`` of each (every member of a smaller cluster), in an order seeded
    by the round, from the members not ``failed`` this round. Marks the probe as running this
    round, with its guests."""
    if not (params.revisit and params.merge_probe):
        return {}, []
    busy: set[int] = set()
    models: dict[str, Arrays] = {}
    beyond: list[str] = []
    training = set(trainers)
    # the most alike first: the part most likely of the other's task
    for guest, probe in sorted(state.merge_probes.items(), key=lambda item: (-item[1]["cosine"], item[0])):
        host = probe["host"]
        if "verdict" in probe:
            continue
        if guest not in state.models or host not in state.models:  # split or merged since it was queued
            probe["verdict"] = "gone"
            continue
        if {guest, host} & busy:
            continue
        members = {c: [k for k in rnd.members(state.assignment, c) if k not in failed] for c in (guest, host)}
        if any(len(members[c]) < 2 for c in (guest, host)):
            continue
        # topped up as the CFL family's split-min-repliers, by a generator of the round and cluster's own
        asked = {c: [k for k in members[c] if k in top_up(np.random.default_rng([params.seed, rnd.number, c]),
                                                            trainers, {c: members[c]},
                                                            revisit.replies_needed(len(members[c])), {})]
                 for c in (guest, host)}
        busy |= {guest, host}
        beyond += [k for c in (guest, host) for k in asked[c] if k not in training]
        probe["running"] = {"round": rnd.number, "guests": asked[guest]}
        models.update(dict.fromkeys(asked[guest], state.models[host]))
    return models, beyond


def judge(state: OneShotState, params: OneShotParams, server_round: int, replies: list[TrainReply],
          probe_replies: list[TrainReply], whole: list[str], strategy: str) -> list[str]:
    """Each probe that ran this round, judged on its host's members' training updates (the
    round's ``replies`` and, beyond the sample, ``probe_replies``) and its guests' on the host's
    model (``probe_replies``), on every ``whole`` array, as the revisits read them: the guests
    join the host once alike in ``ALIKE_ROUNDS`` probe rounds running; apart, the probe ends.
    The round line's words."""
    said = []
    for guest, probe in sorted(state.merge_probes.items()):
        running = probe.pop("running", None)
        if running is None or running["round"] != server_round:
            continue
        host = probe["host"]
        if guest not in state.models or host not in state.models:  # the revisits split or merged one this round
            probe["verdict"] = "gone"
            continue
        guests = set(running["guests"])
        G = [r for r in probe_replies if r.key in guests]
        H = [r for r in [*replies, *probe_replies]
             if r.key not in guests and r.cluster == host and state.assignment.get(r.key) == host]
        on = f"on cluster {host}'s model (a merge probe)"
        if len(G) < 2 or len(H) < 2:
            said.append(f"{strategy}: clusters {guest} and {host} not compared {on}: {len(G)} and {len(H)} of "
                        f"their members replied, fewer than 2")
            continue
        rows_g = revisit.whole_rows(G, state, whole, params.seed)
        rows_h = revisit.whole_rows(H, state, whole, params.seed)
        together = np.vstack([rows_h, rows_g])
        cosine = mean_cosine(rows_g, rows_h)
        membership = np.r_[np.zeros(len(rows_h), np.int64), np.ones(len(rows_g), np.int64)]
        cut = revisit._revisit_cut(together, params)
        # a cut of one task's spread may cross both clusters: only a cut along them tells them apart
        along = float(adjusted_rand_score(membership, cut)) if len(np.unique(cut)) > 1 else 0.0
        apart = revisit._apart(together, len(rows_h), params)
        record = {"round": server_round, "cosine": round(cosine, 4), "cut_along": round(along, 4), "apart": apart}
        probe.setdefault("rounds", []).append(record)
        if cosine >= MERGE_MIN_COSINE and along < params.reproduce_agreement and not apart:
            alike = [r["round"] for r in probe["rounds"][-ALIKE_ROUNDS:]]
            if len(probe["rounds"]) < ALIKE_ROUNDS:
                said.append(f"{strategy}: cluster {guest}'s members trained cluster {host}'s model (a merge "
                            f"probe): nothing in their training updates and cluster {host}'s members' "
                            f"sets the two apart, and they point alike (mean-update cosine {cosine:.2f}) in round {server_round}; "
                            f"merged if alike again in the next probe round")
                continue
            probe["verdict"] = "merged"
            members = sum(1 for c in state.assignment.values() if c == guest)
            revisit.merge_into(state, server_round, host, guest, {"cosine": round(cosine, 4), "rounds": alike,
                                                                   "probe": True}, mean_models=False)
            said.append(f"{strategy}: cluster {guest} ({members} clients) merged into cluster {host}: trained "
                        f"{on}, nothing in their members' training updates and cluster {host}'s sets "
                        f"the two apart, and they point alike (mean-update cosine {cosine:.2f} >= {MERGE_MIN_COSINE}) in rounds "
                        f"{' and '.join(map(str, alike))}")
            continue
        probe["verdict"] = "apart"
        why = ("as two clusters they beat group-free rotations of the updates" if apart else
               f"their best cut sets the two clusters apart (ARI {compared(along, '>=', params.reproduce_agreement)})"
               if along >= params.reproduce_agreement else
               f"they point apart (mean-update cosine {compared(cosine, '<', MERGE_MIN_COSINE)})")
        said.append(f"{strategy}: cluster {guest} kept apart from cluster {host}: trained {on}, its members' "
                    f"training updates and cluster {host}'s differ in round {server_round}: {why}")
    return said


def queue(state: OneShotState, params: OneShotParams, server_round: int, replies: list[TrainReply],
          whole: list[str], strategy: str = "") -> list[str]:
    """After this round's revisits: each cluster a split made this round is queued for a probe
    with the cluster, other than the split's own parts, whose members' mean training update
    this round points most alike to its members' (positive cosine; none: no probe). And each
    pair the revisits hold apart (apart in two rounds running before) whose members' updates
    on their own models are alike this round is queued too, the smaller cluster the guest: alike
    on two models may be two tasks whose models converge, or one task a split cut in two, which
    one model tells apart. Returns the round line's words for the pairs queued so."""
    if not (params.revisit and params.merge_probe):
        return []
    made = [r["into"] for r in state.revisits if r["action"] == "split" and r["round"] == server_round]
    held = sorted(tuple(map(int, pair.split("-"))) for pair, rounds in state.revisit_apart.items()
                  if len(rounds) == 2 and state.revisit_alike.get(pair) == server_round)
    if not (made or held):
        return []
    by_cluster: dict[int, list[TrainReply]] = {}
    for reply in replies:
        cluster = state.assignment.get(reply.key)
        if cluster in state.models and (reply.cluster == cluster or any(cluster in into for into in made)):
            by_cluster.setdefault(cluster, []).append(reply)
    rows = {c: revisit.whole_rows(g, state, whole, params.seed) for c, g in by_cluster.items() if len(g) >= 2}
    for into in made:
        for guest in into:
            if guest not in rows:
                continue
            hosts = {h: mean_cosine(rows[guest], X) for h, X in rows.items() if h not in into}
            best = max(hosts, key=lambda h: (hosts[h], -h), default=None)
            if best is not None and hosts[best] > 0:
                state.merge_probes[guest] = {"host": best, "queued": server_round, "cosine": round(hosts[best], 4)}
    said = []
    size = Counter(state.assignment.values())
    for a, b in held:
        if not {a, b} <= state.models.keys() or not {a, b} <= rows.keys() or revisit.pair_probes(state, a, b):
            continue
        # the smaller cluster visits the larger's model (as a split's part visits the cluster it left);
        # one still in another probe waits: the pair is queued the next round it points alike
        guest, host = min([(a, b), (b, a)], key=lambda gh: (size[gh[0]], -gh[0]))
        earlier = state.merge_probes.get(guest)
        if earlier is not None and "verdict" not in earlier:
            continue
        cosine = mean_cosine(rows[guest], rows[host])
        state.merge_probes[guest] = {"host": host, "queued": server_round, "cosine": round(cosine, 4), "held": True,
                                     **({"earlier": [*earlier.pop("earlier", []), earlier]} if earlier else {})}
        said.append(f"{strategy}: clusters {a} and {b} point alike on their own models (mean-update cosine "
                    f"{cosine:.2f}) but were held apart before: cluster {guest}'s members will train cluster "
                    f"{host}'s model too (a merge probe), which tells two tasks whose models converge from "
                    f"one task cut in two")
    return said


def record(state: OneShotState) -> dict[str, Any]:
    """The probes for clusters.json: each guest's host, when it was queued, its rounds and verdict
    (``held``: a pair the revisits held apart; ``earlier``: the guest's probes before it)."""
    return {"merge_probes": {str(g): p for g, p in sorted(state.merge_probes.items())}} if state.merge_probes else {}
