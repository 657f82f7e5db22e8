"""Which arrays CFL and LayerCFL compare, and which HiCFL reproduces its partitions on
(``decision-arrays = evidence``, beyond Sattler et al. and the LayerCFL and HiCFL papers): one
array, where the arrays the strategy compares and the whole update show no structure and that
array does.

Sattler, Müller and Samek compare the clients' whole updates. On a model whose groups differ in
what one array learns (the input weights of a recurrent layer, a patch embedding) the other
arrays' updates, alike across groups or each client's own, can hide the groups in the whole
update's cosines. While the run has one cluster, each round scores every array of two or more
dimensions (with its bias) and every array together, as the one-shot strategies score layers
(``clustering.layer_evidence``): the best-silhouette cut into 2..``max_clusters`` clusters on
cosine distances, against the fixed bar or group-free rotations, the bar raised for the number of
candidates. An array is chosen once it is the most structured candidate, with clusters found,
in two successive rounds (each with at least ``MIN_REPLIES`` repliers) where every array
together found none, nor did the strategy's own arrays (``own``: LayerCFL's selected layers); the earlier rounds' partitions, of every array, are then forgotten, and
splits and merges compare the chosen array. A round's leader is the most structured array whose cut
also beats group-free rotations of its rows (``group_structure``, the test a split on evidence must
pass, at a level shared by the candidates): an array whose cut only sorts each client's own data
(an auxiliary head's) can lead on silhouette and then never split; when the most structured fails,
the others are asked, as FedClust's layer choice asks them. Where the whole update
shows structure it is kept: one array alone can show a coarser partition (an auxiliary head's
targets) or a cut of one group's own data. The choice is made once; splits are still taken on
their own evidence (``split-timing``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from clusterfed.clustering.group_structure import group_test
from clusterfed.clustering.layer_evidence import (LayerScore, finer_than, most_structured, record_margin, score_layers,
                                                  scored_rows)
from clusterfed.clustering.null_reference import shared_draws
from clusterfed.clustering.sketch import count_sketch
from clusterfed.clustering.vectors import flatten, stack_float64
from clusterfed.models.layers import both_ends

EVERY = "every array"
# each candidate's updates are count-sketched to this many numbers before scoring: cosines kept
# within the sketch's error, the group-free references' cost bounded on any model
SCORED_NUMBERS = 2048
MIN_REPLIES = 4  # fewer repliers than this: no round scored
# the most single arrays scored: each is a cut with group-free references, their draws raised
# by the number of candidates, every round while the run has one cluster; beyond it the
# first and last arrays in state-dict order, where feature and label shifts act
MAX_CANDIDATES = 16


def candidates(compared: list[str], theta0: dict[str, np.ndarray]) -> dict[str, list[str]]:
    """Candidate -> its arrays: each compared array of two or more dimensions with its bias (the
    same name with ``weight`` read as ``bias``; at most ``MAX_CANDIDATES``), and every array
    together; empty when that is the only choice."""
    names = set(compared)
    found: dict[str, list[str]] = {}
    matrices = [key for key in compared if np.ndim(theta0[key]) >= 2]
    matrices = both_ends(matrices, MAX_CANDIDATES)
    for key in compared:
        if key in matrices:
            head, weight, tail = key.rpartition("weight")  # the last "weight" only: lightweight.weight -> lightweight.bias
            bias = head + "bias" + tail if weight else key
            found[key] = [key] + ([bias] if bias != key and bias in names and np.ndim(theta0[bias]) == 1 else [])
    if not found or (len(found) == 1 and len(next(iter(found.values()))) == len(compared)):
        return {}
    return {**found, EVERY: list(compared)}


def sketched_rows(updates: list[dict[str, np.ndarray]], keys: list[str], seed: int) -> np.ndarray:
    X = stack_float64([flatten(u, keys) for u in updates])
    sketch = count_sketch(X.shape[1], SCORED_NUMBERS, seed)
    return X if sketch is None else np.asarray(sketch(X), dtype=np.float64)


def leader_of(scores: list[LayerScore], blind: set[str], passing: set[str] | None = None) -> str | None:
    """The most structured single array, where it found clusters and the ``blind`` candidates
    (every array together, the strategy's own arrays) did not; with ``passing``, among those
    arrays (``most_structured``), none when none of them found clusters."""
    best = most_structured(scores, passing=passing)
    found = {s.layer for s in scores if s.clusters > 1}
    if passing is not None and best.layer not in passing:
        return None
    return best.layer if best.layer in found and not found & blind and best.layer not in blind else None


def beats_rotations(rows: np.ndarray, score: LayerScore, *, tests: int, reference_draws: int,
                    max_clusters: int | None, seed: int) -> bool:
    """Whether an array's accepted cut (``score.labels``, of ``scored_rows``) beats group-free
    rotations of its rows, as one of ``tests`` tests (``shared_draws``); True where the test
    cannot run (too few rows)."""
    X = np.asarray(rows, np.float64)[scored_rows(len(rows), seed)]
    tested = group_test(X, np.asarray(score.labels), metric="cosine", linkage="average", max_clusters=max_clusters,
                        draws=shared_draws(reference_draws, tests), seed=seed)
    return tested is None or tested.passes


def tested_leader(scores: list[LayerScore], rows: dict[str, np.ndarray], blind: set[str], *, reference_draws: int,
                  max_clusters: int | None, seed: int) -> tuple[str | None, dict[str, bool]]:
    """``leader_of``, asked of the rotation test (``beats_rotations``): the leader when its cut
    passes; else the most structured of the other arrays whose cut passes, or none. The answers
    given, by array (``taken``)."""
    leader = leader_of(scores, blind)
    if leader is None or reference_draws <= 0:
        return leader, {}
    by_layer = {s.layer: s for s in scores}

    def beats(layer: str) -> bool:
        return beats_rotations(rows[layer], by_layer[layer], tests=len(scores), reference_draws=reference_draws,
                               max_clusters=max_clusters, seed=seed)

    taken = {leader: beats(leader)}
    if taken[leader]:
        return leader, taken
    taken.update({s.layer: beats(s.layer) for s in scores
                  if s.clusters > 1 and s.labels is not None and s.layer not in blind and s.layer != leader})
    return leader_of(scores, blind, passing={layer for layer, ok in taken.items() if ok}), taken


def with_own(found: dict[str, list[str]], own: tuple[str, list[str]] | None) -> tuple[dict[str, list[str]], str | None]:
    """The candidates with the strategy's own arrays (name, arrays) among them, and the
    candidate that stands for them: an existing one with the same arrays, else its own row."""
    if own is None:
        return found, None
    name, arrays = own
    same = next((key for key, keys in found.items() if sorted(keys) == sorted(arrays)), None)
    return (found, same) if same is not None else ({**found, name: list(arrays)}, name)


def score_round(choice: dict[str, Any], server_round: int, updates: list[dict[str, np.ndarray]], compared: list[str],
                theta0: dict[str, np.ndarray], *, min_silhouette: float, reference_draws: int, max_clusters: int,
                seed: int, own: tuple[str, list[str]] | None = None) -> list[str] | None:
    """Score this round's candidates on ``updates`` (one per replier) into ``choice`` (the
    state's record: ``round``, ``leader``, ``scores``, ``own``, ``previous_round`` and ``chosen``
    once chosen); the chosen arrays once the same array led two successive scored rounds, else
    None. ``own``: the strategy's own arrays, by name, where they are not every array."""
    found = candidates(compared, theta0)
    if not found or len(updates) < MIN_REPLIES or min_silhouette <= -1:
        # not scored (at a bar of -1 every array together finds clusters: no choice could be made);
        # the next scored round cannot be the second of two successive ones
        return None
    found, own_name = with_own(found, own)
    rows = {name: sketched_rows(updates, keys, seed + i) for i, (name, keys) in enumerate(found.items())}
    scores = score_layers(rows, metric="cosine", linkage="average", min_silhouette=min_silhouette,
                          reference_draws=reference_draws, max_clusters=max_clusters, seed=seed)
    leader, taken = tested_leader(scores, rows, {EVERY} | ({own_name} if own_name else set()),
                                  reference_draws=reference_draws, max_clusters=max_clusters, seed=seed)
    previous, previous_round = choice.get("leader"), choice.get("round")
    choice.update(round=server_round, leader=leader,
                  scores=[{**s.record(), **({"taken": taken[s.layer]} if s.layer in taken else {})} for s in scores],
                  own=None if own is None else {"name": own[0], "candidate": own_name})
    if leader is None or leader != previous or previous_round != server_round - 1:
        return None
    choice.update(chosen=leader, previous_round=previous_round)
    return list(found[leader])


