"""FedClust's and AdaCFL's decisions taken only when they reproduce, and revisited: a stock
client's chain that never settles ends in a deferred cut (never an accepted one), a chain
whose halves agree ends early, a cluster split on training updates that cut alike in two
rounds, merged back when its parts become alike, split again; AdaCFL with stock clients;
the round line's words against the numbers they quote."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfed import AdaCFL, FedClust
from clusterfed.clustering.oneshot import chain_halves, cut_into, lone_rows, mean_cosine
from clusterfed.clustering.reproducible import compare
from clusterfed.core.exchange import Ask, ClientInfo, Replies, TrainReply
from clusterfed.explain import oneshot as explain
from clusterfed.strategies import oneshot, revisit
from clusterfed.strategies.layer_choice import LayerChoice

RNG = np.random.default_rng(0)
KEYS = [str(i) for i in range(8)]
START = {"w": np.zeros(40)}


def directions(groups: list[int], scale: float = 1.0, noise: float = 0.1, seed: int = 0) -> list[np.ndarray]:
    """One update per client: its group's direction plus a little noise."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).normal(size=(4, 40))  # each group its own direction, on every coordinate
    return [scale * centres[g] + noise * rng.normal(size=40) for g in groups]


def reply(key: str, weights: np.ndarray, sent: np.ndarray, cluster: int = 0) -> TrainReply:
    return TrainReply(key, cluster, {"w": weights}, {"w": sent}, 10, 1.0, {})


def drive_chain(params, steps_of_request) -> tuple[list, int]:
    """Run ``oneshot.collect`` for 8 stock clients; request r moves each client by
    ``steps_of_request(r)[i]``. Returns (collect's result, requests made)."""
    state = FedClust.State()
    state.layer_choice = LayerChoice(rule="w", keys=["w"])
    asks = [Ask(key, dict(START), {"phase": "cluster"}) for key in KEYS]
    gen = oneshot.collect(asks, START, state, params, stock=set(KEYS), local_epochs=1, strategy="FedClust")
    sent, request = gen.send(None), 1
    try:
        while True:
            steps = steps_of_request(request)
            out = Replies([reply(a.key, a.model["w"] + steps[int(a.key)], a.model["w"]) for a in sent], bytes_up=0)
            sent, request = gen.send(out), request + 1
    except StopIteration as stop:
        return stop.value, request


def test_a_chain_whose_halves_disagree_never_ends_in_an_accepted_cut():
    params = FedClust.Params(seed=0)
    # every request pushes the clients into two groups drawn afresh: clusters each time, never the same ones
    def fresh(request: int) -> list[np.ndarray]:
        return directions(list(np.random.default_rng(request).permutation([0, 1] * 4)), seed=request)

    (keys, X, _, diagnostics, halves), requests = drive_chain(params, fresh)
    assert requests == 10 and diagnostics["stock_trainings"] == 10  # it never settled: every request made
    labels, _ = oneshot.cut(X, params)
    assert len(np.unique(labels)) > 1  # the whole chain's cut alone would have been taken
    # the last request's two groups of 4 (the whole chain's cut leaves one client alone, a deferral of its own)
    labels = np.random.default_rng(10).permutation([0, 1] * 4)
    taken, reproduction, said, deferred = oneshot.gate(X, labels, halves, params, "FedClust")
    assert deferred and len(np.unique(taken)) == 1 and not reproduction.reproduces(params.reproduce_agreement)
    assert said.startswith("FedClust: cut deferred: requests 1–5 and 6–10 disagree (ARI ")
    assert f"< {params.reproduce_agreement:.2f}" in said and "revisit" in said


def test_a_chain_whose_halves_agree_ends_early_and_its_cut_is_taken():
    params = FedClust.Params(seed=0)
    groups = [0, 0, 0, 1, 1, 1, 2, 2]
    (keys, X, _, diagnostics, halves), requests = drive_chain(
        params, lambda r: directions(groups, seed=r))
    assert diagnostics["stock_trainings"] == 2 < oneshot.stock_requests(params.cluster_epochs, 1)
    labels, _ = oneshot.cut(X, params)
    taken, reproduction, said, deferred = oneshot.gate(X, labels, halves, params, "FedClust")
    assert not deferred and compare(taken, groups, "truth").agreement == 1.0
    assert said.startswith("FedClust: cut reproduced: requests 1–1 and 2–2 agree (ARI 1.00); it beats group-free "
                           "rotations of the updates (best-cut silhouette ")


def test_a_cut_that_only_sets_one_client_apart_is_deferred_and_a_lone_client_beside_groups_stays():
    """One client's own data cannot be told from a group of one: a cut that only sets one client
    apart is deferred (named), whichever way its change points; beside real groups a lone client
    keeps its cluster (the one sampled member of a group); the paper preset takes the cut;
    AdaCFL's singleton pre-cluster (label statistics) keeps its client."""
    params = FedClust.Params(seed=0)
    keys = [f"c{i}" for i in range(8)]
    one_task = np.stack(directions([0] * 8, noise=0.3))
    one_task[5] = one_task[0] + 3.0 * np.random.default_rng(7).normal(size=40)  # its own data, far from the rest
    labels = np.array([0, 0, 0, 0, 0, 1, 0, 0])
    along = mean_cosine(one_task[[5]], np.delete(one_task, 5, axis=0))
    assert 0.0 < along < 0.6
    taken, reproduction, said, deferred = oneshot.gate(one_task, labels, None, params, "FedClust", keys=keys)
    assert deferred and len(np.unique(taken)) == 1 and reproduction is None
    assert said == ("FedClust: cut deferred: it only set c5 apart, and one client's own data cannot be told from a "
                    "group of one; one cluster until the members' training updates show a partition that reproduces "
                    "(revisit)")
    assert explain.deferral_why(said).startswith("it only set c5 apart")
    # pointing away from the rest changes nothing (noise points both ways): the revisits decide
    away = one_task.copy()
    away[5] = -one_task[0]
    assert len(np.unique(oneshot.gate(away, labels, None, params, "FedClust", keys=keys)[0])) == 1

    # c7: the only client of its group (noise on every coordinate: rotations of rows of lower rank
    # cluster as well as the groups do, and real updates have their own data in every direction)
    groups = np.stack(directions([0, 0, 0, 1, 1, 1, 1, 2], noise=0.1))
    cut = np.array([0, 0, 0, 1, 1, 1, 1, 2])
    taken, reproduction, said, deferred = oneshot.gate(groups, cut, None, params, "FedClust", keys=keys)
    assert not deferred and list(taken) == list(cut) and said.startswith("FedClust: cut reproduced: coordinate halves agree")

    paper = FedClust.Params(seed=0, reproduce=False)
    taken, _, said, deferred = oneshot.gate(one_task, labels, None, paper, "FedClust", keys=keys)
    assert list(taken) == list(labels) and said is None and not deferred

    pre = np.array([0, 0, 0, 0, 0, 1, 0, 0])  # c5's label statistics set it apart
    taken, _, said, deferred = oneshot.gate(one_task, np.array([0, 0, 0, 0, 0, 1, 0, 0]), None,
                                            AdaCFL.Params(seed=0), "AdaCFL", fallback=pre, keys=keys)
    assert list(taken) == list(pre) and said is None and not deferred


