"""What the bi-partitioning strategies (CFL, LayerCFL, HiCFL) say about their final number of
clusters, without true groups, read from their ``State`` and ``Params``: ``one_cluster_reason``
(why a run ended as FedAvg, with the numbers behind it: the closest refused split against its
threshold, or the timing rule against its own), ``one_cluster_advice`` (what to try) and
``cluster_count_basis`` (the splits accepted with their scores against the thresholds, the
merges made and the closest pair of leaves a merge refused). The CFL-family functions take the
family's refusals from ``state.refused`` (CFL, LayerCFL) or ``state.no_split`` (HiCFL)."""

from __future__ import annotations

import math

from collections import Counter
from typing import Any

import numpy as np

from clusterfed.clustering.split_rules import one_cluster_reason as reason_of, refusal_counts
from clusterfed.explain.numbers import OPERATORS, compared

FLIPPED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}

SHOWN_SPLITS = 2  # the splits a basis names: those closest to their threshold

# reason code (the strategies' ``one_cluster_reasons``) -> the setting most likely to change it
ONE_CLUSTER_ADVICE = {
    "criteria": "more rounds, split-criteria = relative (rel-eps1, rel-eps2: the criteria scaled to the updates), "
                "or FedClust, which clusters once from the first round",
    "stability": "more rounds, a larger hicfl.stability-eps-rel, or FedClust",
    "window": "more rounds or a smaller hicfl.window",
    "silhouette": "a lower split-min-silhouette if the groups are real but close, or compare-arrays naming the "
                  "layers that differ between groups",
    "check": "correct-clustering-check = false (the check recorded, not enforced)",
    "size": "a smaller min-split-size or min-split-round, or more clients per round (fraction-train)",
    "agree": "compare-arrays naming the layers that differ between groups, or FedClust",
    "one_side": "a smaller hicfl.min-side",
    "reference": "more clients per round (fraction-train) or a smaller min-split-size",
    "deferred": "more rounds if the groups are real but their partition still moves, or a lower split-agreement",
    "single": "nothing if the lone client shares its cluster's task; a group of one client is not told apart on "
              "evidence",
    "group_free": "nothing if the clients share one task; more clients per round (fraction-train) if the groups "
                  "are real but small",
    "alike": "nothing if the clients share one task; if the groups are real but their updates still share one "
             "direction, more rounds (the shared direction fades as the model fits it)",
}

# HiCFL: why a ready cluster did not split (the ``reason`` of its ``no_split`` entries)
NO_SPLIT_TEXT = {"agree": "updates agree (not heterogeneous)",
                 "one_side": "a side with fewer than hicfl-min-side members, or everyone on the reference's side",
                 "silhouette": "no ready layer's split passed the structure test",
                 "reference": "a split leaving a side of fewer than min-split-size members scored no better than "
                              "group-free rotations of the members' updates",
                 "deferred": "successive rounds' partitions of the members disagreed (split-agreement)",
                 "alike": "the partition reproduced but its parts' mean updates point alike (merge-min-cosine)",
                 "group_free": "the split did not beat group-free rotations of the members' updates"}


def versus(a: float, op: str, b: float, between: str = "", digits: int = 3, setting: bool = False) -> str:
    """``a op b`` as the sentence has always printed it (``a`` with ``digits`` decimals, ``b`` too,
    or as configured for a ``setting``) where that reads true; else printed true by
    ``numbers.compared``. Where the recorded values do not satisfy ``op`` the operator that holds
    is said."""
    configured = str(b)
    a, b = float(a), float(b)
    if not OPERATORS[op](a, b):
        op = FLIPPED[op]
    left, right = f"{a:.{digits}f}", (configured if setting else f"{b:.{digits}f}")
    if OPERATORS[op](float(left), float(right)):
        return f"{left} {op} {between + ' ' if between else ''}{right}"
    return compared(a, op, b, digits, between=between)


def is_hicfl(state: Any) -> bool:
    return hasattr(state, "no_split")


