"""What the one-shot clustered strategies (FedClust, AdaCFL) share: the clustering step's
parameters, the state fields it reads and writes, and its steps as functions of that state
and those parameters (no object of its own, no call back into the strategy).

- ``start``: before the clustering step, the layer choice (``layer_choice.py``).
- ``cluster_extra``, ``collect``: the clustering phase's upload. Clients train a common
  start model and send only the compared layer(s); the server turns the replies into one
  row per client: the partial weights minus the start model's (what training changed; for
  L2 exactly the papers' distance between weights, for ``cosine`` it compares directions
  of training rather than weight vectors dominated by the shared start). A stock ClientApp
  (no profile query) trains its own run config's ``local-epochs`` and ignores the
  message's: unless its reply confirms the epochs asked (a ``local-epochs`` metric), it is
  sent its own reply back until it has trained ``cluster-epochs`` (``chain-until =
  epochs``) or until the clustering of the replies stops changing (``chain-until =
  stable``). Clients whose reply is lost or rejected stay unplaced, admitted again later.
- ``cut``: the dendrogram cut at ``lambda`` (``clustering/oneshot.py``); ``form``: one
  cluster per label (the strategy makes the clusters and hands their ids in), the cluster
  references (the mean of the members' clustering-round partial weights: the papers leave
  the reference open) and what clusters.json records; ``placed``: the newcomer log.
- The revisits after the clustering step: ``revisit.py``; the step run again: ``retry.py``.

The strategy asks (``train_asks``), samples (``Round.reachable``) and makes clusters
(``new_cluster``) itself and hands the results in; what the run says is ``explain/oneshot.py``'s.
The fields are declared once in ``OneShotState`` (each strategy's ``State`` extends it: one
name in a checkpoint).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
from pydantic import Field
from sklearn.metrics import adjusted_rand_score

from clusterfed.clustering import DEFAULT_MAX_CLUSTERS, distance_matrix, linkage_matrix, stack_partials
from clusterfed.clustering.group_structure import MIN_ROWS, SMALL_ROWS, GroupTest, group_test
from clusterfed.clustering.null_reference import DEFAULT_DRAWS, shared_draws
from clusterfed.clustering.oneshot import (
    chain_halves, cut_into, lone_rows, most_alike, silhouette_or_none, threshold_cut)
from clusterfed.clustering.reproducible import DEFAULT_AGREEMENT, Reproduction, compare, coordinate_halves
from clusterfed.explain import oneshot as explain
from clusterfed.explain.generic import set_apart
from clusterfed.explain.numbers import compared
from clusterfed.strategies.base import ClusteredState, StrategyParams
from clusterfed.core.contract import StrategyParamsError
from clusterfed.core.exchange import (
    UPLOAD_FULL, Arrays, Ask, ClientInfo, Diagnostics, NewcomersPlaced, Round, Steps, TrainReply, natural)
from clusterfed.strategies import evidence_upload
from clusterfed.strategies.layer_choice import MAX_CANDIDATE_LAYERS, LayerChoice, choose, start_choice

# the default of ``matrix-max-clients``: the square distance matrix (for the heat-map) of
# this many clients is a few megabytes of JSON
MAX_MATRIX_CLIENTS = 500

PositiveNumber = Annotated[float, Field(gt=0)]

# two clusters' mean updates must point at least this much alike to be one task (the CFL
# family's merge-min-cosine): the revisits' merges, and the most alike a split's parts may point
MERGE_MIN_COSINE = 0.6

class OneShotParams(StrategyParams):
    """The clustering step's parameters, shared by FedClust and AdaCFL."""

    cluster_epochs: int = Field(10, alias="cluster-epochs", ge=1,
                                description="local epochs of the clustering step (and of a newcomer's placement)")
    cluster_layers: str = Field("auto", alias="cluster-layers",
                                description="layers uploaded and compared: auto = the layer whose clients' updates show "
                                            "the most structure (with reproduce: among the layers whose cut passes its "
                                            "tests, when any; every candidate layer uploaded once, in the "
                                            "clustering phase); final = the papers' rule; or a rule (smallest-fc, "
                                            "conv, fc, all) or layer names. Arrays no client changed are left out")
    max_candidate_layers: int = Field(
        MAX_CANDIDATE_LAYERS, alias="max-candidate-layers", ge=1,
        description="cluster-layers = auto: the most candidate layers scored (of more: the first and the last half, an "
                    "input shift showing near the input, a label shift near the head); each costs one cut with its "
                    "group-free reference and is uploaded once in the clustering phase")
    matrix_max_clients: int = Field(
        MAX_MATRIX_CLIENTS, alias="matrix-max-clients", ge=0,
        description="clusters.json keeps the clients' distance matrix, and the round its cut's silhouette, up to "
                    "this many clustered clients (beyond: O(m²) memory and megabytes of JSON)")
    evidence_sketch: bool = Field(
        True, alias="evidence-sketch",
        description="cluster-layers = auto: each candidate layer's update travels projected by a seeded CountSketch "
                    "shared with the server (4-bit numbers), so that the clustering upload is at most the paper "
                    "layer's bytes; a stock ClientApp without clusterfed.client.evidence_mod sends its whole model, "
                    "projected on the server (false: every candidate layer uploaded whole)")
    chain_until: Literal["stable", "epochs"] = Field(
        "stable", alias="chain-until",
        description="a stock ClientApp (it trains its own local-epochs per request) is sent its reply back until "
                    "the chain's cut settles (stable: under reproduce, the cuts of requests 1..k/2 and k/2+1..k "
                    "agree; at most cluster-epochs in all) or until it has trained cluster-epochs (epochs, the "
                    "papers' phase)")
    lambda_: PositiveNumber | Literal["auto"] = Field(
        "auto", alias="lambda", description='distance threshold of the dendrogram cut, or "auto" = the best-silhouette cut')
    distance: Literal["l2", "cosine"] = Field(
        "cosine", description="distance between the clients' partial weights (changes from the start model)")
    linkage: Literal["average", "single", "complete", "ward"] = Field("average", description="dendrogram linkage")
    auto_min_silhouette: float = Field(
        0.25, alias="auto-min-silhouette", ge=-1, le=1,
        description='lambda = "auto": below this best silhouette the clients stay one cluster (and say so), '
                    'unless it beats what group-free data of the same size reaches (auto-reference-draws)')
    max_clusters: int = Field(
        DEFAULT_MAX_CLUSTERS, alias="max-clusters", ge=2,
        description='lambda = "auto": the most clusters a cut may form (the candidate cuts scored)')
    cluster_all_active: bool = Field(
        True, alias="cluster-all-active",
        description="the clustering step asks every active client for its partial upload, as the papers send the "
                    "start model to every available client; the round's training keeps its fraction-train sample "
                    "(false: only the round's sample is clustered, the rest placed as newcomers later)")
    reproduce: bool = Field(
        True, description="a cut is taken only when two independent halves of the evidence give the same partition "
                          "(a stock client's chained requests 1..h and h+1..k, else two halves of the compared "
                          "coordinates; adjusted Rand index at least reproduce-agreement) and, with "
                          f"{MIN_ROWS} or more clients, its parts' separation beats auto-reference-draws group-free "
                          "rotations of the rows, with its silhouette or by twice theirs (fewer than "
                          f"{SMALL_ROWS} clients, or coordinate halves: its clusters' mean changes also below cosine "
                          f"0.6, which alone decides below {MIN_ROWS}); "
                          "otherwise it is deferred (one cluster) and the round line says so, as is a cut that only "
                          "sets single clients apart; under cluster-layers = auto the layer compared is the most "
                          "structured one whose cut passes these tests, when any (the others asked only when the most "
                          "structured one's fails; each layer's cut, and the cut taken, one of as many tests as "
                          "layers scored: (auto-reference-draws + 1) x layers - 1 rotations) (false: the papers' single cut)")
    reproduce_agreement: float = Field(
        DEFAULT_AGREEMENT, alias="reproduce-agreement", ge=0, le=1,
        description="the adjusted Rand index two independent cuts must reach for a cut, a split or a merge to be taken")
    revisit: bool = Field(
        True, description="after the clustering step, keep watching the training updates: a cluster whose members' "
                          "updates show the same partition in two successive rounds, beating group-free rotations of "
                          "them, is split, two clusters whose members' updates show no structure together and point "
                          "alike in two successive rounds are merged (not two once apart in two such rounds); "
                          f"a cluster is judged on {SMALL_ROWS} of its members (every member of a smaller one) "
                          "(false: the papers' one-shot clustering)")
    merge_probe: bool = Field(
        True, alias="merge-probe",
        description="revisit: a cluster a split made also trains, in a second exchange of a round and for evidence "
                    "only, the model of the cluster its members' updates point most alike to, and joins it when the "
                    "two clusters' updates on that one model pass the merge test in two such rounds running; so does "
                    "the smaller of two clusters held apart once their own models' updates point alike; at partial "
                    "participation members of both beyond the sample are asked too (false: merges compare each "
                    "cluster's own model's updates)")
    revisit_rounds: int = Field(
        3, alias="revisit-rounds", ge=1,
        description="revisit at partial participation: a cluster is cut on each member's latest update over up to "
                    "this many rounds, the cut reproducing one of rounds before them (merges: one round's)")
    auto_reference_draws: int = Field(
        DEFAULT_DRAWS, alias="auto-reference-draws", ge=0,
        description='group-free reference sets, the clients\' rows rotated at random about their mean: lambda = '
                    '"auto", a best cut below auto-min-silhouette still counts when it beats their best silhouette '
                    '(many small clients, or a few with large layers); and a reproduced cut (x the layers scored '
                    f'under cluster-layers = auto) or a revisit\'s split must beat them (0 = fixed threshold only, '
                    f'and the cosine rules of fewer than {SMALL_ROWS} clients)')