def test_the_paper_presets_take_the_single_cut():
    for cls in (FedClust, AdaCFL):
        params = cls.paper(**({"lambda_": 1.0} if cls is FedClust else {})).params
        assert not params.reproduce and not params.revisit
        labels = np.array([0, 0, 1, 1])
        assert oneshot.gate(np.zeros((4, 4)), labels, None, params, cls.__name__)[0] is labels


def test_coordinate_halves_cut_into_as_many_clusters_as_the_decision():
    X = np.vstack(directions([0, 0, 0, 1, 1, 1, 2, 2, 2]))
    labels = cut_into(X, 3, metric="cosine", linkage="average")
    assert compare(labels, [0, 0, 0, 1, 1, 1, 2, 2, 2], "truth").agreement == 1.0
    params = FedClust.Params(seed=0)
    taken, reproduction, said, deferred = oneshot.gate(X, labels, None, params, "AdaCFL")
    assert not deferred and (taken == labels).all() and said.startswith("AdaCFL: cut reproduced: coordinate halves agree")


class Revisits:
    """A FedClust state with clusters and a revisit driven by hand-made training updates."""

    def __init__(self, assignment: dict[str, int]):
        self.strategy = FedClust(seed=0)
        self.state = self.strategy.state
        self.state.clustered = True
        self.state.layer_choice = LayerChoice(rule="w", keys=["w"], decided=True)
        self.state.next_cluster_id = max(assignment.values()) + 1
        self.state.models = {c: {"w": np.zeros(40)} for c in set(assignment.values())}
        self.state.assignment = dict(assignment)
        self.state.clustering_state = {"lambda": 0.5, "client_order": list(KEYS), "silhouette": None}

    def round(self, number: int, groups: list[int], scale: float = 1.0) -> dict:
        updates = directions(groups, scale=scale, noise=0.1 * scale, seed=number)
        if len(set(groups)) > 1:  # the cluster's model sits between its groups: their updates point apart
            updates = [u - np.mean(updates, axis=0) for u in updates]
        replies = [reply(k, u, np.zeros(40), self.state.assignment[k]) for k, u in zip(KEYS, updates)]
        return revisit.revisit(self.state, self.strategy.params, number, replies,
                               self.strategy.new_cluster, "FedClust")

    def clusters(self) -> list[list[str]]:
        found: dict[int, list[str]] = {}
        for key, cluster in self.state.assignment.items():
            found.setdefault(cluster, []).append(key)
        return sorted(found.values())


def test_a_split_is_taken_once_two_rounds_cut_alike_undone_when_its_parts_become_alike_and_redone():
    run = Revisits(dict.fromkeys(KEYS, 0))
    two = [0, 0, 0, 0, 1, 1, 1, 1]
    assert run.round(1, two) == {}  # one round's cut: not yet evidence
    said = run.round(2, two)["decision"]
    assert said.startswith("FedClust: cluster 0 (8 clients) split into clusters 1 (4 clients), 2 (4 clients): its members' training "
                           "updates cut alike in rounds 1 and 2 agree (ARI 1.00)")
    assert run.clusters() == [KEYS[:4], KEYS[4:]]
    alike = [0] * 8
    assert "merged" not in run.round(3, alike).get("decision", "")  # alike once: not yet
    said = run.round(4, alike)["decision"]
    assert said.startswith("FedClust: clusters 1 and 2 merged: ") and "rounds 3 and 4" in said
    assert run.clusters() == [KEYS]
    # the run would end with one cluster here: its reason is the merge, not a cut that found none
    assert explain.one_cluster_reason(run.state, run.strategy.params, FedClust.one_cluster_reasons) == (
        "the revisits split the clustering step's one cluster and merged the parts back into one: last "
        f"clusters 1 and 2 in round 4, their members' training updates showing no structure together and pointing "
        f"alike (mean-update cosine {run.state.revisits[-1]['cosine']:.2f}) in rounds 3 and 4")
    assert explain.one_cluster_advice(run.state, run.strategy.params).startswith("revisit = false")
    run.round(5, two)
    assert "split into" in run.round(6, two)["decision"] and run.clusters() == [KEYS[:4], KEYS[4:]]
    assert [r["action"] for r in run.state.revisits] == ["split", "merge", "split"]
    reason = explain.fedclust_count_basis(run.state, run.strategy.params)
    assert reason.startswith("2 clusters: lambda auto 0.5, the best-silhouette cut of 8 clients on w; then 2 splits "
                             "(into 2 and 2 clusters) and 1 merge on the members' training updates (revisit)")


def test_a_revisit_does_not_set_one_client_apart_and_still_splits_a_group_of_two():
    """One client whose updates point away from its cluster's, round after round: the revisit's
    cut sets it apart alone, which one client's own data cannot be told from (as the
    clustering step's deferral reads it), so the cluster stays whole and the line says why; a
    group of two beside two groups of three is split off, and a client alone beside two groups
    goes with their split (the rule refuses cuts whose only structure is single clients)."""
    run = Revisits(dict.fromkeys(KEYS, 0))
    for number in (1, 2, 3):
        said = run.round(number, [0] * 7 + [1])["decision"]
        assert said == ("FedClust: cluster 0 not split: its members' training updates cut into 2 parts, but the cut only "
                        "sets 7 apart, and one client's own data cannot be told from a group of one")
    assert run.clusters() == [KEYS] and run.state.revisits == []
    run = Revisits(dict.fromkeys(KEYS, 0))
    run.round(1, [0, 0, 0, 1, 1, 1, 2, 2])
    assert "split into clusters 1 (3 clients), 2 (3 clients), 3 (2 clients)" in run.round(2, [0, 0, 0, 1, 1, 1, 2, 2])["decision"]
    run = Revisits(dict.fromkeys(KEYS, 0))
    run.round(1, [0, 0, 0, 0, 1, 1, 1, 2])
    assert "into clusters 1 (4 clients), 2 (3 clients), 3 (a single client)" in run.round(2, [0, 0, 0, 0, 1, 1, 1, 2])["decision"]
    assert run.clusters() == [KEYS[:4], KEYS[4:7], KEYS[7:]]