def timing_code(state: Any) -> str:
    """The reason code when the timing rule never held."""
    return "stability" if is_hicfl(state) else "criteria"


def refusal_codes(state: Any) -> list[str]:
    """The reason code of every refused split attempt (``one_cluster_reasons``)."""
    if is_hicfl(state):
        return [n["code"] for n in state.no_split]
    return [r["reason"] for r in state.refused]


# ------------------------------------------------------------ the numbers behind a reason
def criteria_numbers(state: Any, params: Any) -> str | None:
    """The split criteria of the last cluster judged against their thresholds."""
    last = state.last_criteria
    if not last:
        return None
    c = params
    if last["mode"] == "absolute":
        return (f"round {last['round']}: mean-update norm {last['mean_norm']:.3g} vs eps1 {c.eps1}, "
                f"max norm {last['max_norm']:.3g} vs eps2 {c.eps2}")
    return (f"round {last['round']}: mean-update norm {last['mean_norm']:.3g} vs rel-eps1 × peak "
            f"{c.rel_eps1 * last['reference_mean_norm']:.3g}, max norm {last['max_norm']:.3g} vs rel-eps2 × mean "
            f"{c.rel_eps2 * last['mean_norm']:.3g}")


def stability_numbers(state: Any, params: Any) -> str | None:
    """HiCFL: the layer whose stability came nearest ε in the last judged round."""
    t = state.last_timing
    if not t:
        return None
    unit = "" if state.epsilon is not None else " (relative to the layer's scale)"
    sign = ">=" if t["value"] >= t["eps"] else "<"  # the last judged round may have fired (then a split)
    return (f"round {t['round']}: nearest layer {t['layer']}, {params.timing} member's stability "
            f"{versus(t['value'], sign, t['eps'], 'ε')}{unit}")


def timing_numbers(state: Any, params: Any) -> str | None:
    """The timing rule's numbers in its last round against its thresholds."""
    return stability_numbers(state, params) if is_hicfl(state) else criteria_numbers(state, params)


def cfl_refusal_numbers(state: Any, params: Any) -> str | None:
    """The refusal closest to passing, of the most frequent reason: the best-cut silhouette
    against the one required, or (LayerCFL's check) γ_max against its bound."""
    codes = refusal_codes(state)
    if not codes:
        return None
    top = max(set(codes), key=codes.count)
    # one training's refusals; a refusal on longer evidence is said by ``chain_words``
    once = [r for r in state.refused if not r.get("trainings")]
    refused = once if any(r["reason"] == top for r in once) else state.refused
    if top == "check":
        r = min((r for r in refused if r["reason"] == "check"),
                key=lambda r: r["check"]["gamma_max"] - r["check"]["bound"])
        return (f"closest refusal: round {r['round']}, cluster {r['cluster']}: estimated γ_max "
                f"{versus(r['check']['gamma_max'], '>=', r['check']['bound'], 'bound')}")
    if top == "alike":
        return closest_alike([r for r in refused if r["reason"] == "alike"])
    if top == "single":
        r = [r for r in refused if r["reason"] == "single"][-1]
        alone = next((side[0] for side in r.get("members") or [] if len(side) == 1), None)
        return f"last refusal: round {r['round']}, cluster {r['cluster']}" + (f": client {alone} alone" if alone else "")
    if top == "group_free":
        entries = [r for r in refused if r["reason"] == top]
        if tested := closest_group_test(entries):
            return (f"closest refusal by the group test: round {tested['round']}, cluster {tested['cluster']}: "
                    f"{tested['group_words']}")
        r = max(entries, key=lambda r: r["best_cut_silhouette"] - r["required_silhouette"])
        return (f"closest refusal: round {r['round']}, cluster {r['cluster']}: best-cut silhouette "
                f"{versus(r['best_cut_silhouette'], '<=', r['required_silhouette'], 'group-free rotations')}")
    if top == "deferred":
        r = max((r for r in refused if r["reason"] == "deferred"), key=lambda r: r.get("agreement") or -2.0)
        silhouette = r.get("best_cut_silhouette")
        return (f"closest deferral: round {r['round']}, cluster {r['cluster']}: {deferral_evidence(r, params)}"
                + (f" (best-cut silhouette {silhouette:.3f})" if silhouette is not None else ""))
    r = max((r for r in refused if r["reason"] == top),
            key=lambda r: r["best_cut_silhouette"] - r["required_silhouette"])
    basis = (f"group-free reference {r['reference_silhouette']:.3f}" if r.get("reference_silhouette") is not None
             else f"split-min-silhouette {params.split_min_silhouette}")
    size = len(r["members"][0]) + len(r["members"][1])
    who = "clients compared" if params.similarity_pool == "members" else "repliers"
    return (f"closest refusal: round {r['round']}, cluster {r['cluster']} ({size} {who}): "
            f"best-cut silhouette {versus(r['best_cut_silhouette'], '<', r['required_silhouette'], 'required')} "
            f"({basis})")


