"""What the one-shot clusterings (FedClust, AdaCFL) say about their run: the compared
arrays and a cut that left one cluster (the clustering round's line), why a run ended with
one cluster and what to try, and the evidence for its number of clusters.

Functions of a strategy's ``state`` (``OneShotState`` fields: ``clustered``,
``clustering_state``, ``layer_choice``, ``assignment``, ``newcomer_log``, FedClust's
``recuts``) and ``params`` (``OneShotParams``); they decide nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clusterfed.clustering.layer_evidence import finer_than, record_margin
from clusterfed.explain.numbers import compared as against


# reason code -> sentence, for a run that ends with one cluster (the base's ``one_cluster_reasons``)
ONE_CLUSTER_REASONS = {
    "silhouette": "the best cut's silhouette stayed below auto-min-silhouette and below what group-free data "
                  "of the same size reaches: no cluster structure found",
    "threshold": "every client lies within lambda of the others: the cut at lambda leaves one cluster",
    "not_clustered": "the clustering step never ran (no client replied to it)",
}

EVIDENCE = "auto"  # cluster-layers chosen by evidence (``strategies/layer_choice.py``)


# ------------------------------------------------------------- the clustering round's line
def compared(choice: Any, strategy: str) -> str:
    """What the clustering round's line says about the compared arrays (a ``LayerChoice``)."""
    shown = ", ".join(choice.keys) if len(choice.keys) <= 3 else f"{choice.keys[0]} … ({len(choice.keys)} arrays)"
    text = f"{strategy} compared {shown}"
    if choice.scores:
        others = ", ".join(f"{s['layer']} {_score(s['silhouette'])}" for s in choice.scores if s["layer"] != choice.chosen)
        best = next(s for s in choice.scores if s["layer"] == choice.chosen)
        text += (f" (chosen by evidence: best-cut silhouette {_score(best['silhouette'])} against "
                 f"{best['required']:.2f} needed{finer_than(best, choice.scores)}{_passed_over(best, choice.scores)}; "
                 f"other layers {others})")
    elif choice.rule != EVIDENCE:
        text += f" (cluster-layers = {choice.rule})"
    if choice.silent:
        names = ", ".join(choice.silent[:4]) + (f" and {len(choice.silent) - 4} more" if len(choice.silent) > 4 else "")
        text += f"; left out, no client changed them: {names}"
    return text


def _passed_over(chosen: dict, records: list[dict]) -> str:
    """Words for the layers that cleared their bar by more than the chosen one but whose cut
    the strategy would not take (``taken`` false: its halves disagreed, or it failed the
    gate's group tests); empty when none."""
    if not chosen.get("taken"):
        return ""
    over = [r["layer"] for r in records if r.get("taken") is False and record_margin(r) > record_margin(chosen)]
    if not over:
        return ""
    return (f", among the layers whose cut the clustering step would take "
            f"({', '.join(over)} separated more, but {'its' if len(over) == 1 else 'their'} cut would be deferred)")


def no_structure_advice(choice: Any, strategy: str, silhouette: float | None, required: float | None,
                        paper_rule: str) -> str:
    """The one-cluster sentence of the clustering round: on which arrays, the score against
    the bar, and the setting most likely to change it."""
    layer = choice.chosen or (choice.keys[0].rsplit(".", 1)[0] if choice.keys else "?")
    shown, bar_shown = _against(silhouette, required)
    bar = "" if required is None else f" < {bar_shown}"
    if choice.scores:  # every candidate was scored and none showed groups
        hint = "the clients may share one task; if they should not, try HiCFL or CFL (they compare every round)"
    else:
        other = next(r for r in (paper_rule, "all") if r != choice.rule)
        hint = f"try cluster_layers={EVIDENCE!r} (each layer scored) or {other!r}, or HiCFL"
    return f"{strategy}: one cluster, no structure on {layer} (best silhouette {shown}{bar}); {hint}"