@dataclass
class OneShotState(ClusteredState):
    """The base's state and the fields the one-shot steps read and write."""

    clustered: bool = False
    # the model every clustering-phase client trains; newcomers train it too, so that
    # their partial weights are comparable with the cluster references
    cluster_start: Arrays = field(default_factory=dict)
    references: dict[int, np.ndarray] = field(default_factory=dict)
    layer_choice: LayerChoice = field(default_factory=LayerChoice)
    clustering_state: dict[str, Any] = field(default_factory=dict)
    # cluster-layers = auto: the projection of the clustering upload ({}: none; evidence_upload.py)
    evidence_plan: dict[str, Any] = field(default_factory=dict)
    # revisits (``revisit.py``): per cluster its last cuts, update scale, wait for repliers and
    # members' latest updates (``revisit._pool``); per pair its last round found alike and its
    # successive rounds found apart (two: never merged); the splits and merges taken
    revisit_cuts: dict[int, dict[str, Any]] = field(default_factory=dict)
    revisit_alike: dict[str, int] = field(default_factory=dict)
    revisits: list[dict[str, Any]] = field(default_factory=list)
    revisit_scale: dict[int, float] = field(default_factory=dict)
    revisit_waiting: dict[int, dict[str, int]] = field(default_factory=dict)
    revisit_pool: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    revisit_apart: dict[str, list[int]] = field(default_factory=dict)
    merge_probes: dict[int, dict[str, Any]] = field(default_factory=dict)  # merge-probe: by guest (``merge_probe.py``)
    retry: dict[str, Any] | None = None  # retry-after (``retry.py``): the step run again, what it found


