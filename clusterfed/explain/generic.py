"""What every strategy's round line says, whatever the strategy: the words the driver adds
around a strategy's own (its ``decision`` diagnostic, ``one_cluster_reason``,
``one_cluster_advice``, ``cluster_count_basis``), so that every run's explanation is complete
and says nothing false.

- round 1 names what the strategy compares (``compares_words``) when the strategy's own line
  does not: its ``compares()`` hook where it has one, else what its state says it compares
  (the arrays a CFL-family decision reads, IFCA's losses under each model, selection's final
  layer), else the arrays ``compare-arrays`` selects; strategies that compare nothing (FedAvg,
  FedProx, Local, Oracle) say nothing;
- the last line names every cluster of a single client (``singleton_words``);
- advice never suggests a setting already in force (``checked_advice``): an alternative
  ``key = value`` whose value is the strategy's own is dropped, and advice left with none is
  not given;
- the one sentence both families say when they refuse to set one client apart alone
  (``set_apart``, ``left_alone``), so that they say it alike.

The families' own sentences stay in ``explain/oneshot.py`` and ``explain/bipartition.py``;
this module decides nothing and reads nothing of the true groups.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping
from typing import Any

# registered strategies whose design compares nothing: one model (FedAvg, FedProx), one per
# client (Local), the true groups (Oracle); their round lines say nothing of a comparison
NOTHING_COMPARED = frozenset({"fedavg", "fedprox", "local", "oracle", "flwr-fedavg"})
SAID = re.compile(r"\bcompar(?:e|es|ed|ing)\b", re.IGNORECASE)
SHOWN_LAYERS = 8  # layers named in full; beyond, the first ones and a count
DESIGNED_SINGLE = frozenset({"local"})  # strategies whose every cluster is one client by design
# strategy -> the single-client clusters its round lines last named (said again only when they change)
_NAMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# why no strategy sets one client apart alone (CFL's tree, LayerCFL's, FedClust's and AdaCFL's
# clustering step and revisits): an outlier of one task and a group of one look the same
GROUP_OF_ONE = "cannot be told from a group of one"


def set_apart(names: str, *, subject: str, past: bool = False) -> str:
    """Why a cut that only sets the clients ``names`` apart is not taken: ``subject`` names the
    cut ("it", "the cut"); ``past`` for a cut already made (the clustering step's deferral)."""
    return f"{subject} only {'set' if past else 'sets'} {names} apart, and one client's own data {GROUP_OF_ONE}"


def left_alone(verb: str, client: str = "") -> str:
    """Why a split that ``verb`` ("leaves", "left") one client alone (``client``, when named) is
    refused."""
    named = f" ({client})" if client else ""
    return f"{verb} one client alone{named}, whose own data {GROUP_OF_ONE}"


# ------------------------------------------------------------ round 1: what is compared
def layers_of(names: list[str]) -> list[str]:
    """The layers of array names, in order (``fc1.weight``, ``fc1.bias`` -> ``fc1``)."""
    out: list[str] = []
    for name in names:
        layer = name.rsplit(".", 1)[0] if "." in name else name
        if layer not in out:
            out.append(layer)
    return out


def arrays_words(names: list[str]) -> str:
    """Array names as a round line says them: by layer, with the count of arrays."""
    layers = layers_of(list(names))
    shown = ", ".join(layers[:SHOWN_LAYERS]) + (f" and {len(layers) - SHOWN_LAYERS} more layers"
                                                if len(layers) > SHOWN_LAYERS else "")
    return f"{shown} ({len(names)} array{'s' if len(names) != 1 else ''})"


def _state(strategy: Any, field: str) -> Any:
    return getattr(getattr(strategy, "state", None), field, None)


def compares_words(strategy: Any) -> str | None:
    """One sentence on what ``strategy`` compares to cluster its clients; None for a strategy
    whose design compares nothing."""
    hook = getattr(strategy, "compares", None)
    if callable(hook) and (said := hook()):
        return said
    name, label = getattr(strategy, "name", ""), type(strategy).__name__
    if name in NOTHING_COMPARED:
        return None
    params = getattr(strategy, "params", None)
    if any(c.__name__ == "IFCA" for c in type(strategy).__mro__):
        k = _state(strategy, "k")
        return (f"{label} compares each client's loss on its own data under each of the {k or 'K'} cluster "
                f"models; the lowest wins the client")
    if (keys := _state(strategy, "layer_keys")) and getattr(params, "cluster_on", None):
        what = "change of the final layer" if params.cluster_on == "changes" else "final-layer weights"
        return f"{label} compares the clients' latest {what}: {arrays_words(keys)}, cluster-on = {params.cluster_on}"
    choice = _state(strategy, "layer_choice")
    if choice is not None and not getattr(choice, "decided", True) and getattr(choice, "keys", None):
        rule = getattr(params, "cluster_layers", None)
        candidates = list(getattr(choice, "candidates", None) or {})
        where = (f"on the layer its evidence picks there among {', '.join(candidates)}" if len(candidates) > 1
                 else f"on {arrays_words(list(choice.keys))}")
        return f"{label} compares the clients' updates in its clustering round, {where} (cluster-layers = {rule})"
    names = None
    decision = getattr(strategy, "decision_names", None)
    if callable(decision):
        try:
            names = list(decision())
        except Exception:  # noqa: BLE001 (a state not set up yet: fall back to compare-arrays)
            names = None
    hicfl_layers = _state(strategy, "layers")
    if hicfl_layers and not names:
        return f"{label} compares the clients' updates layer by layer: {', '.join(hicfl_layers)}"
    if not names:
        try:
            names = strategy.compared_names()
        except Exception:  # noqa: BLE001 (no θ0 yet)
            return None
    if not names:
        return None
    rule = getattr(params, "compare_arrays", None)
    rule_words = f"; compare-arrays = {rule}" if isinstance(rule, str) else ""
    return f"{label} compares the clients' updates on {arrays_words(names)}{rule_words}"


# ------------------------------------------------------------ the last line: single clients
def singletons(assignment: Mapping[str, int]) -> dict[int, str]:
    """Cluster -> its one member, for every cluster of a single client."""
    members: dict[int, list[str]] = {}
    for key, cluster in assignment.items():
        members.setdefault(cluster, []).append(key)
    return {cluster: keys[0] for cluster, keys in sorted(members.items()) if len(keys) == 1}


def singleton_words(assignment: Mapping[str, int]) -> str | None:
    """The clusters of a single client, named (None when there are none, or one client only)."""
    single = singletons(assignment)
    clusters = len(set(assignment.values()))
    if not single or len(assignment) < 2:
        return None
    if len(single) == clusters:
        return f"every cluster is a single client ({clusters} clients, {clusters} clusters)"
    if len(single) == 1:
        (cluster, key), = single.items()
        return f"cluster {cluster} is a single client ({key})"
    named = ", ".join(f"{cluster} ({key})" for cluster, key in single.items())
    return f"clusters {named} are single clients"


# ------------------------------------------------------------ advice: nothing already in force
SETTING = re.compile(r"([A-Za-z][\w.-]*)\s*=\s*(['\"]?)([\w.+-]+)\2")
TOP_SPLIT = re.compile(r",\s+or\s+|,\s+|\s+or\s+")


def _value_in_force(params: Any, key: str, value: str, name: str) -> bool:
    """Whether setting ``key`` (a run-config key, ``hicfl.window``, or a keyword,
    ``cluster_layers``) to ``value`` is what ``params`` already holds."""
    if params is None:
        return False
    prefix, _, short = key.rpartition(".")
    if prefix and prefix.lower() != name:
        return False
    field = short.replace("-", "_")
    fields = getattr(type(params), "model_fields", {})
    for candidate in (field, field + "_"):
        if candidate in fields or hasattr(params, candidate):
            current = getattr(params, candidate, None)
            break
    else:
        return False
    if isinstance(current, bool):
        return value.lower() == str(current).lower()
    if isinstance(current, (int, float)):
        try:
            return float(value) == float(current)
        except ValueError:
            return False
    return str(current).lower() == value.lower()


def _alternatives(advice: str) -> list[str]:
    """The top-level alternatives of advice (split at ``,`` and ``or`` outside brackets); a
    piece that starts ``which`` continues the one before."""
    pieces, depth, start, i = [], 0, 0, 0
    while i < len(advice):
        ch = advice[i]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and (m := TOP_SPLIT.match(advice, i)):
            pieces.append(advice[start:i])
            start = i = m.end()
            continue
        i += 1
    pieces.append(advice[start:])
    out: list[str] = []
    for piece in (p.strip() for p in pieces if p.strip()):
        if out and piece.startswith("which "):
            out[-1] += f", {piece}"
        else:
            out.append(piece)
    return out


def settings_in_force(strategy: Any, advice: str) -> list[str]:
    """The ``key = value`` settings ``advice`` suggests that ``strategy`` already runs with."""
    params, name = getattr(strategy, "params", None), getattr(strategy, "name", "")
    return [m.group(0) for m in SETTING.finditer(advice) if _value_in_force(params, m.group(1), m.group(3), name)]


def checked_advice(strategy: Any, advice: str | None) -> str | None:
    """``advice`` without the alternatives that suggest a setting already in force (None when
    none is left); unchanged when it suggests nothing in force."""
    if not advice or not settings_in_force(strategy, advice):
        return advice
    kept = [piece for piece in _alternatives(advice) if not settings_in_force(strategy, piece)]
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else ", ".join(kept[:-1]) + f", or {kept[-1]}"


# ------------------------------------------------------------ the driver's words
def ending_words(strategy: Any, clients: Any = None) -> str | None:
    """The last round line's words on the clusters ``strategy`` ends with: as FedAvg, its
    reason and what to try (advice checked against the settings in force); with several, its
    evidence for their number; and the clusters of a single client, named."""
    name = type(strategy).__name__
    reason = strategy.one_cluster_reason(clients)
    assignment = dict(strategy.assignment)
    single = singleton_words(assignment)
    clusters = len(set(assignment.values()))
    if reason is not None and clusters <= 1:  # a one-cluster reason beside several clusters would contradict the line
        advice = checked_advice(strategy, strategy.one_cluster_advice())
        return f"{name} ends with one cluster: {reason}" + (f"; try {advice}" if advice else "")
    basis = strategy.cluster_count_basis()
    text = None
    if basis is not None and clusters >= 2:
        said = basis.startswith(f"{clusters} clusters")  # the one-shot strategies' basis names the count itself
        text = f"{name} ends with " + (basis if said else f"{clusters} clusters: {basis}")
    if single and getattr(strategy, "name", "") not in DESIGNED_SINGLE:  # Local: one client per cluster by design
        text = f"{text}; {single}" if text else f"{name} ends with {clusters} clusters; {single}"
    return text


def round_words(strategy: Any, server_round: int, num_rounds: int, decision: str | None, clients: Any = None,
                first: bool = False) -> str:
    """The strategy's words for the round line: on the run's first round (``first``: round 1
    of a run not resumed) what it compares unless its own ``decision`` says so, its
    ``decision``, the clusters of a single client in a round that made them (named again
    when they change), and on the last round its ending (``ending_words``, which names them)."""
    parts = []
    if first and not (decision and SAID.search(decision)):
        parts.append(compares_words(strategy))
    parts.append(decision)
    designed = getattr(strategy, "name", "") in DESIGNED_SINGLE
    single = None if designed else singleton_words(dict(strategy.assignment))
    try:
        named, _NAMED[strategy] = _NAMED.get(strategy), single
    except TypeError:  # a strategy that cannot be weakly referenced: named at the end only
        named = single
    if server_round == num_rounds:
        parts.append(ending_words(strategy, clients))
    elif single and single != named:
        parts.append(single)
    return "; ".join(text for text in parts if text)