def hicfl_refusal_numbers(state: Any, params: Any) -> str | None:
    """The refusal of the most frequent reason closest to passing, with its numbers."""
    codes = refusal_codes(state)
    if not codes:
        return None
    top = max(set(codes), key=codes.count)
    entries = [n for n in state.no_split if n["code"] == top]
    if top == "silhouette":
        n = max(entries, key=lambda n: max(n["silhouettes"].values()))
        return (f"closest refusal: round {n['round']}, cluster {n['cluster']}: best layer silhouette "
                f"{versus(max(n['silhouettes'].values()), '<', params.min_silhouette, 'min-silhouette', setting=True)}")
    if top == "alike":
        return closest_alike(entries)
    if top == "deferred":
        n = max(entries, key=lambda n: n.get("agreement") if n.get("agreement") is not None else -2.0)
        return f"closest deferral: round {n['round']}, cluster {n['cluster']}: {deferral_evidence(n, params)}"
    if top == "group_free" and (tested := closest_group_test(entries)):
        return (f"closest refusal by the group test: round {tested['round']}, cluster {tested['cluster']}, "
                f"{tested['layer']}: {tested['group_words']}")
    if top in ("reference", "group_free"):
        n = max(entries, key=lambda n: max(n["silhouettes"].values()) - n["reference_silhouette"])
        return (f"closest refusal: round {n['round']}, cluster {n['cluster']}: silhouette "
                f"{versus(max(n['silhouettes'].values()), '<=', n['reference_silhouette'], 'group-free rotations')}")
    n = entries[-1]
    return f"last refusal: round {n['round']}, cluster {n['cluster']}, layer {n['layer']}"