def test_a_revisit_splits_on_groups_that_show_in_another_array_than_the_clustering_steps():
    """The clustering step compared ``w``, where the members train alike; their two groups
    show in ``head`` only (a label swap, once the model trains). Asked of the compared arrays
    (``whole``), the revisit splits in round 2; asked of ``w`` alone, it never does."""
    two = [0, 0, 0, 0, 1, 1, 1, 1]
    for whole, splits in ((["w", "head"], True), (None, False)):
        run = Revisits(dict.fromkeys(KEYS, 0))
        for number in (1, 2, 3):
            alike = directions([0] * 8, noise=0.1, seed=number)
            heads = directions(two, noise=0.1, seed=10 + number)
            heads = [h - np.mean(heads, axis=0) for h in heads]
            replies = [TrainReply(k, 0, {"w": a, "head": h}, {"w": np.zeros(40), "head": np.zeros(40)}, 10, 1.0, {})
                       for k, a, h in zip(KEYS, alike, heads)]
            revisit.revisit(run.state, run.strategy.params, number, replies, run.strategy.new_cluster, "FedClust",
                            whole=whole)
        assert run.clusters() == ([KEYS[:4], KEYS[4:]] if splits else [KEYS])


def test_a_converged_group_whose_members_cut_alike_round_after_round_is_not_split():
    """Each client's own data makes its direction persistent: once the cluster's model fits
    them, its members still cut into the same parts every round, but pull apart at a small
    share of the cluster's scale. Such a cut is one group's spread; the same cut at the full
    scale is a split."""
    run = Revisits(dict.fromkeys(KEYS, 0))
    two = [0, 0, 0, 0, 1, 1, 1, 1]
    NOT_SPLIT = "FedClust: cluster 0 not split: its members' training updates cut into 2 parts, but its parts "
    # the cluster's scale: its first round's updates (one task: any cut of them is its members' own spread)
    said = run.round(1, [0] * 8)["decision"]
    assert said.startswith(NOT_SPLIT.removesuffix("its parts ")) and said.endswith("of the updates (separation 1.81 <= 2.22 "
                                                                                 "of their own spread): one task's spread")
    for number in (2, 3, 4):
        said = run.round(number, two, scale=0.1)["decision"]
        assert said == NOT_SPLIT + "pull apart by 0.13 < 0.50 of the cluster's update scale: one group's spread"
        assert run.clusters() == [KEYS]
    # clients still learning their common task: a persistent cut, parts pointing alike
    common = directions([3] * 8, seed=0)[0]
    learning = Revisits(dict.fromkeys(KEYS, 0))
    for number in (1, 2, 3):
        updates = [common + 0.6 * u for u in directions(two, seed=number)]
        replies = [reply(k, u, np.zeros(40), 0) for k, u in zip(KEYS, updates)]
        said = revisit.revisit(learning.state, learning.strategy.params, number, replies,
                               learning.strategy.new_cluster, "FedClust")["decision"]
        assert said.startswith(NOT_SPLIT + "point alike (mean-update cosine 0.85 >= 0.60): one task")
    assert learning.clusters() == [KEYS]
    said = run.round(5, two)["decision"]  # the first cut at full scale: round 4's was no split
    assert said.endswith("cut into 2 parts, but rounds 4 and 5: the earlier cut kept these clients together")
    assert "split into" in run.round(6, two)["decision"] and run.clusters() == [KEYS[:4], KEYS[4:]]


