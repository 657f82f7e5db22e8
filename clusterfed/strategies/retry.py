"""``retry-after``: a one-shot clustering step that left one cluster, run once more later on that
cluster's trained model (an extension of FedClust and AdaCFL; their papers cluster once).

Why: one training from a model at its start may not yet tell the groups apart, where the updates
of a model trained for a few rounds do (the group-signal records of the random-model benchmark
show the true groups' silhouette growing over the first rounds); the revisits (``revisit.py``)
watch every round too, but at partial participation they see only each round's sample.

``due``: the step left one cluster, still the only one, ``retry-after`` rounds ago, and has not
been retried. ``run``: every active client trains the one cluster's current model and uploads
the compared layer, chosen afresh (``oneshot.start``); the strategy's own gated cut decides, as
in its first step. Clusters found start from that model; a client of the one cluster that did
not reply leaves it and is placed later by the newcomer rule. When the step finds no clusters,
the first step's layer choice, references and record stay (``RESTORES``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import Field

from clusterfed.core.exchange import Round, Steps
from clusterfed.explain import oneshot as explain
from clusterfed.strategies import oneshot, revisit
from clusterfed.strategies.oneshot import OneShotParams, OneShotState

# what ``oneshot.start`` resets, and a retried step that finds no clusters puts back
RESTORES = ("layer_choice", "evidence_plan", "references", "cluster_start", "clustering_state")

# (rows, the chain's halves, the rows' client keys) -> (labels, the cut's info, what the gate said, deferred)
GatedCut = Callable[[np.ndarray, Any, list[str]], tuple[np.ndarray, dict[str, Any], str | None, bool]]


def after_field(default: int, why: str = "", never: str = "the paper's single clustering round") -> Any:
    """The ``retry-after`` parameter of a strategy whose step may run again: its ``default``,
    ``why`` a later look may find groups (a parenthesis, or ""), and what 0 keeps (``never``)."""
    return Field(default, alias="retry-after", ge=0,
                 description="a clustering step that left one cluster is run once more this many rounds later, every "
                             f"active client training the one cluster's model then{why}, cut and tested as the first; "
                             f"unless the revisits split the cluster before (0 = never, {never})")


def due(state: OneShotState, params: OneShotParams, server_round: int) -> bool:
    """Whether ``server_round`` runs the clustering step again: it left one cluster, still the
    only one, ``retry-after`` rounds ago (0: never), and has not been retried."""
    after = params.retry_after
    return (after > 0 and state.clustered and state.retry is None and len(state.models) == 1
            and server_round >= state.clustering_state.get("clustering_round", server_round) + after)


def run(strategy: Any, rnd: Round, paper_rule: str, gated_cut: GatedCut) -> Steps:
    """The clustering step once more (``due`` decides when): ``strategy``'s active clients train
    its one cluster's model (``strategy.collect``) and upload the compared layer, chosen afresh
    (``paper_rule``: the paper's layer rule); ``gated_cut`` is the strategy's own cut. Returns
    the round's diagnostics, its ``decision`` saying what the step found."""
    st, params = strategy.state, strategy.params
    (single,) = st.models
    current = st.models[single]
    first = {name: getattr(st, name) for name in RESTORES}
    oneshot.start(st, params, strategy.compared_names(), paper_rule, name=strategy.name, model=current)
    keys = rnd.reachable(list(rnd.active))
    replied, X, bytes_up, diagnostics, halves = yield from strategy.collect(rnd, keys, current)
    labels, info, said, deferred = (None, {}, None, True) if X is None else gated_cut(X, halves, replied)
    found = 1 if labels is None else len(np.unique(labels))
    st.retry = {"round": rnd.number, "clients": len(replied), "clusters": int(found),
                **({"deferred": said} if deferred and said else {})}
    words = explain.retry_said(type(strategy).__name__, rnd.number, len(replied), found, said, deferred, info)
    if found < 2:
        for name, value in first.items():
            setattr(st, name, value)
        st.clustered = True
        diagnostics["decision"] = words
        return diagnostics
    st.models.pop(single)
    revisit.forget(st, single)
    answered = set(replied)
    for key in [k for k, c in st.assignment.items() if c == single and k not in answered]:
        del st.assignment[key]  # its model is gone: placed later as a newcomer, against the new references
    clusters = {int(label): strategy.new_cluster(current) for label in np.unique(labels)}
    diagnostics.update(oneshot.form(st, params, rnd.number, replied, X, labels, clusters, current, bytes_up, info))
    st.clustering_state["retried_from"] = first["clustering_state"].get("clustering_round")
    diagnostics["decision"] = words
    return diagnostics