def start(state: OneShotState, params: OneShotParams, compare: list[str], paper_rule: str, *, name: str,
          model: Arrays | None = None) -> None:
    """Before the clustering step: not clustered, the start model (``model``, default θ0), the layer choice
    among the ``compare`` arrays (``paper_rule``: the paper's layer rule, ``auto``'s fallback on a model with
    no candidate layer; a rule that selects nothing: StrategyParamsError, named for strategy ``name``)."""
    model = state.theta0 if model is None else model
    state.clustered = False
    state.cluster_start = model
    state.references = {}
    try:
        state.layer_choice = start_choice(model, params.cluster_layers, compare, params.compare_arrays,
                                          paper_rule, max_candidates=params.max_candidate_layers)
    except ValueError as error:
        raise StrategyParamsError(f"{name}: {error}") from None
    state.clustering_state = {}
    state.evidence_plan = evidence_upload.start_plan(model, state.layer_choice, paper_rule, params.compare_arrays,
                                                     enabled=params.evidence_sketch, seed=params.seed)


def round_sample(strategy: Any, rnd: Round, *, clustering: bool) -> list[str]:
    """The clients ``strategy`` may ask for work in ``rnd``: a ``fraction-train`` sample of every
    active client; in a ``clustering`` round under ``cluster-all-active``, every active client
    (a group none of the sample holds would otherwise join another group's cluster as
    newcomers), with the sample kept as the round's trainers (``rnd.train_sample``)."""
    sample = strategy.sample_active(rnd)
    if not clustering or not strategy.params.cluster_all_active or len(sample) == len(rnd.active):
        return sample
    rnd.train_sample = sample
    return list(rnd.active)