def cut_decision(decision: str | None, state: Any, params: Any, info: dict[str, Any], strategy: str,
                 paper_rule: str) -> str:
    """The clustering round's ``decision`` after a cut that left one cluster: ``decision``
    (the compared arrays, when said) and which arrays, the score against the bar, the
    setting most likely to change it."""
    required = info.get("auto_required_silhouette", params.auto_min_silhouette if params.lambda_ == "auto" else None)
    said = no_structure_advice(state.layer_choice, strategy, info.get("auto_best_silhouette"), required, paper_rule)
    return "; ".join(text for text in (decision, said) if text)


def shared_level(tests: int, draws: int) -> str:
    """What a group test sharing its level with ``tests`` tests beat, ``draws`` rotations, in
    words (empty for one test, or no rotations): ``(at the level of the largest of 79
    rotations: the layer compared was chosen among 4)`` (``group_test`` reads that level
    from more draws up to ``RANKED_MAX_ROWS`` rows)."""
    if tests <= 1 or draws <= 0:
        return ""
    return f" (at the level of the largest of {draws} rotations: the layer compared was chosen among {tests})"


def disagreement(reproduction: Any, bound: float) -> str:
    """Why two independent cuts (a ``Reproduction``) do not back a cut: they disagree, or
    they agree that there is one cluster."""
    if reproduction.agreement < bound:
        return reproduction.words(bound)
    a, b = reproduction.clusters()
    if a == b == 1:
        return f"{reproduction.source} each show one cluster"
    return f"{reproduction.source} agree (ARI {reproduction.agreement:.2f}) but one of them shows one cluster"


def preclustering_said(skipped: dict[str, Any], strategy: str) -> str:
    """AdaCFL's round-line words for a pre-clustering it skipped ("" when it ran or was switched off)."""
    why = skipped.get("preclustering_skipped")
    return f"{strategy}: pre-clustering by label entropy skipped: {why}" if why else ""


def revisits_said(state: Any) -> str:
    """The splits (each into how many clusters: a cut may make more than two) and merges the
    revisits took, for the count basis ("" when none)."""
    parts = [len(r["into"]) for r in getattr(state, "revisits", []) if r["action"] == "split"]
    merges = sum(1 for r in getattr(state, "revisits", []) if r["action"] == "merge")
    if not parts and not merges:
        return ""
    into = (f" (into {', '.join(map(str, parts[:-1]))} and {parts[-1]} clusters)" if len(parts) > 1 else
            f" (into {parts[0]} clusters)" if parts else "")
    return (f"; then {len(parts)} split{'' if len(parts) == 1 else 's'}{into} and {merges} "
            f"merge{'' if merges == 1 else 's'} on the members' training updates (revisit)")


# ------------------------------------------------------------- one cluster at the end
def deferral_why(said: str) -> str:
    """Why the clustering step's cut was deferred, from its words (``oneshot.gate``:
    "<strategy>: cut deferred: <why>; <what is kept until when>")."""
    return said.split("cut deferred: ", 1)[-1].rsplit("; ", 1)[0]


def retry_said(strategy: str, server_round: int, clients: int, found: int, said: str | None, deferred: bool,
               info: dict[str, Any]) -> str:
    """The round line of a clustering step run again (``retry-after``): from which
    round's model, how many clients, and what its cut found (the gate's words when it deferred or
    was taken; else the best cut's silhouette against the one required)."""
    head = f"{strategy}: clustering step retried on round {server_round}'s model ({clients} clients): "
    if deferred and said:
        return head + f"cut deferred: {deferral_why(said)}; one cluster kept"
    if found > 1:
        return head + f"{found} clusters" + (f"; {said.split(': ', 1)[-1]}" if said else "")
    best, required = info.get("auto_best_silhouette"), info.get("auto_required_silhouette")
    if best is None:
        return head + "one cluster, no structure; one cluster kept"
    return head + (f"one cluster, its best cut's silhouette {against(best, '<', required or 0.0)}; one cluster kept"
                   if required is not None else f"one cluster (best-cut silhouette {best:.2f}); one cluster kept")


def revisits_waiting(state: Any, params: Any) -> dict[str, int] | None:
    """The one cluster's wait for repliers (``revisit._waiting``: since when, at most how many of
    how many members trained, how many its revisit needs), or None when it is not waiting or the
    revisits are off."""
    if not params.revisit or len(set(state.assignment.values())) != 1:
        return None
    return getattr(state, "revisit_waiting", {}).get(next(iter(state.assignment.values())))


