"""What the bi-partitioning strategies (CFL, LayerCFL, HiCFL) say about their final number of
clusters, without true groups: ``one_cluster_reason`` (why a run ended as FedAvg, with the
numbers behind it: the closest refused split against its threshold, or the split criteria
against theirs) and ``cluster_count_basis`` (the splits accepted with their scores against
the thresholds, the merges made and the closest pair of leaves a merge refused)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from clusterfed.clustering.split_rules import one_cluster_reason, refusal_counts
from clusterfed.strategies.parts import Host, Part

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
}


class EvidenceParams(Protocol):
    """The bi-partitioning parameters the evidence reads (``BiPartitioningParams`` has them;
    a Protocol, not an import of the module that composes this part)."""

    min_split_size: int
    min_split_round: int


class EvidenceState(Protocol):
    """The strategy state the evidence reads (all of it read only)."""

    assignment: dict[str, int]
    splits: list[dict[str, Any]]
    merges: list[dict[str, Any]]
    split_allowed: bool
    last_criteria: dict[str, Any] | None
    merge_refused: dict[str, Any] | None


class Refusals(Protocol):
    """What each strategy says of its own refused splits and timing rule (CFL: ``refused``;
    HiCFL: ``no_split`` and its stability)."""

    def refusal_codes(self) -> list[str]:
        """The reason code of every refused split attempt (``one_cluster_reasons``)."""

    def refusal_numbers(self) -> str | None:
        """The closest refused split against its threshold."""

    def timing_numbers(self) -> str | None:
        """The timing rule's numbers in its last round against its thresholds."""

    def split_score(self, split: dict[str, Any]) -> tuple[str, float, float] | None:
        """A split's structure score's name, the score and what it had to reach."""


class EvidenceHost(Refusals, Host[EvidenceState], Protocol):
    """A strategy, as its evidence sees it: its state and its refusals."""


class CountEvidence(Part[EvidenceState]):
    """The reasons of a bi-partitioning strategy: ``host`` gives its state and its refusals,
    ``reasons`` its ``one_cluster_reasons``, ``timing_code`` the reason code when the timing
    rule never held."""

    def __init__(self, host: EvidenceHost, params: EvidenceParams, reasons: dict[str, str],
                 timing_code: str) -> None:
        super().__init__(host)
        self.host: EvidenceHost = host
        self.params = params
        self.reasons = reasons
        self.timing_code = timing_code

    def criteria_numbers(self) -> str | None:
        """The split criteria of the last cluster judged against their thresholds."""
        last = self.state.last_criteria
        if not last:
            return None
        c = self.params
        if last["mode"] == "absolute":
            return (f"round {last['round']}: mean-update norm {last['mean_norm']:.3g} vs eps1 {c.eps1}, "
                    f"max norm {last['max_norm']:.3g} vs eps2 {c.eps2}")
        return (f"round {last['round']}: mean-update norm {last['mean_norm']:.3g} vs rel-eps1 × peak "
                f"{c.rel_eps1 * last['reference_mean_norm']:.3g}, max norm {last['max_norm']:.3g} vs rel-eps2 × mean "
                f"{c.rel_eps2 * last['mean_norm']:.3g}")

    def one_cluster_advice(self) -> str | None:
        """What to try, by the reason the splits never happened (``ONE_CLUSTER_ADVICE``)."""
        codes = self.host.refusal_codes()
        code = (Counter(codes).most_common(1)[0][0] if codes
                else ("size" if not self.state.split_allowed else self.timing_code))
        return ONE_CLUSTER_ADVICE.get(code)

    def one_cluster_reason(self) -> str | None:
        """Why the run ended with one cluster, with the numbers behind it (None when it has more)."""
        state = self.state
        if len(set(state.assignment.values())) > 1:
            return None
        codes = self.host.refusal_codes()
        reason = one_cluster_reason(self.reasons, codes, state.split_allowed, len(state.splits),
                                    timing=self.timing_code)
        if state.splits and state.merges:  # merged back: name the last merge's evidence and thresholds
            return reason + "; " + self.merge_evidence(state.merges[-1])
        if not state.split_allowed:
            numbers = (f"min-split-size {self.params.min_split_size}, min-split-round {self.params.min_split_round}, "
                       f"{len(state.assignment)} clients")
        else:
            numbers = self.host.refusal_numbers() if codes else self.host.timing_numbers()
        return f"{reason}; {numbers}" if numbers else reason

    def merge_evidence(self, merge: dict[str, Any]) -> str:
        """One merge's numbers against the thresholds that allowed it, for the reason."""
        c = self.params
        parts = [f"round cosine {merge['cosine']:.3f} >= merge-min-cosine {c.merge_min_cosine}"]
        if merge.get("drift_cosine") is not None:
            parts.append(f"drift cosine {merge['drift_cosine']:.3f} >= {c.merge_min_cosine}")
        if merge.get("silhouette") is not None:
            parts.append(f"silhouette {merge['silhouette']:.3f} <= merge-max-silhouette {c.merge_max_silhouette}")
        return f"last merge (round {merge['round']}, clusters {merge['merged'][0]} and {merge['merged'][1]}): " \
               + ", ".join(parts) + " (merge = false keeps the splits)"

    def merge_refusal(self) -> str:
        """Why no further pair of leaves merged: ``merge = false``, or the closest pair of the
        last round (by the cosine of the mean updates) and the test it failed."""
        c = self.params
        if not c.merge:
            return "merge = false"
        pair = self.state.merge_refused
        if not pair:
            return "no two leaves replied in one round to compare"
        where = f"the closest pair of leaves (round {pair['round']}, clusters {pair['clusters'][0]} and {pair['clusters'][1]})"
        if pair["cosine"] < c.merge_min_cosine:
            return f"{where} had round cosine {pair['cosine']:.3f} < merge-min-cosine {c.merge_min_cosine}"
        if pair.get("silhouette") is not None and pair["silhouette"] > c.merge_max_silhouette:
            return f"{where} had silhouette {pair['silhouette']:.3f} > merge-max-silhouette {c.merge_max_silhouette}"
        drift = pair.get("drift_cosine")
        return f"{where} had drift cosine {drift:.3f} < {c.merge_min_cosine}" if drift is not None else where

    def split_refusal(self) -> str:
        """Why the clusters split no further: the refused attempts by reason with the closest
        refusal's numbers, or, with none refused, the timing rule's last numbers."""
        codes = self.host.refusal_codes()
        if codes:
            numbers = self.host.refusal_numbers()
            return f"{len(codes)} split attempts refused: {refusal_counts(codes)}" + (f"; {numbers}" if numbers else "")
        numbers = self.host.timing_numbers()
        return f"no split attempt refused; the timing rule's last {numbers}" if numbers else "no split attempt refused"

    def cluster_count_basis(self) -> str | None:
        """The evidence for the final number of clusters (None with one cluster: see the reason)."""
        state = self.state
        leaves = len(set(state.assignment.values()))
        if leaves <= 1:
            return None
        scored = [(s, score) for s in state.splits if (score := self.host.split_score(s)) is not None]
        closest = sorted(scored, key=lambda item: item[1][1] - item[1][2])[:SHOWN_SPLITS]
        shown = "; ".join(f"round {s['round']}, cluster {s['parent']}: {name} {value:.3f} vs {threshold:.3f}"
                          for s, (name, value, threshold) in closest)
        splits = f"{len(state.splits)} splits accepted" + (f" (closest to their threshold: {shown})" if shown else "")
        return (f"{splits}, {len(state.merges)} merges; no further merge: {self.merge_refusal()}; "
                f"no further split: {self.split_refusal()}")