def record(state: Any) -> dict[str, Any]:
    """``clusters.json``'s ``array_choice``: the last candidates' scores and the arrays chosen (empty: none)."""
    return {**state.array_choice, "chosen_arrays": list(state.chosen_arrays)}


def words(choice: dict[str, Any], verb: str = "compares") -> str:
    """``compares trunk.rnn.weight_ih_l0 (chosen by evidence in rounds 1 and 2: best-cut
    silhouette s against r needed, every array together no structure (w); next
    trunk.rnn.weight_hh_l0 s2 against r2, …)``; ``verb``: what the strategy does with the array
    (CFL and LayerCFL compare it)."""
    scores = {s["layer"]: s for s in choice["scores"]}
    chosen = scores[choice["chosen"]]
    own = choice.get("own") or {}
    blind = {EVERY: "every array together", **({own["candidate"]: own["name"]} if own else {})}
    # the runners-up by their margin over their own bar, the measure the leader was picked by
    others = sorted((s for s in scores.values() if s["layer"] not in {chosen["layer"], *blind} and s.get("taken") is not False
                     and s["silhouette"] is not None), key=lambda s: s["required"] - s["silhouette"])[:3]
    nexts = "; next " + ", ".join(f"{s['layer']} {s['silhouette']:.2f} against {s['required']:.2f}"
                                  for s in others) if others else ""
    none = ", ".join(f"{said} no structure ({'n/a' if scores[key]['silhouette'] is None else format(scores[key]['silhouette'], '.2f')})"
                     for key, said in reversed(blind.items()))
    failed = [key for key, s in scores.items() if s.get("taken") is False and record_margin(s) > record_margin(chosen)]
    among = (f", among the arrays whose cut beats group-free rotations ({', '.join(failed)} separated more, but "
             f"{'its cut does' if len(failed) == 1 else 'their cuts do'} not)") if failed and chosen.get("taken") else ""
    return (f"{verb} {chosen['layer']} (chosen by evidence in rounds {choice['previous_round']} and "
            f"{choice['round']}: best-cut silhouette {chosen['silhouette']:.2f} against {chosen['required']:.2f} "
            f"needed{among}{finer_than(chosen, list(scores.values()))}, {none}{nexts})")