def _pooled(params: Any) -> str:
    """The rounds a revisit pools (``revisit-rounds``, at partial participation only), in words."""
    rounds = getattr(params, "revisit_rounds", 1) if params.fraction_train < 1 else 1
    return "one round" if rounds == 1 else f"up to {rounds} rounds"


def revisits_found(state: Any, params: Any) -> str:
    """What the revisits found after a deferred cut, for the one-cluster reason ("" when off)."""
    if not params.revisit:
        return ""
    waiting = revisits_waiting(state, params)
    if waiting:
        return (f"; the revisits have not judged the cluster since round {waiting['since']}: at most "
                f"{waiting['trained']} of its {waiting['members']} members trained in {_pooled(params)}, fewer "
                f"than the {waiting['needed']} they need (fraction-train {params.fraction_train:g})")
    return ("; no cluster's training updates showed a partition that reproduced in successive rounds and "
            "passed the split tests")


def merged_back(state: Any) -> str | None:
    """Why one cluster is left when the revisits' last merge made it (the clustering step's cut,
    or a revisit's split, had made more); None when no merge did."""
    merges = [r for r in getattr(state, "revisits", []) if r["action"] == "merge"]
    if not merges:
        return None
    last = merges[-1]
    made = len(set(state.clustering_state.get("labels", [])))
    before = (f"the clustering step's cut made {made} clusters, and the revisits merged them" if made > 1 else
              "the revisits split the clustering step's one cluster and merged the parts")
    a, b = last["clusters"]
    return (f"{before} back into one: last clusters {a} and {b} in round "
            f"{last['round']}, their members' training updates showing no structure together and pointing alike "
            f"(mean-update cosine {last['cosine']:.2f}) in rounds "
            f"{last['rounds'][0]} and {last['rounds'][1]}")


def one_cluster_reason(state: Any, params: Any, reasons: dict[str, str]) -> str | None:
    """Why the run ended with one cluster (None when it has more); ``reasons``: the
    strategy's reason code -> sentence."""
    if len(set(state.assignment.values())) > 1:
        return None
    if not state.clustered:
        return reasons["not_clustered"]
    merged = merged_back(state)
    if merged:
        return merged
    deferred = state.clustering_state.get("deferred")
    if deferred:
        return f"the clustering step's cut was deferred ({deferral_why(deferred)}){revisits_found(state, params)}"
    best = state.clustering_state.get("auto_best_silhouette")
    if params.lambda_ == "auto":
        shown = "none (fewer than 3 clients)" if best is None else f"{best:.3f}"
        reference = state.clustering_state.get("auto_reference_silhouette")
        noise = "" if reference is None else f", group-free data of this size reaches {reference:.3f}"
        return (f"{reasons['silhouette']} (best silhouette {shown}, "
                f"auto-min-silhouette {params.auto_min_silhouette}{noise}; compared "
                f"{', '.join(state.layer_choice.keys)})")
    return f"{reasons['threshold']} (lambda {params.lambda_})"


def fedclust_reason(state: Any, params: Any, reasons: dict[str, str]) -> str | None:
    """The one-cluster reason, with the clients the last re-cut saw."""
    reason = one_cluster_reason(state, params, reasons)
    if reason and state.recuts:
        last = state.recuts[-1]
        if last.get("deferred"):  # the grown sample's cut found clusters, and was not taken
            return (f"the cut of a grown sample ({last['clients']} clients, round {last['round']}) was deferred "
                    f"({deferral_why(last['deferred'])}){revisits_found(state, params)}")
        reason += f" (cut again on a grown sample: last on {last['clients']} clients)"
    return retried(state, reason)


def retried(state: Any, reason: str | None) -> str | None:
    """A one-cluster ``reason`` with what the clustering step run again found (``retry-after``),
    when it ran."""
    retry = getattr(state, "retry", None)
    if not reason or not retry:
        return reason
    again = f"cut deferred: {deferral_why(retry['deferred'])}" if retry.get("deferred") else "one cluster"
    return f"{reason}; run again on round {retry['round']}'s model ({retry['clients']} clients): {again}"