def test_a_revisit_holds_a_cut_that_only_beats_group_free_data_to_few_parts():
    """24 members of one task in small sets of alike clients (each set's own data, the same rows
    every round). Pairs: their best-silhouette cut, 8 parts, beats group-free rotations of the
    rows but not ``auto-min-silhouette``; held to sqrt(24 / 2) = 3 parts, as AdaCFL's clustering
    step's cut is, the rows show no structure, and the cluster is not split in any round (the
    unbounded cut splits it into 8 in round 2). Triples: held to 3 parts, the cut is judged
    and refused as any cut is, the line saying it was held. Pairs as tight as groups (a
    silhouette above ``auto-min-silhouette``) are cut as they are."""
    from clusterfed.clustering.oneshot import bounded_auto_cut

    def alike_sets(size: int, noise: float, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return np.repeat(rng.normal(size=(24 // size, 40)), size, axis=0) + noise * rng.normal(size=(24, 40))

    keys = [f"c{i}" for i in range(24)]
    NOT_SPLIT = "FedClust: cluster 0 not split: its members' training updates"
    for rows, words in ((alike_sets(2, 1.0, 1), f"{NOT_SPLIT}' best cut, into 8 parts, scored 0.24 < 0.25 (below "
                                                "auto-min-silhouette); held to at most 3 parts, they show no "
                                                "structure beyond group-free data"),
                        (alike_sets(3, 1.3, 4), f"{NOT_SPLIT} cut into 3 parts (held to at most 3: their best cut, "
                                                "into 7 parts, scored 0.247 < 0.250 (below auto-min-silhouette)), but "
                                                "its parts are no further apart than group-free rotations'")):
        run = Revisits(dict.fromkeys(keys, 0))
        for number in (1, 2, 3):
            replies = [reply(k, x, np.zeros(40), 0) for k, x in zip(keys, rows)]
            said = revisit.revisit(run.state, run.strategy.params, number, replies, run.strategy.new_cluster,
                                   "FedClust")["decision"]
            assert said.startswith(words)
        assert run.clusters() == [keys]
    params = run.strategy.params
    assert len(np.unique(revisit._revisit_cut(alike_sets(2, 1.0, 1), params))) == 8  # unbounded: a split of 8
    tight = bounded_auto_cut(alike_sets(2, 0.5, 1), metric=params.distance, linkage=params.linkage,
                             min_silhouette=params.auto_min_silhouette, reference_draws=params.auto_reference_draws,
                             seed=params.seed, max_clusters=params.max_clusters)
    assert tight.bound is None and tight.cut.num_clusters == 12
    assert tight.cut.silhouette >= params.auto_min_silhouette


def test_a_merge_asks_every_compared_array_whether_two_clusters_train_one_task():
    """Two clusters that train the chosen layer (w) alike but their heads apart, as label-swap
    groups do: asked on the chosen layer they merge after two rounds; on every compared array
    (``whole``, the strategies' default) they stay apart."""
    assignment = {k: int(int(k) >= 4) for k in KEYS}
    common = directions([3] * 8, seed=0)[0]
    for whole, merged in ((None, True), (["w", "head"], False)):
        run = Revisits(assignment)
        run.state.models = {c: {"w": np.zeros(40), "head": np.zeros(10)} for c in (0, 1)}
        said = []
        for number in (1, 2):
            rng = np.random.default_rng(2 + number)  # draws whose noise shows no chance cut in either round
            replies = [TrainReply(k, c, {"w": common + 0.1 * rng.normal(size=40),
                                         "head": (3.0 if c else -3.0) * np.ones(10) + 0.1 * rng.normal(size=10)},
                                  {"w": np.zeros(40), "head": np.zeros(10)}, 10, 1.0, {}) for k, c in assignment.items()]
            said.append(revisit.revisit(run.state, run.strategy.params, number, replies, run.strategy.new_cluster,
                                        "FedClust", whole=whole).get("decision", ""))
        assert (run.clusters() == [KEYS]) is merged
        assert ("clusters 0 and 1 merged" in said[1]) is merged


def test_two_clusters_apart_in_two_rounds_running_are_not_merged_when_their_updates_later_look_alike():
    """Two groups' models converge: their members' updates, apart in rounds 1 and 2, shrink to
    what the tasks share and look alike in rounds 3 and 4. The pair was apart in two rounds
    running: two tasks, not merged, and the round line says why (with merge-probe off; with it,
    the pair is left to a probe on one model, ``test_merge_probe.py``). A pair apart in one round
    only (a chance cut) is merged once it looks alike in two."""
    assignment = {k: int(int(k) >= 4) for k in KEYS}
    common = directions([3] * 8, seed=0)[0]

    def rounds(apart_in: tuple[int, ...]) -> tuple[Revisits, list[str]]:
        run, said = Revisits(assignment), []
        run.strategy.params = run.strategy.params.model_copy(update={"merge_probe": False})
        for number in (1, 2, 3, 4):
            spread = directions([0, 0, 0, 0, 1, 1, 1, 1], seed=number)
            updates = ([u - np.mean(spread, axis=0) for u in spread] if number in apart_in else
                       [common + 0.1 * np.random.default_rng(2 + number).normal(size=40) for _ in KEYS])
            replies = [reply(k, u, np.zeros(40), assignment[k]) for k, u in zip(KEYS, updates)]
            said.append(revisit.revisit(run.state, run.strategy.params, number, replies, run.strategy.new_cluster,
                                        "FedClust").get("decision", ""))
        return run, said

    run, said = rounds(apart_in=(1, 2))
    assert run.clusters() == [KEYS[:4], KEYS[4:]] and run.state.revisit_apart == {"0-1": [1, 2]}
    assert said[3].startswith("FedClust: clusters 0 and 1 not merged: their members' training updates show no structure "
                              "together and point alike (mean-update cosine ")
    assert said[3].endswith("in rounds 3 and 4, but were apart beyond group-free rotations in rounds 1 and 2: "
                            "two tasks whose models converge")
    cosine = float(said[3].split("cosine ")[1].split(")")[0])
    assert cosine >= revisit.MERGE_MIN_COSINE
    run, said = rounds(apart_in=(1,))
    assert said[2].startswith("FedClust: clusters 0 and 1 merged: ") and "in rounds 2 and 3" in said[2]
    assert run.clusters() == [KEYS] and run.state.revisit_apart == {}


def test_a_merge_keeps_the_merged_clusters_held_pairs_and_forgets_their_pending_ones():
    """After cluster 1 joins cluster 0: a pair held apart (two tasks) stays held, a pair found
    apart once was judged on cluster 0 without cluster 1's members and is forgotten, and every
    pair of cluster 1 is gone."""
    run = Revisits({k: int(k) % 4 for k in KEYS})
    run.state.revisit_apart = {"0-1": [2], "0-2": [3], "0-3": [1, 2], "1-2": [1, 2], "2-3": [4]}
    revisit.merge_into(run.state, 5, 0, 1, {"cosine": 0.7, "rounds": [4, 5]})
    assert run.state.revisit_apart == {"0-3": [1, 2], "2-3": [4]}


def test_updates_that_cut_differently_in_two_rounds_are_not_split():
    run = Revisits(dict.fromkeys(KEYS, 0))
    run.round(1, [0, 0, 0, 0, 1, 1, 1, 1])
    said = run.round(2, [0, 1, 0, 1, 0, 1, 0, 1])["decision"]
    assert said.startswith("FedClust: cluster 0 not split: its members' training updates cut into 2 parts, but "
                           "rounds 1 and 2 disagree (ARI ") and run.clusters() == [KEYS]


def test_adacfl_takes_a_stock_client_and_says_why_pre_clustering_was_skipped():
    strategy = AdaCFL()
    assert strategy.requires() == set() and strategy.wants() == {"label-stats"}
    clients = {k: ClientInfo(k, 30, 0, stock=True) for k in KEYS[:3]}
    pre, ran, skipped = strategy.preclusters(KEYS[:3], clients)
    assert not ran and (pre == 0).all()
    said = explain.preclustering_said(skipped, "AdaCFL")
    assert said == ("AdaCFL: pre-clustering by label entropy skipped: 3 of 3 clients gave no label statistics "
                    "(3 stock ClientApps)")
    assert AdaCFL(share_label_stats=False).wants() == set()


def test_a_score_and_its_bar_never_read_equal():
    choice = LayerChoice(rule="auto", keys=["trunk.3.weight"], chosen="trunk.3")
    said = explain.no_structure_advice(choice, "AdaCFL", 0.1789, 0.1812, "smallest-fc")
    assert "(best silhouette 0.179 < 0.181)" in said
    assert "(best silhouette 0.12 < 0.25)" in explain.no_structure_advice(choice, "AdaCFL", 0.12, 0.25, "final")


def test_pure_pieces():
    a, b = chain_halves(np.zeros((2, 3)), np.ones((2, 3)), 3 * np.ones((2, 3)))
    assert (a == 1).all() and (b == 2).all()
    # a cut's lone rows count only when they are all it finds (beyond the pre-clusters given)
    assert lone_rows(np.array([0, 0, 0, 1, 0])) == [3]
    assert lone_rows(np.array([0, 0, 1, 1, 2])) == []  # beside real groups
    assert lone_rows(np.array([0, 0, 1, 1, 2]), within=np.array([0, 0, 1, 1, 1])) == [4]
    assert lone_rows(np.array([0, 0, 0, 1]), within=np.array([0, 0, 0, 1])) == []  # its own pre-cluster
    # an absent member joins the part holding most of its side in its latest cut, less the other sides';
    # alone on its side then (its side absent now), where the clients it was cut from are not
    earlier = [{"round": 1, "labels": {"a": 0, "b": 0, "c": 1, "d": 1}}, {"round": 2, "labels": {"a": 0, "e": 1}}]
    assert revisit._last_side("c", earlier, {"a": 5, "b": 5, "d": 6}, largest=5) == 6
    assert revisit._last_side("e", earlier, {"a": 5, "b": 5, "d": 6}, largest=5) == 6
    assert revisit._last_side("z", earlier, {"a": 5, "b": 5, "d": 6}, largest=5) == 5
    assert mean_cosine(np.array([[1.0, 0.0]]), np.array([[2.0, 0.0]])) == 1.0
    assert mean_cosine(np.zeros((1, 2)), np.ones((1, 2))) == 0.0


def test_a_singleton_is_named_advice_is_never_in_force_and_round_1_names_what_is_compared():
    run = Revisits({**dict.fromkeys(KEYS[:7], 0), "7": 1})
    from clusterfed.explain.generic import ending_words

    ending = ending_words(run.strategy)
    assert ending.endswith("; cluster 1 is a single client (7)") and ending.count("single client") == 1
    run.state.layer_choice = LayerChoice(rule="auto", keys=["w"], chosen=None, decided=True)  # one candidate
    assert "cluster_layers='auto'" not in explain.one_cluster_advice(run.state, run.strategy.params)
    run.state.clustering_state["deferred"] = "FedClust: cut deferred: requests 1–5 and 6–10 disagree (ARI 0.31 < 0.80)"
    assert "revisit = true" not in explain.one_cluster_advice(run.state, run.strategy.params)
    choice = LayerChoice(rule="auto", keys=["a.weight", "b.weight"], candidates={"a": ["a.weight"], "b": ["b.weight"]})
    assert explain.warmup_said(choice, "AdaCFL", 1, 2) == (
        "AdaCFL: FedAvg warm-up for 1 round; the clustering step in round 2 compares each of 2 candidate layers "
        "(a, b), the one whose clients' updates show the most structure")


def partial_revisits(members: int, samples: list[list[int]], rounds: int = 3) -> tuple[Revisits, dict[int, str]]:
    """A cluster of ``members`` clients in two halves (the groups), each round's ``samples``
    replying with their group's direction (the model between the groups), revisits pooling
    ``rounds`` rounds (``revisit-rounds``); each round's words."""
    keys = [str(i) for i in range(members)]
    run = Revisits(dict.fromkeys(keys, 0))
    run.strategy.params = run.strategy.params.model_copy(update={"revisit_rounds": rounds, "fraction_train": 0.5})
    said = {}
    for number, sample in enumerate(samples, 1):
        updates = directions([int(k >= members // 2) for k in sample], noise=0.1, seed=number)
        updates = [u - np.mean(updates, axis=0) for u in updates]
        replies = [reply(str(k), u, np.zeros(40), 0) for k, u in zip(sample, updates)]
        said[number] = revisit.revisit(run.state, run.strategy.params, number, replies, run.strategy.new_cluster,
                                       "FedClust").get("decision", "")
    return run, said


def test_at_partial_participation_a_revisit_splits_on_pairs_seen_together_earlier():
    """20 members, two groups (0-9, 10-19), 8 or 10 reply a round: round 3 shares only 3 clients
    with round 2 and 3 with round 1, but the 6 pairs among them sat then as they sit now:
    split, each absent member on the side its last cut put it with."""
    samples = [[0, 1, 2, 3, 10, 11, 12, 13], [4, 5, 6, 7, 14, 15, 16, 17], [0, 1, 4, 5, 8, 9, 10, 14, 18, 19]]
    run, said = partial_revisits(20, samples)
    assert said[2] == ("FedClust: split of cluster 0 deferred: rounds 1 and 2 share fewer than 4 of its members, "
                       "nor did 6 pairs of 4 of them meet in earlier rounds")
    assert ("split into clusters 1 (10 clients), 2 (10 clients): its members' training updates cut alike in pairs "
            "seen together in rounds 1–2 and round 3 agree (pair ARI 1.00 over 6 pairs)") in said[3]
    keys = [str(i) for i in range(20)]
    assert run.clusters() == sorted([keys[:10], keys[10:]])


def test_a_revisit_judges_a_cluster_only_in_a_round_where_enough_of_its_members_train():
    """A partial sample's few repliers cut alike in two rounds by chance: with one round's
    repliers only (``revisit-rounds = 1``), a cluster of 12, 6 of them a round, is not cut (the
    round line says how many trained) although its two groups would pass every test, and the
    one-cluster reason and advice say why; a cluster of 6 is cut when all 6 reply, not when 4 do."""
    samples = [[0, 1, 2, 6, 7, 8], [0, 1, 3, 6, 7, 9], [0, 1, 2, 6, 7, 8]]
    run, said = partial_revisits(12, samples, rounds=1)
    for number in (1, 2, 3):
        assert said[number] == ("FedClust: cluster 0 not revisited: 6 of its 12 members trained, fewer than the 8 "
                                "its cut and merges are judged on")
    assert len(run.clusters()) == 1 and run.state.revisit_cuts == {}
    assert run.state.revisit_waiting == {0: {"since": 1, "trained": 6, "members": 12, "needed": 8}}
    run.state.clustering_state["deferred"] = "FedClust: cut deferred: it only set 3 apart; one cluster until then"
    params = run.strategy.params.model_copy(update={"fraction_train": 0.5})
    assert explain.one_cluster_reason(run.state, params, {}) == (
        "the clustering step's cut was deferred (it only set 3 apart); the revisits have not judged the cluster since "
        "round 1: at most 6 of its 12 members trained in one round, fewer than the 8 they need (fraction-train 0.5)")
    assert explain.one_cluster_advice(run.state, params).startswith("a higher fraction-train")
    run.state.revisit_waiting = {}  # judged since: the reason and advice no longer speak of waiting
    assert "no cluster's training updates showed a partition" in explain.one_cluster_reason(run.state, params, {})
    assert explain.one_cluster_advice(run.state, params).startswith("more rounds")
    small, said = partial_revisits(6, [[0, 1, 3, 4]] * 2 + [list(range(6))] * 2, rounds=1)
    assert said[1] == said[2] == ("FedClust: cluster 0 not revisited: 4 of its 6 members trained, fewer than the 6 its "
                                  "cut and merges are judged on")
    assert said[3] == "" and "split into clusters 1 (3 clients), 2 (3 clients)" in said[4]
    assert len(small.clusters()) == 2 and small.state.revisit_waiting == {}


def test_at_partial_participation_a_revisit_pools_rounds_and_reproduces_on_rounds_before_them():
    """A cluster of 12 (groups 0-5, 6-11), 6 members a round: the revisit cuts each member's
    latest update over the fewest rounds holding 8 of them (rounds 1-2, then 2-3 and 3-4), and
    splits only once a cut reproduces one of rounds wholly before its own (rounds 1-2 against
    3-4): the cuts of rounds 1-2 and 2-3 share round 2's updates and are no independent
    evidence."""
    samples = [[0, 1, 2, 6, 7, 8], [0, 1, 3, 6, 7, 9], [2, 3, 4, 8, 9, 10], [0, 4, 5, 6, 10, 11]]
    run, said = partial_revisits(12, samples)
    assert said[1] == ("FedClust: cluster 0 not revisited: 6 of its 12 members trained, fewer than the 8 its cut "
                       "and merges are judged on")
    assert said[2] == said[3] == ""
    assert ("split into clusters 1 (6 clients), 2 (6 clients): its members' training updates cut alike in rounds "
            "1–2 and 3–4 agree") in said[4]
    keys = [str(i) for i in range(12)]
    assert run.clusters() == sorted([keys[:6], keys[6:]]) and run.state.revisit_pool == {}


def test_two_clusters_of_three_training_alike_are_merged_as_before_at_partial_participation():
    """Clusters smaller than a revisit's 4 members are never waited for: two of 3 members each,
    every member training alike, are merged once judged alike in two rounds running."""
    run = Revisits({**dict.fromkeys(KEYS[:3], 0), **dict.fromkeys(KEYS[3:6], 1)})
    run.strategy.params = run.strategy.params.model_copy(update={"fraction_train": 0.5})
    said = {}
    for number in (1, 2, 3):
        updates = directions([0] * 6, noise=0.1, seed=number)
        replies = [reply(k, u, np.zeros(40), run.state.assignment[k]) for k, u in zip(KEYS[:6], updates)]
        said[number] = revisit.revisit(run.state, run.strategy.params, number, replies, run.strategy.new_cluster,
                                       "FedClust").get("decision", "")
    assert said[3].startswith("FedClust: clusters 0 and 1 merged") and run.clusters() == [KEYS[:6]]


def test_two_clusters_are_not_merged_on_a_few_repliers_each():
    """Two clusters of 10 training alike, 3 of each replying a round: not compared for a merge
    (each waits for 8 of its members); all 10 of each replying alike in two rounds: merged."""
    keys = [str(i) for i in range(20)]
    run = Revisits({k: int(int(k) >= 10) for k in keys})
    common = directions([3] * 20, seed=0)[0]

    def alike_round(number, sample):
        rng = np.random.default_rng(number)
        replies = [reply(k, common + 0.1 * rng.normal(size=40), np.zeros(40), run.state.assignment[k]) for k in sample]
        return revisit.revisit(run.state, run.strategy.params, number, replies, run.strategy.new_cluster,
                               "FedClust").get("decision", "")

    few = ["0", "1", "2", "10", "11", "12"]
    for number in (1, 2):
        said = alike_round(number, few)
        assert "merged" not in said and "cluster 1 not revisited: 3 of its 10 members trained" in said
    assert len(run.clusters()) == 2
    alike_round(3, keys)
    assert "clusters 0 and 1 merged" in alike_round(4, keys) and len(run.clusters()) == 1


def test_a_cut_of_one_tasks_clients_that_reproduces_is_deferred_unless_it_beats_rotations():
    """A client's own data is in both halves of its evidence (a chain's, or two halves of one
    update's coordinates): 8 clients of one task, each with its own data, whose cut both
    halves reproduce (what the gate took before) are kept together, because the cut is no
    better than group-free rotations of the rows (``group_structure``); real groups beat them."""
    from clusterfed.clustering.group_structure import group_test
    from clusterfed.clustering.oneshot import threshold_cut
    from clusterfed.clustering.reproducible import coordinate_halves

    params = FedClust.Params(seed=0)
    rng = np.random.default_rng(1008)
    one_task = rng.normal(size=40) + rng.normal(size=(8, 40))  # the task's direction, each client's own data
    labels, _ = threshold_cut(one_task, None, metric="cosine", linkage="average", min_silhouette=0.25,
                              reference_draws=19, seed=0, max_clusters=10)
    labels = np.asarray(labels)
    first, second = coordinate_halves(40, np.random.default_rng(params.seed))
    halves = (one_task[:, first], one_task[:, second], "coordinate halves")
    assert len(set(labels)) == 2 and oneshot.reproduced(oneshot.halves_agree(halves, 2, params), params)
    tested = group_test(one_task, labels, metric="cosine", linkage="average", max_clusters=10, draws=19, seed=0)
    assert not tested.passes
    for given in (None, halves):  # helper clients' coordinate halves, a stock chain's halves
        taken, reproduction, said, deferred = oneshot.gate(one_task, labels, given, params, "FedClust")
        assert deferred and len(np.unique(taken)) == 1 and reproduction.reproduces(params.reproduce_agreement)
        assert said.startswith("FedClust: cut deferred: coordinate halves agree (ARI 1.00), but " + tested.words()
                               + ": one task, each client's own data; one cluster until")
    groups = np.array(directions([0, 0, 0, 0, 1, 1, 1, 1], noise=0.3))
    taken = oneshot.gate(groups, np.array([0, 0, 0, 0, 1, 1, 1, 1]), None, params, "FedClust")
    assert not taken.deferred and "it beats group-free rotations of the updates" in taken.said
    # without independent halves, clusters whose mean changes point alike are one task's clients
    alike = groups + 3 * np.random.default_rng(1).normal(size=40)
    said = oneshot.gate(alike, np.array([0, 0, 0, 0, 1, 1, 1, 1]), None, params, "FedClust").said
    assert "but two of its clusters' mean changes point alike (cosine 0." in said
    assert not oneshot.gate(alike, np.array([0, 0, 0, 0, 1, 1, 1, 1]), ((alike, alike, "requests")), params,
                            "FedClust").deferred  # a chain's independent halves


def two_layer_chain(params, stock: list[str] = KEYS):
    """8 clients (``stock`` of them chained) on a model of two candidate layers: on ``a`` every
    request pushes them into two groups drawn afresh (well separated each time, never the same
    clients); on ``b`` the same two groups every request, less well separated. Returns
    (collect's result, the state)."""
    state = FedClust.State()
    names = {"a": ["a.weight"], "b": ["b.weight"]}
    start = {"a.weight": np.zeros((4, 10)), "b.weight": np.zeros((2, 10))}
    state.layer_choice = LayerChoice(rule="auto", keys=["a.weight", "b.weight"], candidates=names)
    asks = [Ask(key, dict(start), {"phase": "cluster"}) for key in KEYS]
    gen = oneshot.collect(asks, start, state, params, stock=set(stock), local_epochs=1, strategy="FedClust")
    sent, request = gen.send(None), 1
    try:
        while True:
            fresh = directions(list(np.random.default_rng(request).permutation([0, 1] * 4)), scale=3.0, noise=0.1,
                               seed=request)
            kept = directions([0, 0, 0, 0, 1, 1, 1, 1], scale=1.0, noise=0.3, seed=100 + request)
            out = Replies([TrainReply(a.key, 0, {"a.weight": a.model["a.weight"] + fresh[int(a.key)].reshape(4, 10),
                                                 "b.weight": a.model["b.weight"] + kept[int(a.key)][:20].reshape(2, 10)},
                                      {}, 10, 1.0, {}) for a in sent], bytes_up=0)
            sent, request = gen.send(out), request + 1
    except StopIteration as stop:
        return stop.value, state


def test_the_layer_choice_passes_over_a_better_separated_layer_whose_cut_does_not_reproduce():
    """A layer whose clients fall into two groups drawn afresh at each request separates them
    best in every single request, but the chain's two halves cut it differently: the choice
    takes the layer whose groups reproduce (and beat group-free rotations), the gate takes its
    cut, and the round line names the layer passed over (without the test, a's margin wins).
    The paper's single cut (reproduce off) asks no such test."""
    params = FedClust.Params(seed=0)
    (keys, X, _, diagnostics, halves), state = two_layer_chain(params)
    scores = {s["layer"]: s for s in state.layer_choice.scores}
    assert scores["a"]["silhouette"] - scores["a"]["required"] > scores["b"]["silhouette"] - scores["b"]["required"]
    assert scores["a"]["taken"] is False and scores["b"]["taken"] is True
    assert state.layer_choice.chosen == "b" and state.layer_choice.keys == ["b.weight"]
    labels, _ = oneshot.cut(X, params)
    taken = oneshot.gate(X, labels, halves, params, "FedClust", tests=state.layer_choice.chosen_among)
    assert not taken.deferred and compare(taken.labels, [0, 0, 0, 0, 1, 1, 1, 1], "truth").agreement == 1.0
    assert "(at the level of the largest of 39 rotations: the layer compared was chosen among 2)" in taken.said
    assert ("among the layers whose cut the clustering step would take (a separated more, but its cut would be "
            "deferred)") in diagnostics["decision"]
    assert "finer cut" not in diagnostics["decision"]  # b is no refinement of a: it was taken for a's deferral
    # two clients trained the epochs in one reply: the chain's halves (of the other 6) decide, on the layer chosen
    (keys, X, _, diagnostics, halves), state = two_layer_chain(params, stock=KEYS[:6])
    assert state.layer_choice.chosen == "b" and halves[0].shape == (6, 20) and X.shape == (8, 20)
    assert not oneshot.gate(X, oneshot.cut(X, params)[0], halves, params, "FedClust",
                            tests=state.layer_choice.chosen_among).deferred
    _, paper = two_layer_chain(FedClust.Params(seed=0, reproduce=False))
    assert paper.layer_choice.scores and all("taken" not in s for s in paper.layer_choice.scores)


def choose_among(layer_rows: dict[str, np.ndarray], eligible) -> LayerChoice:
    """``layer_choice.choose`` on one update per client and layer (``layer_rows``: layer ->
    clients × coordinates), as FedClust's defaults score them."""
    from clusterfed.strategies.layer_choice import choose

    params = FedClust.Params(seed=0)
    start = {f"{layer}.weight": np.zeros(rows.shape[1]) for layer, rows in layer_rows.items()}
    choice = LayerChoice(rule="auto", keys=list(start), candidates={layer: [f"{layer}.weight"] for layer in layer_rows})
    arrays = [{f"{layer}.weight": rows[i] for layer, rows in layer_rows.items()}
              for i in range(len(next(iter(layer_rows.values()))))]
    choose(choice, arrays, start, metric=params.distance, linkage=params.linkage,
           min_silhouette=params.auto_min_silhouette, reference_draws=params.auto_reference_draws, seed=0,
           eligible=eligible)
    return choice


def test_every_layer_is_asked_at_one_tests_level_shared_by_all_and_the_others_only_when_the_best_is_not_taken():
    """The layer the evidence alone picks was picked as the most structured of the 4: it is
    asked at the level of one test shared by all 4; only when its cut would not be taken are
    the other layers asked, each at that level."""
    truth = [0] * 5 + [1] * 5
    layer_rows = {name: np.array(directions(truth, scale=scale, noise=0.3, seed=i))
                  for i, (name, scale) in enumerate([("a", 3.0), ("b", 2.0), ("c", 1.5), ("d", 1.2)])}
    asked: list[tuple[str, int]] = []

    def eligible(takes: set[str]):
        def answer(names, X, labels, tests):
            asked.append((names[0].split(".")[0], tests))
            return names[0].split(".")[0] in takes
        return answer

    choice = choose_among(layer_rows, eligible({"a", "c"}))
    assert asked == [("a", 4)] and choice.chosen == "a" and choice.chosen_among == 4
    assert [s.get("taken") for s in choice.scores] == [True, None, None, None]
    asked.clear()
    choice = choose_among(layer_rows, eligible({"c", "d"}))
    assert asked[0] == ("a", 4) and sorted(asked[1:]) == [("b", 4), ("c", 4), ("d", 4)]
    assert choice.chosen == "c" and {s["layer"]: s["taken"] for s in choice.scores} == {
        "a": False, "b": False, "c": True, "d": True}
    # a layer whose own cut finds no clusters was scored, and could have been picked, all the same
    asked.clear()
    choice = choose_among({**layer_rows, "e": np.random.default_rng(5).normal(size=(10, 40))}, eligible({"a"}))
    assert {s["layer"]: s["clusters"] for s in choice.scores}["e"] == 1
    assert asked == [("a", 5)] and choice.chosen_among == 5


def test_trying_several_layers_takes_a_group_free_cut_no_more_often_than_one_test_would(monkeypatch):
    """Six layers, each cut into two parts that reproduce in the chain's halves, and a group
    test that passes a cut by chance as an exact Monte Carlo test of its rotations does (one
    time in draws + 1). Every layer, the best one too (it was picked as the most structured of
    the six), shares one test's level (each beats 6 x 20 rotations): the choice takes some
    layer's cut about 1 time in 20 (the best asked alone at 1 in 20 and the others sharing
    another such level: about 2 times in 20; each asked alone: about 5 times in 20)."""
    from clusterfed.strategies.oneshot import ChainSpans, chain_eligible

    rng = np.random.default_rng(0)

    class ByChance:
        def __init__(self, draws: int):
            self.passes = rng.random() < 1 / (draws + 1)

        def words(self) -> str:
            return "by chance"

    monkeypatch.setattr(oneshot, "groups_tested", lambda X, labels, params, max_clusters=None, draws=None:
                        ByChance(params.auto_reference_draws if draws is None else draws))
    truth = [0] * 5 + [1] * 5
    layer_rows = {f"l{i}": np.array(directions(truth, scale=1.0 + i / 10, noise=0.3, seed=i)) for i in range(6)}
    spans = ChainSpans([], {}, lambda names: (layer_rows[names[0].split(".")[0]],) * 2 + ("chain halves",))
    eligible = chain_eligible(spans, FedClust.Params(seed=0))
    trials = 400
    taken = sum(any(s.get("taken") for s in choose_among(layer_rows, eligible).scores) for _ in range(trials))
    # 0.0575 here; the best layer asked alone: 0.110 on this seed (0.05 + 0.95 x (1 - 0.99^5) = 0.096 expected)
    assert taken / trials < 0.075


def test_a_layer_asked_among_others_beats_as_many_more_rotations_in_the_group_test(monkeypatch):
    """What the layer choice's answer passes down reaches the group test: one test's 19
    rotations for a cut asked alone, (19 + 1) x 5 - 1 = 99 for each of 5 layers sharing a level."""
    from clusterfed.strategies.oneshot import ChainSpans, chain_eligible, shared_draws

    assert (shared_draws(19, 1), shared_draws(19, 5), shared_draws(0, 5)) == (19, 99, 0)
    asked: list[int] = []
    monkeypatch.setattr(oneshot, "group_test", lambda X, labels, **kw: asked.append(kw["draws"]))
    X = np.array(directions([0] * 5 + [1] * 5, noise=0.3))
    spans = ChainSpans([], {}, lambda names: (X, X, "chain halves"))
    eligible = chain_eligible(spans, FedClust.Params(seed=0))
    labels = np.array([0] * 5 + [1] * 5)
    eligible(["w"], X, labels)
    eligible(["w"], X, labels, 5)
    assert asked == [19, 99]


@pytest.mark.parametrize("strategy, step_round", [(FedClust, 1), (AdaCFL, 2)])
def test_the_clustering_steps_cut_of_the_layer_chosen_among_several_beats_as_many_more_rotations(
        monkeypatch, strategy, step_round):
    """FedClust (round 1) and AdaCFL (round 2, after its warm-up) score the 3 candidate layers
    of a model and compare the most structured: its cut, as the layer choice asked it and as
    the clustering step takes it, is one test of 3 and beats (19 + 1) x 3 - 1 = 59 group-free
    rotations, not one test's 19; the round line says so."""
    from harness import drive_round, make

    asked: list[int] = []
    real = oneshot.group_test

    def recording(X, labels, **kw):
        asked.append(kw["draws"])
        return real(X, labels, **kw)

    monkeypatch.setattr(oneshot, "group_test", recording)
    groups = {str(i): i % 2 for i in range(8)}
    algorithm = make(strategy, groups)
    rng = np.random.default_rng(0)

    def respond(ask):
        sign = np.float32(0.5 if groups[ask.key] else -0.5)
        return {n: ask.model[n] + sign * np.sign(np.arange(ask.model[n].size) % 2 - 0.5).reshape(ask.model[n].shape)
                .astype(np.float32) + rng.normal(0, 0.05, ask.model[n].shape).astype(np.float32)
                for n in (ask.upload or list(ask.model))}

    for server_round in range(1, step_round):
        drive_round(algorithm, server_round, respond)
    asked.clear()
    batches = drive_round(algorithm, step_round, respond)
    choice = algorithm.state.layer_choice
    assert choice.chosen_among == len(choice.scores) == 3
    # the layer choice's ask of the chosen layer, then the clustering step's gate (a revisit of
    # each cluster on its members' training updates may follow, on one test's 19)
    assert asked[:2] == [59, 59]
    assert "(at the level of the largest of 59 rotations: the layer compared was chosen among 3)" in batches.diagnostics["decision"]
    assert len(set(algorithm.state.assignment.values())) == 2  # two clear groups still pass it


def _rounds_with_groups_from(algorithm, groups: dict[str, int], first_with_groups: int, rounds: int,
                             lost: tuple[str, int] | None = None, first_round: int = 1) -> list:
    """Drive ``algorithm`` for ``rounds`` rounds; its clients' updates are noise (one task) before
    round ``first_with_groups`` and point by group from it on; ``lost``: (client, round) whose
    clustering-phase reply that round is lost; ``first_round``: the first round's number. Returns
    each round's batches."""
    from harness import drive_round

    rng = np.random.default_rng(0)
    now = {"round": 0}

    def respond(ask):
        if lost == (ask.key, now["round"]) and ask.config.get("phase") == "cluster":
            return None
        out = {}
        for n in ask.upload or list(ask.model):
            step = rng.normal(0, 0.05, ask.model[n].shape).astype(np.float32)
            if now["round"] >= first_with_groups:
                pattern = np.sign(np.arange(ask.model[n].size) % 2 - 0.5).reshape(ask.model[n].shape)
                step += np.float32(0.5 if groups[ask.key] else -0.5) * pattern.astype(np.float32)
            out[n] = ask.model[n] + step
        return out

    done = []
    for server_round in range(first_round, first_round + rounds):
        now["round"] = server_round
        done.append(drive_round(algorithm, server_round, respond))
    return done


@pytest.mark.parametrize("cls", [FedClust, AdaCFL], ids=lambda cls: cls.__name__)
def test_a_clustering_step_that_found_one_cluster_runs_again_on_the_trained_model(cls):
    """retry-after: the step found one cluster on updates that show no groups; retry-after rounds
    later every active client trains the one cluster's model again, the groups now show in their
    updates, and the clusters found start from that model; the round line says so. Where the
    second run finds nothing, the first step's record stays and the reason names both; at 0
    (the papers' presets too) the step is never run again. FedClust's step is round 1's, AdaCFL's
    round 2's after its one warm-up round."""
    from harness import make

    step = 1 if cls is FedClust else 2
    again = step + 3
    name = cls.__name__
    groups = {str(i): i % 2 for i in range(8)}
    algorithm = make(cls, groups, retry_after=3, revisit=False)
    batches = _rounds_with_groups_from(algorithm, groups, first_with_groups=step + 1, rounds=again)
    sizes = [1] * again
    sizes[step - 1] = sizes[again - 1] = 2  # the step and the step again, each before training
    assert [len(b) for b in batches] == sizes
    line = batches[again - 1].diagnostics["decision"]
    assert line.startswith(f"{name}: clustering step retried on round {again}'s model (8 clients): 2 clusters; "
                           "cut reproduced")
    assigned = algorithm.state.assignment
    assert compare(np.array([assigned[k] for k in groups]), np.array(list(groups.values())), "").agreement == 1.0
    assert algorithm.state.clustering_state["clustering_round"] == again
    assert algorithm.state.clustering_state["retried_from"] == step
    assert f"run again on round {again}'s model" in algorithm.cluster_count_basis()

    quiet = make(cls, groups, retry_after=3, revisit=False)
    batches = _rounds_with_groups_from(quiet, groups, first_with_groups=99, rounds=again + 2)
    assert [len(b) for b in batches] == sizes + [1, 1]  # once only
    assert batches[again - 1].diagnostics["decision"].startswith(
        f"{name}: clustering step retried on round {again}'s model (8 clients): ")
    assert batches[again - 1].diagnostics["decision"].endswith("one cluster kept")
    assert len(set(quiet.state.assignment.values())) == 1
    assert quiet.state.clustering_state["clustering_round"] == step
    assert f"run again on round {again}'s model (8 clients)" in quiet.one_cluster_reason()

    never = make(cls, groups, retry_after=0, revisit=False)
    sizes[again - 1] = 1
    assert [len(b) for b in _rounds_with_groups_from(never, groups, first_with_groups=step + 1, rounds=again)] == sizes
    assert cls.PAPER["retry_after"] == 0
    assert cls.Params().retry_after == (4 if cls is FedClust else 0)  # AdaCFL's step already sees a trained model


@pytest.mark.parametrize("cls", [FedClust, AdaCFL], ids=lambda cls: cls.__name__)
def test_a_client_whose_reply_to_the_step_run_again_is_lost_leaves_the_replaced_cluster(cls):
    """The one cluster's model is gone once the step run again forms clusters: a member whose
    reply was lost is no longer assigned to it, and is placed by the newcomer rule when next
    asked, in its group's cluster."""
    from harness import make

    step = 1 if cls is FedClust else 2
    again = step + 3
    groups = {str(i): i % 2 for i in range(10)}
    algorithm = make(cls, groups, retry_after=3, revisit=False)
    _rounds_with_groups_from(algorithm, groups, first_with_groups=step + 1, rounds=again, lost=("3", again))
    assert "3" not in algorithm.state.assignment
    assert set(algorithm.state.assignment.values()) <= set(algorithm.state.models)
    _rounds_with_groups_from(algorithm, groups, first_with_groups=0, rounds=1, first_round=again + 1)
    placed = algorithm.state.assignment
    assert placed["3"] == placed["1"] != placed["0"]