def closest_group_test(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Of the refusals the group test decided (``layer_split.EvidenceTest``; refusals of fewer
    members, by silhouette, are not on its scale), the one whose parts came nearest the
    rotations' separation; None when it decided none."""
    def nearness(entry: dict[str, Any]) -> float:
        own, rotated = entry["group_test"]["separation"], entry["group_test"]["rotated_separation"]
        if math.isinf(own) or math.isinf(rotated) or rotated <= 0:
            return 1.0 if own == rotated else (math.inf if own > rotated else 0.0)
        return own / rotated

    return max((e for e in entries if e.get("group_test")), key=nearness, default=None)


def closest_alike(entries: list[dict[str, Any]]) -> str:
    """A reproduced partition refused because its parts point alike: the one whose parts came
    nearest pointing apart, as its round line said it."""
    def cosine(entry: dict[str, Any]) -> float:
        return max((c for c in entry.get("alike") or [] if c is not None), default=1.0)

    e = min(entries, key=cosine)
    said = e.get("evidence") or ("its parts' mean updates point alike (cosine "
                                 f"{max(c for c in e['alike'] if c is not None):.2f})" if e.get("alike") else "")
    return f"closest refusal: round {e['round']}, cluster {e['cluster']}" + (f": {said}" if said else "")


def deferral_evidence(entry: dict[str, Any], params: Any) -> str:
    """A deferred split's evidence as recorded (``Reproduction.words``), or, without it, its
    agreement against split-agreement."""
    if entry.get("evidence"):
        return entry["evidence"]
    agreement = entry.get("agreement")
    if agreement is None:
        return "no two rounds' partitions compared"
    return f"successive rounds disagree (ARI {versus(agreement, '<', params.split_agreement, digits=2)})"


def refusal_numbers(state: Any, params: Any) -> str | None:
    """The closest refused split against its threshold."""
    return hicfl_refusal_numbers(state, params) if is_hicfl(state) else cfl_refusal_numbers(state, params)


def split_score(state: Any, params: Any, split: dict[str, Any]) -> tuple[str, float, float] | None:
    """A split's structure score's name, the score and what it had to reach."""
    if is_hicfl(state):
        score = (split.get("silhouettes") or {}).get(split.get("layer"))
        return None if score is None else (f"{split['layer']} silhouette", score, params.min_silhouette)
    if split.get("best_cut_silhouette") is None or split.get("required_silhouette") is None:
        return None
    return "best-cut silhouette", split["best_cut_silhouette"], split["required_silhouette"]


# ------------------------------------------------------------ what the driver asks
def one_cluster_reason(state: Any, params: Any, reasons: dict[str, str]) -> str | None:
    """Why the run ended with one cluster, with the numbers behind it (None when it has more)."""
    if len(set(state.assignment.values())) > 1:
        return None
    codes = refusal_codes(state)
    reason = reason_of(reasons, codes, state.split_allowed, len(state.splits), timing=timing_code(state))
    if is_hicfl(state) and state.split_allowed and not state.splits and not state.no_split \
            and not state.windows_filled:
        return f"{reasons['window']}; window {params.window}"
    if state.splits and state.merges:  # merged back: name the last merge's evidence and thresholds
        return reason + "; " + merge_evidence(params, state.merges[-1])
    if not state.split_allowed:
        numbers = (f"min-split-size {params.min_split_size}, min-split-round {params.min_split_round}, "
                   f"{len(state.assignment)} clients")
    else:
        numbers = refusal_numbers(state, params) if codes else timing_numbers(state, params)
    longer = chain_words(state)
    numbers = "; ".join(t for t in (numbers, longer) if t)
    return f"{reason}; {numbers}" if numbers else reason


def chain_words(state: Any) -> str | None:
    """The last split judged again on longer evidence (``evidence-trainings``) and why it was
    refused, for the one-cluster reason (None: no chain was asked)."""
    chained = [r for r in getattr(state, "refused", []) if r.get("trainings")]
    if not chained:
        return None
    r = chained[-1]
    code = r["reason"]
    if code in ("deferred", "alike"):
        why = r.get("evidence") or code
    elif code == "silhouette":
        why = f"best-cut silhouette {versus(r['best_cut_silhouette'], '<', r['required_silhouette'], 'required')}"
    elif code in ("group_free", "reference"):
        level = r.get("rotation_silhouette") or r["required_silhouette"]
        why = r.get("group_words") or (f"best-cut silhouette "
                                       f"{versus(r['best_cut_silhouette'], '<=', level, 'group-free rotations')}")
    elif code == "single":
        why = "its cut left one client alone"
    else:
        why = "the correct-clustering check failed"
    return f"judged again on {r['trainings']} trainings in a row (round {r['round']}, cluster {r['cluster']}): {why}"


def one_cluster_advice(state: Any, params: Any = None) -> str | None:
    """What to try, by the reason the splits never happened (``ONE_CLUSTER_ADVICE``), never a
    value already in force (``params``: the run's settings)."""
    codes = refusal_codes(state)
    code = (Counter(codes).most_common(1)[0][0] if codes
            else ("size" if not state.split_allowed else timing_code(state)))
    advice = ONE_CLUSTER_ADVICE.get(code)
    if advice is None or params is None:
        return advice
    if code == "criteria":
        options = ["more rounds"]
        if getattr(params, "split_criteria", None) != "relative":
            options.append("split-criteria = relative (rel-eps1, rel-eps2: the criteria scaled to the updates)")
        if getattr(params, "split_timing", None) == "criteria":
            options.append("split-timing = evidence (split when two successive rounds agree)")
        options.append("or FedClust, which clusters once from the first round")
        return ", ".join(options)
    if code == "stability" and getattr(params, "split_timing", None) == "criteria":
        return advice + ", or split-timing = evidence"
    if code == "check" and not getattr(params, "correct_clustering_check", True):
        return None
    return advice


def unplaced_words(split: dict[str, Any]) -> str:
    """What a split's line adds for the members it left unplaced (``place_absent``): empty for none."""
    unplaced = split.get("unplaced", [])
    return f"; {len(unplaced)} absent with no update to place them by, unplaced until sampled" if unplaced else ""


def merge_evidence(params: Any, merge: dict[str, Any]) -> str:
    """One merge's numbers against the thresholds that allowed it, for the reason."""
    c = params
    parts = [f"round cosine {versus(merge['cosine'], '>=', c.merge_min_cosine, 'merge-min-cosine', setting=True)}"]
    if merge.get("drift_cosine") is not None:
        parts.append(f"drift cosine {versus(merge['drift_cosine'], '>=', c.merge_min_cosine, setting=True)}")
    if merge.get("silhouette") is not None:
        silhouette = versus(merge["silhouette"], "<=", c.merge_max_silhouette, "merge-max-silhouette", setting=True)
        parts.append(f"silhouette {silhouette}")
    return f"last merge (round {merge['round']}, clusters {merge['merged'][0]} and {merge['merged'][1]}): " \
           + ", ".join(parts) + " (merge = false keeps the splits)"


def merge_refusal(state: Any, params: Any) -> str:
    """Why no further pair of leaves merged: ``merge = false``, or the closest pair of the last
    round (by the cosine of the mean updates) and the test it failed."""
    c = params
    if not c.merge:
        return "merge = false"
    pair = state.merge_refused
    if not pair:
        return "no two leaves replied in one round to compare"
    where = f"the closest pair of leaves (round {pair['round']}, clusters {pair['clusters'][0]} and {pair['clusters'][1]})"
    kept = next((m for m in reversed(getattr(state, "merge_kept", [])) if m["round"] == pair["round"]
                 and sorted(m["leaves"]) == sorted(pair["clusters"])), None)
    if kept is not None and kept.get("waiting"):
        return f"{where} passed the merge rule in that round only (a merge waits for a second round alike)"
    if kept is not None:
        agreement = versus(kept["agreement"], ">=", c.split_agreement, "split-agreement", digits=2, setting=True)
        how = f" on their best cut, and {kept['group_words']}" if "group_words" in kept else ""
        return f"{where} passed the merge rule but their split still reproduces (ARI {agreement}{how})"
    if pair["cosine"] < c.merge_min_cosine:
        cosine = versus(pair["cosine"], "<", c.merge_min_cosine, "merge-min-cosine", setting=True)
        return f"{where} had round cosine {cosine}"
    if pair.get("silhouette") is not None and pair["silhouette"] > c.merge_max_silhouette:
        return (f"{where} had silhouette "
                f"{versus(pair['silhouette'], '>', c.merge_max_silhouette, 'merge-max-silhouette', setting=True)}")
    drift = pair.get("drift_cosine")
    if drift is None:
        return where
    return f"{where} had drift cosine {versus(drift, '<', c.merge_min_cosine, setting=True)}"


def split_refusal(state: Any, params: Any) -> str:
    """Why the clusters split no further: the refused attempts by reason with the closest
    refusal's numbers, or, with none refused, the timing rule's last numbers."""
    codes = refusal_codes(state)
    if codes:
        numbers = refusal_numbers(state, params)
        return f"{len(codes)} split attempts refused: {refusal_counts(codes)}" + (f"; {numbers}" if numbers else "")
    numbers = timing_numbers(state, params)
    return f"no split attempt refused; the timing rule's last {numbers}" if numbers else "no split attempt refused"


def cluster_count_basis(state: Any, params: Any) -> str | None:
    """The evidence for the final number of clusters (None with one cluster: see the reason)."""
    leaves = len(set(state.assignment.values()))
    if leaves <= 1:
        return None
    scored = [(s, score) for s in state.splits if (score := split_score(state, params, s)) is not None]
    closest = sorted(scored, key=lambda item: item[1][1] - item[1][2])[:SHOWN_SPLITS]
    shown = "; ".join(f"round {s['round']}, cluster {s['parent']}: {name} {value:.3f} vs {threshold:.3f}"
                      for s, (name, value, threshold) in closest)
    splits = f"{len(state.splits)} splits accepted" + (f" (closest to their threshold: {shown})" if shown else "")
    alone = sorted((c, keys[0]) for c, keys in members_of(state).items() if len(keys) == 1)
    single = ("; " + ", ".join(f"cluster {c} is a single client ({key})" for c, key in alone)) if alone else ""
    return (f"{splits}, {len(state.merges)} merges{single}; no further merge: {merge_refusal(state, params)}; "
            f"no further split: {split_refusal(state, params)}")


def members_of(state: Any) -> dict[int, list[str]]:
    """cluster -> its members (``state.assignment``)."""
    out: dict[int, list[str]] = {}
    for key, cluster in state.assignment.items():
        out.setdefault(cluster, []).append(key)
    return out



def stability_record(state: Any, placed: list[str]) -> dict[str, Any]:
    """The round's stability diagnostics: ε, the ``placed`` clients' windowed stability per
    layer and the share of each layer's weights the ξ-selection keeps."""
    tracker = state.tracker
    diagnostics: dict[str, Any] = {"stability_eps": state.epsilon}
    if state.epsilon is None:
        diagnostics["stability_eps_rel"] = state.eps_rel
        diagnostics["stability_scales"] = {str(c): dict(v) for c, v in state.scales.items()}
    diagnostics["stability"] = {k: {layer: tracker.windowed(k, layer) for layer in state.layers} for k in placed}
    kept_by_layer, kept_total, size_total = {}, 0.0, 0
    for layer in state.layers:
        fractions = [f for k in placed if (f := tracker.kept_fraction(k, layer)) is not None]
        kept_by_layer[layer] = float(np.mean(fractions)) if fractions else None
        if fractions:
            kept_total += float(np.sum(fractions)) * state.layer_sizes[layer]
            size_total += len(fractions) * state.layer_sizes[layer]
    diagnostics["weights_kept"] = kept_by_layer
    diagnostics["weights_kept_total"] = kept_total / size_total if size_total else None
    return diagnostics


# what a CFL-family strategy says of its final cluster count, bound as its methods
# (``one_cluster_reason = explain.strategy_reason``): the functions above on its State and Params
def strategy_reason(strategy: Any, clients: Any = None) -> str | None:
    return one_cluster_reason(strategy.state, strategy.params, strategy.one_cluster_reasons)


def strategy_advice(strategy: Any) -> str | None:
    return one_cluster_advice(strategy.state, strategy.params)


def strategy_basis(strategy: Any) -> str | None:
    return cluster_count_basis(strategy.state, strategy.params)


def shown_names(names: list[str], most: int = 4) -> str:
    """``a, b, c, d and 3 more``."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def timing_words(params: Any) -> str:
    """How a split is timed, in words, for round 1's line."""
    if params.split_timing == "evidence":
        return (f"a split is taken when two successive rounds give the same partition "
                f"(ARI >= {params.split_agreement:.2f}), from round {params.min_split_round}")
    return f"a split is timed by the paper's rule, from round {params.min_split_round}"