def adacfl_reason(state: Any, params: Any, reasons: dict[str, str], sizes: dict[str, int]) -> str | None:
    """The one-cluster reason, with the clients the clustering step saw (under partial
    participation every active client, or with ``cluster-all-active = false`` a sample) and their median size (``sizes``: client key -> examples): a
    small sample of small clients is where the silhouette cannot beat group-free data."""
    reason = one_cluster_reason(state, params, reasons)
    if reason is None or not state.clustered:
        return reason
    keys = state.clustering_state.get("client_order", [])
    known = [sizes[key] for key in keys if key in sizes]
    median = f", median {float(np.median(known)):g} examples each" if known else ""
    joined = len(state.newcomer_log)
    later = (f"; the paper clusters once, and the {joined} clients placed later joined its one cluster "
             f"(epsilon auto is infinite with one reference)" if joined else "")
    clustering_round = state.clustering_state.get("clustering_round")
    return retried(state, f"{reason}; the clustering step in round {clustering_round} saw {len(keys)} clients"
                          f"{median}{later}")


def one_cluster_advice(state: Any, params: Any = None) -> str:
    """The one setting most likely to change a one-cluster ending; never a value already in force."""
    if not state.clustered:
        return "a longer round timeout or more clients (nobody replied to the clustering step)"
    waiting = None if params is None else revisits_waiting(state, params)
    if waiting and params.fraction_train < 1:
        return (f"a higher fraction-train (the revisits judge a cluster on {waiting['needed']} of its members "
                f"trained in {_pooled(params)})")
    if merged_back(state):
        return "revisit = false (the clusters the clustering step made are kept, as the papers do), or HiCFL or CFL"
    if state.clustering_state.get("deferred"):
        more = "more rounds (the revisits watch every round's updates)" if getattr(params, "revisit", True) else \
            "revisit = true (the clusters revisited on every round's updates)"
        return f"{more}, or HiCFL or CFL"
    if state.layer_choice.scores or state.layer_choice.rule == EVIDENCE:
        return "HiCFL or CFL (they compare every round), or a lower auto-min-silhouette if the groups are close"
    return "cluster_layers='auto' (each layer scored) or HiCFL"


def warmup_said(choice: Any, strategy: str, rounds: int, clustering_round: int) -> str:
    """Round 1 of a warm-up: what the clustering step will compare, and when."""
    if choice.candidates:
        what = f"each of {len(choice.candidates)} candidate layers ({', '.join(choice.candidates)}), the one whose " \
               f"clients' updates show the most structure"
    else:
        what = ", ".join(choice.keys) + (f" (cluster-layers = {choice.rule})" if choice.rule != EVIDENCE else "")
    return (f"{strategy}: FedAvg warm-up for {rounds} round{'' if rounds == 1 else 's'}; the clustering step in "
            f"round {clustering_round} compares {what}")


# ------------------------------------------------------------- the number of clusters
def fedclust_count_basis(state: Any, params: Any) -> str | None:
    """The clustering step's own evidence for the number of clusters: λ and how it was
    chosen, the cut's silhouette, the arrays compared (None before the step ran)."""
    if not state.clustered:
        return None
    cs, k = state.clustering_state, len(set(state.assignment.values()))
    silhouette = cs.get("silhouette")
    cut = (f"lambda {float(cs['lambda']):.3g} as given" if params.lambda_ != "auto" else
           f"lambda auto {float(cs['lambda']):.3g}, the best-silhouette cut")
    shown = "" if silhouette is None else f" at silhouette {silhouette:.3f}"
    on = f"{len(cs.get('client_order', []))} clients on {', '.join(state.layer_choice.keys)}"
    if cs.get("retried_from") is not None:  # retry-after: the step's second run made the clusters
        on += f" (the clustering step run again on round {cs['clustering_round']}'s model)"
    if cs.get("deferred"):
        return (f"{k} clusters: the clustering step's cut of {on} deferred ({deferral_why(cs['deferred'])})"
                f"{revisits_said(state)}")
    return f"{k} clusters: {cut}{shown} of {on}{revisits_said(state)}"


