"""The one-shot clustering round's upload kept at most the paper layer's bytes (FedClust,
AdaCFL with ``cluster-layers = auto``): the glue between the strategies' state and
``clustering/evidence_sketch.py`` (the projection) and ``protocol.py`` (how an ask says it).

- ``start_plan`` (with the layer choice, before the clustering round): the budget is the bytes of
  the arrays the strategy's paper compares (its ``paper_rule``); when the candidate layers
  uploaded for the choice exceed it, each array's update is projected (the plan, kept in
  the state so that newcomers' rows line up with the clustering round's).
- ``ask_config``: what a clustering (or newcomer) ask adds: the projected arrays and the seed.
  clusterfed's client projects its reply itself; a stock ClientApp does with
  ``clusterfed.client.evidence_mod`` (one line: ``ClientApp(mods=[evidence_mod])``); without
  it a stock app sends its whole model, which the server projects on arrival: the same rows,
  but those bytes are not saved (``words`` says so in the round line).
- ``rows_input``: the replies' updates in the plan's space, and that space's origin, for the
  rows builder (``oneshot.rows``), which subtracts a start model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from clusterfed.clustering.evidence_sketch import plan, plan_bytes, updates_in_space
from clusterfed.models.layers import select_layers
from clusterfed.protocol import evidence_config

AUTO = "auto"


def paper_bytes(theta0: Mapping[str, np.ndarray], paper_rule: str, compare_arrays: Any,
                fallback: Sequence[str]) -> int:
    """Bytes of the arrays the paper's rule compares (``fallback``'s, the smallest candidate
    layer, when the rule selects nothing on this model)."""
    try:
        keys = select_layers(theta0, paper_rule, compare_arrays)
    except ValueError:
        keys = []
    return int(sum(np.asarray(theta0[k]).nbytes for k in (keys or fallback)))


def start_plan(theta0: Mapping[str, np.ndarray], choice: Any, paper_rule: str, compare_arrays: Any, *,
               enabled: bool, seed: int) -> dict[str, Any]:
    """The projection of the clustering round's upload (``{}``: none), for ``choice`` (a
    ``LayerChoice`` just started) under ``cluster-layers = auto``."""
    if not enabled or choice.rule != AUTO or not choice.keys:
        return {}
    layers = dict(choice.candidates) if choice.candidates else {"": list(choice.keys)}
    smallest = min(layers.values(), key=lambda keys: sum(np.asarray(theta0[k]).nbytes for k in keys))
    budget = paper_bytes(theta0, paper_rule, compare_arrays, smallest)
    shapes = {k: (np.shape(theta0[k]), np.asarray(theta0[k]).dtype) for keys in layers.values() for k in keys}
    return plan(shapes, layers, budget, seed)


def ask_config(evidence_plan: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The evidence ask's config keys for the uploaded ``keys`` (``{}`` without a plan)."""
    if not evidence_plan:
        return {}
    sizes = evidence_plan["sizes"]
    return evidence_config({k: sizes[k] for k in keys if k in sizes}, evidence_plan["seed"])


def rows_input(replies: Sequence[Any], start: Mapping[str, np.ndarray], keys: Sequence[str],
               evidence_plan: Mapping[str, Any]) -> tuple[list[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]:
    """(each reply's arrays, the start they are compared from): as they are without a plan;
    with one, the updates of ``keys`` in its space and the zeros of that space (a stock
    client's whole model is projected here)."""
    if not evidence_plan:
        return [reply.arrays for reply in replies], start
    names = [k for k in keys if k in evidence_plan["sizes"]]
    # a whole reply is compared from ``start``, not from the model it was sent: a stock client's
    # chained request was sent its own previous reply, and its row is what the whole chain changed
    updates = [reply.update if reply.is_update else
               {n: np.asarray(reply.arrays[n], np.float64) - np.asarray(start[n], np.float64) for n in names}
               for reply in replies]
    return updates_in_space(updates, start, names, evidence_plan)


def spans_in_space(later: Sequence[Mapping[str, np.ndarray]], earlier: Sequence[Mapping[str, np.ndarray]],
                   keys: Sequence[str], evidence_plan: Mapping[str, Any]) -> tuple[list[dict[str, np.ndarray]],
                                                                             dict[str, np.ndarray]]:
    """What each client's arrays changed from ``earlier`` to ``later`` (a span of a stock
    client's chained requests, whole arrays on the server) on ``keys``, in the plan's space
    (each span projected and encoded as a client would send it), and that space's origin:
    a chain's halves are then the same evidence as the clustering round's rows."""
    names = [k for k in keys if k in evidence_plan["sizes"]]
    spans = [{n: np.asarray(b[n], np.float64) - np.asarray(a[n], np.float64) for n in names}
             for b, a in zip(later, earlier)]
    return updates_in_space(spans, {n: np.zeros(np.asarray(earlier[0][n]).shape) for n in names} if earlier else {},
                            names, evidence_plan)


def projected_on_server(replies: Sequence[Any], evidence_plan: Mapping[str, Any]) -> list[str]:
    """Keys of the replies that came whole (a stock ClientApp without the evidence mod)."""
    if not evidence_plan:
        return []
    return [reply.key for reply in replies if not reply.is_update]


def words(evidence_plan: Mapping[str, Any], keys: Sequence[str], whole: Sequence[str]) -> str:
    """The round line's sentence on the upload: numbers per client, the budget, and which
    clients sent their whole model (projected on the server: no bytes saved)."""
    if not evidence_plan:
        return ""
    sent = plan_bytes(evidence_plan, keys)
    numbers = sum(min(evidence_plan["sizes"][k], evidence_plan["dims"][k]) for k in keys if k in evidence_plan["sizes"])
    text = (f"each candidate layer's update projected (seeded CountSketch, {numbers:,} 4-bit numbers, {sent:,} B per "
            f"client; paper layer {evidence_plan['budget_bytes']:,} B)")
    if whole:
        shown = ", ".join(list(whole)[:3]) + (" …" if len(whole) > 3 else "")
        text += (f"; {len(whole)} stock client(s) sent their whole model, projected on the server, no bytes saved "
                 f"({shown}: add clusterfed.client.evidence_mod to their ClientApp's mods)")
    return text