def cut(X: np.ndarray, params: OneShotParams, max_clusters: int | None = None,
        sample: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
    """The cut of the rows of X at ``lambda`` into at most ``max_clusters`` (default
    ``max-clusters``); ``sample`` > 0: a cut of a sample, the rest placed at the nearest reference."""
    return threshold_cut(X, params.number_or_none(params.lambda_), metric=params.distance, linkage=params.linkage,
                         min_silhouette=params.auto_min_silhouette, reference_draws=params.auto_reference_draws,
                         seed=params.seed, max_clusters=params.max_clusters if max_clusters is None else max_clusters,
                         sample=sample)


# ---------------------------------------------------------- the clustering phase's upload
def cluster_extra(state: OneShotState, params: OneShotParams) -> dict[str, Any]:
    """What a clustering-phase ask says beyond a train ask: its epochs and the arrays to upload."""
    return {"local-epochs": params.cluster_epochs, "upload": ",".join(state.layer_choice.keys),
            **evidence_upload.ask_config(state.evidence_plan, state.layer_choice.keys)}


def collect(asks: list[Ask], start: Arrays, state: OneShotState, params: OneShotParams, *, stock: set[str],
            local_epochs: Any, strategy: str, sample: int = 0, cut_rule: Any = None) -> Steps:
    """Ask ``asks`` (``start`` trained for ``cluster-epochs``, the compared arrays uploaded:
    ``cluster_extra``) and return (keys that replied, their partial weights as rows or None,
    the uplink bytes of this phase, its diagnostics, the chain's ``Halves`` or None).

    A stock ClientApp (its key in ``stock``) trains its run config's ``local-epochs`` (the
    server's train config's, ``local_epochs``) whatever the message asks, and returns its
    whole model: unless its reply confirms the epochs asked, it is sent its own reply back,
    ``stock_requests`` in all. With ``chain-until = stable`` the chain ends early once its
    cut settles: under ``reproduce``, once the cuts of what requests 1..h and h+1..2h changed
    (independent SGD draws) agree on clusters; else once three requests in a row cut alike.
    A chain that never settles reports its halves' disagreement, and the strategy defers
    the cut (``gate``). ``strategy`` names it in the round line; ``cut_rule`` (rows -> labels)
    is the strategy's cut of the weights, when not ``cut``."""
    epochs = params.cluster_epochs
    for ask in asks:
        if ask.key in stock:  # it sends its whole model anyway; the next request needs it
            ask.config["upload"] = UPLOAD_FULL
    first = {ask.key: ask for ask in asks}
    received = yield asks
    bytes_up = received.bytes_up
    done, replies = [], []  # trained the epochs asked / to be sent their own reply back
    for reply in received:
        # a projected reply (a stock client with the evidence mod trained the epochs itself) ends its chain
        (done if reply.key not in stock or reply.is_update or reply.metrics.get("local-epochs") == epochs
         else replies).append(reply)
    chained, requests, partitions = 0, 1, []
    trail = [_compared_weights(replies, state)]  # the chained clients' compared arrays after each request
    for _ in range(stock_requests(epochs, local_epochs) - 1):
        if not replies:
            break
        if params.chain_until == "stable":
            if params.reproduce:
                if len(trail) % 2 == 0 and chain_settled(chain_rows(trail, start, state, params), params, sample,
                                                                  cut_rule):
                    break
            elif settled(done + replies, start, state, params, sample, partitions):
                break
        # the same request again (a stock client's asks upload its full model), on its own reply
        received = yield [Ask(reply.key, reply.weights, dict(first[reply.key].config)) for reply in replies]
        bytes_up += received.bytes_up
        chained += len(replies)
        requests += 1
        replies = list(received)  # a client that fails on the way stays unplaced
        trail.append(_compared_weights(replies, state))
    spans = _chain_spans(trail, start, state) if params.reproduce and len(trail) >= 2 else None
    diagnostics = {"stock_chained_requests": chained, "stock_trainings": requests} if chained else {}
    replies = sorted(done + replies, key=lambda reply: natural(reply.key))
    if not replies:
        return [], None, bytes_up, diagnostics, None  # no halves
    # rows in layer order, so every client's vector lines up (measured on digits IID:
    # cosine on weights split 2 of 4 seeds, on changes none)
    first_choice = not state.layer_choice.decided
    sent_keys = list(state.layer_choice.keys)
    X = rows(replies, start, state.layer_choice, params, state.evidence_plan, eligible=chain_eligible(spans, params))
    # the chain's halves on the layer just chosen (the same spans the choice tested): what the gate reads
    halves = None if spans is None else spans.halves_on(state.layer_choice.compared)
    if first_choice:
        diagnostics["decision"] = explain.compared(state.layer_choice, strategy)
        diagnostics["compared_arrays"] = list(state.layer_choice.keys)
    if state.evidence_plan:
        whole = evidence_upload.projected_on_server(replies, state.evidence_plan)
        diagnostics["evidence_upload"] = evidence_upload.words(state.evidence_plan, sent_keys, whole)
        if first_choice:
            diagnostics["decision"] += "; " + diagnostics["evidence_upload"]
    return [reply.key for reply in replies], X, bytes_up, diagnostics, halves


def _compared_weights(replies: list[TrainReply], state: OneShotState) -> dict[str, Arrays]:
    """Each chained reply's arrays that may be compared (the layer choice's keys), by client."""
    keys = state.layer_choice.keys
    return {reply.key: {k: np.asarray(reply.weights[k], np.float64) for k in keys} for reply in replies}


def reproduced(reproduction: Reproduction, params: OneShotParams) -> bool:
    """Both independent cuts found clusters, and the same ones."""
    return reproduction.reproduces(params.reproduce_agreement) and min(reproduction.clusters()) > 1


Halves = tuple[np.ndarray, np.ndarray, str]  # two independent rows per client, and what they were


def chain_rows(trail: list[dict[str, Arrays]], start: Arrays, state: OneShotState,
               params: OneShotParams) -> Halves | None:
    """What requests 1..h and h+1..k changed (k requests so far, h = k // 2), on the layer
    the whole chain's rows would choose (``chain_eligible``: under ``reproduce``, the most
    structured layer whose cut the gate would take); None with fewer than 3 clients in both."""
    spans = _chain_spans(trail, start, state)
    if spans is None:
        return None
    choice = copy.deepcopy(state.layer_choice)
    choose(choice, spans.whole, spans.origin, metric=params.distance, linkage=params.linkage,
           min_silhouette=params.auto_min_silhouette, reference_draws=params.auto_reference_draws, seed=params.seed,
           eligible=chain_eligible(spans, params))
    return spans.halves_on(choice.compared)


class ChainSpans(NamedTuple):
    """A chain's evidence: the chained clients' weights after the last request, what they are
    changes from, and what requests 1..h and h+1..k changed on given arrays (names -> Halves)."""
    whole: list[Arrays]
    origin: Any
    halves_on: Callable[[list[str]], Halves]


def _chain_spans(trail: list[dict[str, Arrays]], start: Arrays, state: OneShotState) -> ChainSpans | None:
    """The chained clients' weights after the last request (and what they are changes from),
    and a function giving what requests 1..h and h+1..k changed on given arrays; None with
    fewer than 3 clients in both."""
    k = len(trail)
    h = k // 2
    keys = sorted(set(trail[h - 1]) & set(trail[-1]), key=natural)
    if len(keys) < 3:
        return None
    starts, middle, last = [start] * len(keys), [trail[h - 1][key] for key in keys], [trail[-1][key] for key in keys]
    plan = state.evidence_plan
    if plan:
        # the evidence the decision is taken on: each span's update in the clustering round's projected
        # space (the server projects what a stock client sent whole), the layer chosen there
        whole, origin = evidence_upload.spans_in_space(last, starts, state.layer_choice.keys, plan)
        first_half, _ = evidence_upload.spans_in_space(middle, starts, state.layer_choice.keys, plan)
        second_half, _ = evidence_upload.spans_in_space(last, middle, state.layer_choice.keys, plan)
    else:
        whole, origin, first_half, second_half = last, start, None, None
    source = f"requests 1–{h} and {h + 1}–{k}"

    def halves_on(names: list[str]) -> Halves:
        def stacked(weights: list[Arrays]) -> np.ndarray:
            return stack_partials([[np.asarray(w[n], np.float64) for n in names] for w in weights])

        if plan:
            return stacked(first_half), stacked(second_half), source
        return (*chain_halves(stacked(starts), stacked(middle), stacked(last)), source)

    return ChainSpans(whole, origin, halves_on)


def chain_eligible(spans: ChainSpans | None, params: OneShotParams) -> Any:
    """Under ``reproduce``, the layer choice's test of a candidate layer (``layer_choice.choose``'s
    ``eligible``): does the layer's own best cut (the scoring cut, not the strategy's, which
    may differ: AdaCFL's pre-clusters) pass ``gate``'s tests, on the chain's halves of its
    arrays (``spans``, cut on their own as the gate cuts them; None: two halves of the rows'
    coordinates)? Asked as one of ``tests`` layers, the cut must beat ``shared_draws``
    rotations: all of them together pass group-free updates as rarely as one test. None
    when ``reproduce`` is off (the most structured layer, as the papers' single cut)."""
    if not params.reproduce:
        return None

    def eligible(names: list[str], X: np.ndarray, labels: np.ndarray, tests: int = 1) -> bool:
        return not gate(X, labels, spans.halves_on(names) if spans is not None else None, params, "",
                        tests=tests).deferred

    return eligible


def halves_agree(halves: Halves, k: int, params: OneShotParams) -> Reproduction:
    """Each half cut into ``k`` clusters (the partition a decision would take), compared."""
    a, b, source = halves
    labels_a = cut_into(a, k, metric=params.distance, linkage=params.linkage)
    labels_b = cut_into(b, k, metric=params.distance, linkage=params.linkage)
    return compare(labels_a, labels_b, source)


def chain_settled(halves: Halves | None, params: OneShotParams, sample: int, cut_rule: Any = None) -> bool:
    """Whether a chain's cut has settled: the whole chain's cut (the sum of the halves; by
    ``cut_rule``, rows -> labels, the strategy's own, default ``cut``) finds clusters at a
    silhouette of at least ``auto-min-silhouette``, and both halves show that partition."""
    if halves is None:
        return False
    whole = halves[0] + halves[1]
    labels = cut_rule(whole) if cut_rule is not None else cut(whole, params, sample=sample)[0]
    k = len(np.unique(labels))
    if k < 2:
        return False
    # a cut that only beats group-free data (the lowered bar) may still move with more epochs:
    # only clear structure, at the fixed bar, ends the chain early
    silhouette = silhouette_or_none(distance_matrix(whole, params.distance), labels)
    if silhouette is None or silhouette < params.auto_min_silhouette:
        return False
    return reproduced(halves_agree(halves, k, params), params)


class Gated(NamedTuple):
    """What ``gate`` decided: the labels taken, the reproduction (None: none was needed or
    measured), what the round line says, and whether the cut was deferred."""
    labels: np.ndarray
    reproduction: Reproduction | None
    said: str | None
    deferred: bool


def gate(X: np.ndarray, labels: np.ndarray, halves: Halves | None, params: OneShotParams,
         strategy: str, fallback: np.ndarray | None = None, keys: list[str] | None = None,
         max_clusters: int | None = None, tests: int = 1) -> Gated:
    """The cut that is taken: ``labels`` when they are one cluster (nothing to reproduce),
    when ``reproduce`` is off, or when two independent halves of the evidence (``halves``: a
    chain's; None: two random halves of X's coordinates), each cut into as many clusters,
    give the same partition and the cut beats group-free rotations of the rows
    (``group_structure``, cut into at most ``max_clusters``, default ``max-clusters``; below its
    ``SMALL_ROWS`` rows, its clusters' mean changes also point apart: cosine below
    ``MERGE_MIN_COSINE``, which alone decides below ``MIN_ROWS``); else
    ``fallback`` (what is known without the weights: AdaCFL's label-statistics pre-clusters;
    default one cluster), the cut deferred. Why both: a client's own data is in both halves of
    its evidence, so a cut of one task's clients reproduces too; it does not beat the
    rotations, which keep the rows' spread and mix groups away. Two halves of one update's
    coordinates are not independent draws at all: there the clusters' mean changes must
    also point apart (``most_alike`` below ``MERGE_MIN_COSINE``). A cut of 4 or more clients
    whose only structure is single clients set apart (``lone_rows``, beyond ``fallback``) is
    deferred too, the clients named (``keys``): one client's own data cannot be told from a
    group of one; the revisits split off a real group of one sampled member once more of it
    trains. ``tests``: how many tests this one shares a level with (the layers the compared one
    was chosen among, ``LayerChoice.chosen_among``): the cut must beat ``shared_draws`` rotations.
    Returns the ``Gated`` decision."""
    k = len(np.unique(labels))
    fallback = np.zeros(len(labels), dtype=np.int64) if fallback is None else np.asarray(fallback)
    if not params.reproduce or k < 2 or compare(labels, fallback, "").agreement == 1.0:
        return Gated(labels, None, None, False)
    alone = lone_rows(labels, fallback) if len(labels) >= 4 else []
    if alone:
        named = ", ".join(keys[i] if keys else f"row {i}" for i in alone)
        return Gated(fallback, None, f"{strategy}: cut deferred: {set_apart(named, subject='it', past=True)}; "
                                     f"{_kept(fallback, params)}", True)
    # two halves of one update's coordinates are no independent draws (both hold the client's own
    # data), and below SMALL_ROWS rows the rotation test has little power (below MIN_ROWS none):
    # there the clusters' mean updates must also point apart (one task's clients' point alike)
    strict = halves is None or len(X) < SMALL_ROWS
    if halves is None:
        if len(X) < 3 or X.shape[1] < 2:
            return Gated(labels, None, None, False)
        first, second = coordinate_halves(X.shape[1], np.random.default_rng(params.seed))
        halves = (X[:, first], X[:, second], "coordinate halves")
    reproduction = halves_agree(halves, k, params)
    bound = params.reproduce_agreement
    if not reproduced(reproduction, params):
        return Gated(fallback, reproduction, f"{strategy}: cut deferred: {explain.disagreement(reproduction, bound)}; "
                                             f"{_kept(fallback, params)}", True)
    draws = shared_draws(params.auto_reference_draws, tests)
    tested = groups_tested(X, labels, params, max_clusters, draws)
    level = explain.shared_level(tests, draws)
    if tested is not None and not tested.passes:
        return Gated(fallback, reproduction, f"{strategy}: cut deferred: {reproduction.words(bound)}, but "
                                             f"{tested.words()}{level}: one task, each client's own data; "
                                             f"{_kept(fallback, params)}", True)
    cosine = most_alike(X, labels)[0]
    if (strict or tested is None) and cosine >= MERGE_MIN_COSINE:
        return Gated(fallback, reproduction, f"{strategy}: cut deferred: {reproduction.words(bound)}, but two of its "
                                             f"clusters' mean changes point alike (cosine "
                                             f"{compared(cosine, '>=', MERGE_MIN_COSINE)}): one task, each client's "
                                             f"own data; {_kept(fallback, params)}", True)
    beats = "" if tested is None else f"; {tested.words()}{level}"
    return Gated(labels, reproduction, f"{strategy}: cut reproduced: {reproduction.words(bound)}{beats}", False)


def groups_tested(X: np.ndarray, labels: np.ndarray, params: OneShotParams,
                  max_clusters: int | None = None, draws: int | None = None) -> GroupTest | None:
    """``group_test`` of the cut ``labels`` of X with the strategy's distance, linkage, seed, draws
    (default ``auto-reference-draws``), at most ``max_clusters`` (default ``max-clusters``)."""
    return group_test(X, labels, metric=params.distance, linkage=params.linkage,
                      max_clusters=max_clusters or params.max_clusters,
                      draws=params.auto_reference_draws if draws is None else draws, seed=params.seed)


def _kept(fallback: np.ndarray, params: OneShotParams) -> str:
    """What a deferred cut leaves, in words (``gate``)."""
    found = len(np.unique(fallback))
    kept = "one cluster" if found == 1 else f"the {found} label-statistics pre-clusters"
    return (f"{kept} until the members' training updates show a partition that reproduces (revisit)"
            if params.revisit else f"{kept} (revisit = false)")


def rows(replies: list[TrainReply], start: Arrays, choice: LayerChoice, params: OneShotParams,
         evidence_plan: dict[str, Any] | None = None, eligible: Any = None) -> np.ndarray:
    """The replies' compared arrays minus ``start``'s, one row per reply; the first time,
    this settles which layer ``choice`` compares (``layer_choice.choose``, among the layers
    whose cut ``eligible`` says the gate would take, when given). With an
    ``evidence_plan``: the updates projected (``evidence_upload.rows_input``)."""
    arrays, start = evidence_upload.rows_input(replies, start, choice.keys, evidence_plan or {})
    return choose(choice, arrays, start, metric=params.distance, linkage=params.linkage,
                  min_silhouette=params.auto_min_silhouette, reference_draws=params.auto_reference_draws,
                  seed=params.seed, eligible=eligible)


def settled(replies: list[TrainReply], start: Arrays, state: OneShotState, params: OneShotParams, sample: int,
            partitions: list[np.ndarray]) -> bool:
    """Whether the clustering of ``replies`` (cut on a copy of the layer choice) is the same
    as after the two requests before, with more than one cluster and a silhouette at
    ``auto-min-silhouette``: a stock client's further epochs would not change it."""
    labels, info = cut(rows(replies, start, copy.deepcopy(state.layer_choice), params, state.evidence_plan), params,
                       sample=sample)
    partitions.append(np.asarray(labels))
    if len(partitions) < 3 or len(np.unique(labels)) < 2:
        return False
    # a cut that only beats group-free data (the lowered bar) may still move: only clear
    # structure, at the fixed bar, ends the chain early
    if params.lambda_ == "auto" and (info.get("auto_best_silhouette") or -1.0) < params.auto_min_silhouette:
        return False
    return all(adjusted_rand_score(partitions[-1], earlier) == 1.0 for earlier in partitions[-3:-1])


def stock(clients: dict[str, ClientInfo]) -> set[str]:
    """The keys of stock ClientApps among ``clients``."""
    return {key for key, client in clients.items() if client.stock}


def stock_requests(cluster_epochs: int, local_epochs: Any) -> int:
    """Requests that give a stock ClientApp (its run config's ``local-epochs`` a request; Flower's
    quickstart default, 1, when absent) the clustering step's epochs."""
    return math.ceil(cluster_epochs / max(int(local_epochs or 1), 1))


# ------------------------------------------------------------------------- the clusters
def form(state: OneShotState, params: OneShotParams, server_round: int, keys: list[str], X: np.ndarray,
         labels: np.ndarray, clusters: dict[int, int], start: Arrays, bytes_up: int,
         info: dict[str, Any]) -> Diagnostics:
    """Assign each of ``keys`` to the cluster of its label (``clusters``: label -> the
    cluster the strategy made for it); store the references and the state for the figures
    (``start``: the model the rows of X were trained from and newcomers will train).
    Returns the clustering's diagnostics."""
    for key, label in zip(keys, labels):
        state.assignment[key] = clusters[int(label)]
    # reference = mean of the members' clustering-round partial weights (our choice: the papers leave it open)
    state.references = {clusters[int(label)]: X[labels == label].mean(axis=0) for label in np.unique(labels)}
    small = len(keys) <= params.matrix_max_clients
    D = distance_matrix(X, params.distance) if small else None
    silhouette = silhouette_or_none(D, labels) if small else None
    # the dendrogram is for figures; with a sampled clustering it would cost O(m²) memory
    Z = (linkage_matrix(X, metric=params.distance, linkage=params.linkage)
         if 1 < len(keys) and (small or "cluster_sample" not in info) else None)
    state.clustered = True
    state.cluster_start = start
    state.clustering_state = {
        "clustering_round": server_round,
        "final_clustering_round": server_round,  # one-shot: the same; the grid's column for every strategy
        "layers": list(state.layer_choice.keys),
        "layer_choice": state.layer_choice.record(),
        "distance": params.distance,
        "vectors": "partial weights minus the start model's (L2 distances equal the weights')",
        "linkage_method": params.linkage, "lambda": info["lambda"], "silhouette": silhouette,
        "client_order": list(keys),
        "labels": [state.assignment[key] for key in keys],
        "distance_matrix": None if D is None else D.round(6).tolist(),
        "linkage": None if Z is None else Z.tolist(),
        **{k: v for k, v in info.items() if k != "lambda"},
    }
    return {
        "clustering_bytes_up": bytes_up,
        "lambda_used": info["lambda"],
        "silhouette": silhouette,
        **({"auto_best_silhouette": info["auto_best_silhouette"]} if "auto_best_silhouette" in info else {}),
    }


def say_cut(diagnostics: Diagnostics, labels: np.ndarray, info: dict[str, Any], state: OneShotState,
            params: OneShotParams, strategy: str, paper_rule: str) -> None:
    """A cut that left one cluster: the round's ``decision`` says so (``explain.cut_decision``)."""
    if len(np.unique(labels)) == 1:
        diagnostics["decision"] = explain.cut_decision(diagnostics.get("decision"), state, params, info, strategy,
                                                       paper_rule)


def placed(state: OneShotState, server_round: int, placements: list[tuple[str, int, float, bool]]) -> NewcomersPlaced:
    """Log newcomers placed this round, each (key, cluster, distance, whether it founded the cluster)."""
    entries = [{"round": server_round, "client": key, "cluster": cluster, "distance": float(distance),
                "new_cluster": founded} for key, cluster, distance, founded in placements]
    state.newcomer_log.extend(entries)
    return NewcomersPlaced(entries)
