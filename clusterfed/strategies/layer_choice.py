"""The layer a one-shot clustering compares (FedClust, AdaCFL), chosen from the clients'
own updates and said in plain words.

``cluster-layers = auto`` (beyond the papers): the clustering phase uploads every
candidate layer (each layer with a compared array of two or more dimensions, a recurrent
layer's input and hidden weights a layer each: ``models.layers.matrix_layers``; at most
``max-candidate-layers``, the first and the last half of them in state-dict order: a shift of
the inputs shows near the input, one of the labels near the head), the arrays no client changed
are left out (``parameters.silent_names``: a frozen backbone), and the layer whose clients'
updates show the most structure is compared (``clustering.layer_evidence``). Newcomers
then upload only that layer. The papers' rule (``final``) or any rule or layer names stay
selectable: they are compared as given, less the arrays no client changed.

``LayerChoice`` is plain data (checkpointed in the strategy's state); ``start_choice`` and
``choose`` are the steps; what the round line says of them is ``clusterfed/explain/oneshot.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from clusterfed.clustering import stack_partials
from clusterfed.clustering.layer_evidence import most_structured, score_layers, scored_rows
from clusterfed.models.layers import both_ends, matrix_layers, select_layers
from clusterfed.models.parameters import silent_names

EVIDENCE = "auto"
# the default of ``max-candidate-layers``: each candidate costs one cut with its group-free
# reference and is uploaded once in the clustering phase
MAX_CANDIDATE_LAYERS = 8


@dataclass
class LayerChoice:
    """Which arrays are compared, and why. ``candidates``: layer -> keys still to be scored
    (empty once chosen, or under a rule); ``keys``: what is uploaded and compared now."""

    rule: str = EVIDENCE
    keys: list[str] = field(default_factory=list)
    candidates: dict[str, list[str]] = field(default_factory=dict)
    chosen: str | None = None
    scores: list[dict[str, Any]] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)
    decided: bool = False  # the clustering phase's replies were seen: keys and silent arrays fixed

    @property
    def pending(self) -> bool:
        return bool(self.candidates)

    @property
    def chosen_among(self) -> int:
        """How many scored layers the compared one was chosen among (1 under a rule, or with
        one candidate): a test of its cut is one of that many (``oneshot.gate``'s ``tests``)."""
        return max(1, len(self.scores))

    @property
    def compared(self) -> list[str]:
        """The keys whose rows are compared: ``keys`` less the arrays no client changed (all
        of them when every one is silent)."""
        silent = set(self.silent)
        return [k for k in self.keys if k not in silent] or list(self.keys)

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "candidates"}


def start_choice(theta0: dict[str, np.ndarray], rule: str, compare: Any, compare_arrays: Any, paper_rule: str,
                 max_candidates: int = MAX_CANDIDATE_LAYERS) -> LayerChoice:
    """The choice before any reply: under ``auto`` the keys of every candidate layer (at most
    ``max_candidates``: the first and the last half, ``both_ends``) among ``compare`` (the compared arrays) are uploaded (a model
    with one candidate needs no scoring); under a rule, the arrays it selects among
    ``compare_arrays`` (``paper_rule``: the strategy's paper's, for a model with no
    candidate layer). ValueError when a rule selects nothing."""
    def rule_keys(rule: str) -> list[str]:
        return select_layers(theta0, rule, compare_arrays)

    if rule != EVIDENCE:
        return LayerChoice(rule=rule, keys=list(rule_keys(rule)))
    candidates = matrix_layers(theta0, compare)
    candidates = dict(both_ends(list(candidates.items()), max_candidates))
    if len(candidates) <= 1:
        keys = [k for keys in candidates.values() for k in keys] or list(rule_keys(paper_rule))
        return LayerChoice(rule=rule, keys=keys, chosen=next(iter(candidates), None))
    return LayerChoice(rule=rule, keys=[k for keys in candidates.values() for k in keys], candidates=candidates)


def choose(choice: LayerChoice, arrays: list[dict[str, np.ndarray]], start: dict[str, np.ndarray], *,
           metric: str, linkage: str, min_silhouette: float, reference_draws: int, seed: int,
           eligible: Callable[[list[str], np.ndarray, np.ndarray, int], bool] | None = None) -> np.ndarray:
    """Settle ``choice`` on the clustering phase's replies (``arrays``: each client's
    uploaded arrays, trained from ``start``) and return the rows to cluster: the compared
    keys' change from ``start``, arrays no client changed left out. The first call fixes
    the keys and the silent arrays in ``choice``; later calls (newcomers) only read them.
    ``eligible(names, rows, labels, tests)``: whether the strategy would take a layer's cut
    (its arrays ``names``, its ``rows``, the cut's ``labels``), at the error level of one test
    shared by ``tests`` layers. When given, the most structured layer is asked at the level of
    one test shared by every scored layer (it was picked among them, including those whose cut
    found no clusters); when its cut would not be
    taken, each other layer is asked at that level, and the choice is the
    most structured of those it would take, if any (``most_structured``); each answer is
    kept in ``choice.scores`` (``taken``)."""
    updates = [{k: np.asarray(a[k], np.float64) - np.asarray(start[k], np.float64) for k in choice.keys} for a in arrays]
    if not choice.decided:  # later rows (newcomers) must line up with the clustering phase's
        choice.silent = silent_names(updates, choice.keys, start)
        choice.decided = True
    silent = set(choice.silent)
    if choice.pending:
        rows = {layer: stack_partials([[u[k] for k in keys if k not in silent] for u in updates])
                for layer, keys in choice.candidates.items() if any(k not in silent for k in keys)}
        if len(rows) > 1:
            scores = score_layers(rows, metric=metric, linkage=linkage, min_silhouette=min_silhouette,
                                  reference_draws=reference_draws, seed=seed)
            scored = scored_rows(len(next(iter(rows.values()))), seed)  # the rows the labels are of
            testable = {s.layer: s for s in scores
                        if s.clusters > 1 and s.labels is not None and len(s.labels) == len(scored)}
            best = most_structured(scores)
            taken: dict[str, bool] = {}
            if eligible is not None and best.layer in testable:
                def answer(layer: str, tests: int) -> bool:
                    names = [k for k in choice.candidates[layer] if k not in silent]
                    return eligible(names, rows[layer][scored], np.asarray(testable[layer].labels), tests)

                # the best layer was picked as the most structured of all the scored ones (those whose
                # cut found no clusters too), and the others are asked after it: every layer shares one
                # test's chance of passing group-free updates (Bonferroni), so choosing among several
                # never makes a cut of one task's clients likelier; the clustering step's cut is asked
                # at the same level (``chosen_among``)
                taken[best.layer] = answer(best.layer, len(scores))
                if not taken[best.layer]:
                    taken.update({layer: answer(layer, len(scores)) for layer in testable if layer != best.layer})
                    best = most_structured(scores, passing={layer for layer, ok in taken.items() if ok})
            choice.scores = [{**s.record(), **({"taken": taken[s.layer]} if s.layer in taken else {})}
                             for s in scores]
            choice.chosen = best.layer
        elif rows:
            choice.chosen = next(iter(rows))
        if choice.chosen is not None:
            choice.keys = [k for k in choice.candidates[choice.chosen] if k not in silent]
        choice.candidates = {}
    return stack_partials([[u[k] for k in choice.compared] for u in updates])