def adacfl_count_basis(state: Any, params: Any) -> str | None:
    """Why the run ended with this many clusters, from the cut's own evidence (λ and how it
    was chosen, silhouettes, pre-clusters, merges, clusters that newcomers founded); None
    before the clustering step."""
    if not state.clustered:
        return None
    cut = state.clustering_state  # what the clustering step recorded
    final = len(set(state.assignment.values()))
    how = _adacfl_lambda(cut, params)
    pre = len(cut.get("precluster_cuts", [])) or 1
    at_clustering = len(set(cut["labels"]))
    within = cut.get("clusters_within_preclusters", at_clustering)
    if pre > 1:
        if not params.precluster_merge:
            merged = ", their union kept (precluster-merge = false)"
        elif cut.get("auto_clusters") == 1:
            merged = ", kept apart: the weights show no structure to merge them by"
        elif within != at_clustering:
            merged = f", merged across pre-clusters at lambda to {at_clustering}"
        else:
            merged = ", none of them within lambda of another"
        steps = f"; cut inside {pre} entropy pre-clusters into {within} clusters{merged}"
    else:
        steps = (f"; one pre-cluster, cut into {at_clustering} clusters" if at_clustering > 1
                 else "; one pre-cluster, left as one cluster")
    founded = sum(1 for entry in state.newcomer_log if entry.get("new_cluster"))
    later = f"; {founded} more founded by newcomers farther than epsilon" if founded else ""
    revisited = revisits_said(state)
    gone = at_clustering + founded - final
    emptied = f"; {gone} left without members" if gone > 0 and not revisited else ""
    if cut.get("deferred"):
        how = f"the clustering step's cut deferred ({deferral_why(cut['deferred'])}), {how}"
    if cut.get("retried_from") is not None:  # retry-after: the step's second run made the clusters
        how = f"the clustering step run again on round {cut['clustering_round']}'s model, {how}"
    return f"{final} cluster{'' if final == 1 else 's'}: {how}{steps}{later}{revisited}{emptied}"


def _adacfl_lambda(cut: dict[str, Any], params: Any) -> str:
    """How AdaCFL's λ was chosen, from what its cut recorded."""
    lam = float(cut["lambda"])
    if "auto_clusters" not in cut:
        how = f"lambda {lam:.3g} as given"
    elif cut["auto_clusters"] < 2:
        best = cut.get("auto_best_silhouette")
        how = (f"lambda auto {lam:.3g}: one cluster, the best cut's silhouette "
               f"{'none' if best is None else f'{best:.3f}'} below the required "
               f"{cut.get('auto_required_silhouette') or params.auto_min_silhouette:.3f}")
    elif cut["auto_clusters"] == cut["auto_best_clusters"]:
        how = (f"lambda auto {lam:.3g}: the best-silhouette cut of all {len(cut['client_order'])} clients, "
               f"{cut['auto_clusters']} clusters at silhouette {cut['auto_silhouette']:.3f}")
    else:
        how = (f"lambda auto {lam:.3g}: {cut['auto_clusters']} clusters at silhouette "
               f"{cut['auto_silhouette']:.3f}, the fewest within auto-tolerance {cut['auto_tolerance']:g} of "
               f"the best cut ({cut['auto_best_clusters']} clusters at {cut['auto_best_silhouette']:.3f})")
    if cut.get("auto_max_clusters"):
        how += (f" (at most {cut['auto_max_clusters']} clusters: the best cut beat only the group-free "
                f"reference {cut['auto_reference_silhouette']:.3f}, not auto-min-silhouette "
                f"{params.auto_min_silhouette})")
    return how


def _score(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _against(value: float | None, bar: float | None) -> tuple[str, str]:
    """A score and the bar it fell short of, with as many decimals (2 to 6) as it takes for
    the shown numbers to differ as the numbers do: never "0.18 < 0.18"."""
    if value is None or bar is None:
        return _score(value), "" if bar is None else f"{bar:.2f}"
    for digits in range(2, 7):
        if f"{value:.{digits}f}" != f"{bar:.{digits}f}":
            return f"{value:.{digits}f}", f"{bar:.{digits}f}"
    return f"{value:.6g}", f"{bar:.6g}"
