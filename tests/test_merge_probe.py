"""The merge probe (``merge_probe.py``): a part a revisit split off a cluster of two tasks trains
from a model of the mixture and points apart from the cluster of its own task; on that
cluster's model the two are compared as the revisits' merges compare, and joined."""

from __future__ import annotations

import numpy as np

from clusterfed import AdaCFL, FedClust
from clusterfed.core.exchange import Round, TrainReply
from clusterfed.strategies import merge_probe, revisit
from clusterfed.strategies.layer_choice import LayerChoice

KEYS = [str(i) for i in range(12)]
CENTRES = np.random.default_rng(99).normal(size=(3, 40))
TASK_A, TASK_B, ELSEWHERE = CENTRES
# a model of both tasks, off towards a third direction: a cluster trained on both
MIXTURE = 0.5 * TASK_A + 0.5 * TASK_B + ELSEWHERE


class Federation:
    """FedClust (or ``strategy``) with hand-made clusters; each client's update moves the model
    it was sent half-way to its task's optimum (``tasks``), with a little noise. The models do
    not train: the probe's rounds are the subject."""

    def __init__(self, assignment: dict[str, int], models: dict[int, np.ndarray], tasks: dict[str, np.ndarray],
                 strategy=FedClust):
        self.strategy = strategy(seed=0)
        state = self.strategy.state
        state.theta0 = {"w": np.zeros(40)}
        state.clustered = True
        state.layer_choice = LayerChoice(rule="w", keys=["w"], decided=True)
        state.next_cluster_id = max(assignment.values()) + 1
        state.models = {c: {"w": m.copy()} for c, m in models.items()}
        state.assignment = dict(assignment)
        self.tasks = tasks
        self.asked: dict[int, dict[str, np.ndarray]] = {}

    def round(self, number: int, trainers: list[str] | None = None, failing: set[str] = frozenset()) -> str:
        """Round ``number``, ``trainers`` sampled (default: every client), the replies of
        ``failing`` lost in the first exchange; ``asked[number]`` records each exchange's models
        by client."""
        rnd = Round(number, list(KEYS))
        steps = self.strategy.train(rnd, list(KEYS) if trainers is None else trainers)
        rng = np.random.default_rng(number)
        self.asked[number] = []
        asks = next(steps)
        while True:
            self.asked[number].append({ask.key: ask.model["w"] for ask in asks})
            replies = [TrainReply(ask.key, int(ask.config["cluster-id"]),
                                  {"w": ask.model["w"] + 0.5 * (self.tasks[ask.key] - ask.model["w"])
                                   + 0.05 * rng.normal(size=40)}, {"w": ask.model["w"]}, 10, 1.0, {})
                       for ask in asks if not (ask.key in failing and not self.asked[number][:-1])]
            try:
                asks = steps.send(replies)
            except StopIteration as done:
                replies, _ = done.value
                break
        self.averaged = [r.key for r in replies if r.key not in rnd.evidence_only]
        return (self.strategy.after_train(rnd, replies) or {}).get("decision", "")

    def clusters(self) -> list[list[str]]:
        found: dict[int, list[str]] = {}
        for key, cluster in self.strategy.state.assignment.items():
            found.setdefault(cluster, []).append(key)
        return sorted(found.values())


def impure_federation(strategy=FedClust) -> Federation:
    """Clients 0–7 of task A, 8–11 of task B; cluster 0 holds 0–3, cluster 1 the rest (a
    clustering step's impure cut) on a model of the mixture."""
    tasks = {k: TASK_A if int(k) < 8 else TASK_B for k in KEYS}
    assignment = {k: 0 if int(k) < 4 else 1 for k in KEYS}
    return Federation(assignment, {0: np.zeros(40), 1: MIXTURE}, tasks, strategy)


def test_a_part_split_off_an_impure_cluster_joins_its_tasks_cluster_on_that_clusters_model():
    run = impure_federation()
    assert "split" not in run.round(1)
    said = run.round(2)
    assert "cluster 1 (8 clients) split into clusters 2 (4 clients), 3 (4 clients)" in said
    state = run.strategy.state
    # the part of task A points apart from cluster 0 on its own model: only the probe can join them
    assert state.merge_probes == {2: {"host": 0, "queued": 2, "cosine": state.merge_probes[2]["cosine"]}}
    assert 0 < state.merge_probes[2]["cosine"] < 0.6 and 3 not in state.merge_probes
    own_model = state.models[2]["w"].copy()
    said = run.round(3)
    own, probe = run.asked[3]
    # the guests train their own model (averaged as in any round), then cluster 0's (compared only)
    assert all(np.array_equal(own[k], own_model) for k in "4567") and run.averaged == KEYS
    assert sorted(probe, key=int) == ["4", "5", "6", "7"]
    assert all(np.array_equal(probe[k], state.models[0]["w"]) for k in "4567")
    assert said.startswith("FedClust: cluster 2's members trained cluster 0's model (a merge probe): nothing in their "
                           "training updates and cluster 0's members' sets the two apart, and they point alike "
                           "(mean-update cosine ") and said.endswith("in round 3; merged if alike again in the next probe round")
    before = state.models[0]["w"].copy()
    said = run.round(4)
    assert said.startswith("FedClust: cluster 2 (4 clients) merged into cluster 0: trained on cluster 0's model (a "
                           "merge probe), nothing in their members' training updates and cluster 0's sets the two "
                           "apart, and they point alike (mean-update cosine ") and said.endswith("in rounds 3 and 4")
    assert run.clusters() == [KEYS[:8], KEYS[8:]]
    assert np.array_equal(state.models[0]["w"], before) and 2 not in state.models  # the host's model kept
    assert state.merge_probes[2]["verdict"] == "merged" and state.revisits[-1]["probe"] is True
    assert "merged" in run.strategy.cluster_state()["merge_probes"]["2"]["verdict"]


def test_a_probe_that_finds_two_tasks_keeps_them_apart_and_is_not_run_again():
    tasks = {k: TASK_A if int(k) < 6 else TASK_B for k in KEYS}
    run = Federation({k: 0 if int(k) < 6 else 1 for k in KEYS}, {0: np.zeros(40), 1: np.zeros(40)}, tasks)
    run.strategy.state.merge_probes = {1: {"host": 0, "queued": 1, "cosine": 0.3}}
    said = run.round(2)
    assert said.startswith("FedClust: cluster 1 kept apart from cluster 0: trained on cluster 0's model (a merge "
                           "probe), its members' training updates and cluster 0's differ in round 2: ")
    assert run.strategy.state.merge_probes[1]["verdict"] == "apart" and run.clusters() == [KEYS[:6], KEYS[6:]]
    assert "merge probe" not in run.round(3) and len(run.asked[3]) == 1  # no second exchange again


def test_without_merge_probe_or_in_the_paper_preset_a_split_part_stays_on_its_own_model():
    run = impure_federation()
    run.strategy.params = run.strategy.params.model_copy(update={"merge_probe": False})
    for number in (1, 2, 3, 4):
        run.round(number)
    assert run.strategy.state.merge_probes == {} and len(run.clusters()) == 3
    assert FedClust.paper().params.merge_probe is False and AdaCFL.paper().params.merge_probe is False


def test_adacfl_probes_as_fedclust_does():
    run = impure_federation(AdaCFL)
    for number in (1, 2, 3, 4):
        said = run.round(number)
    assert said.startswith("AdaCFL: cluster 2 (4 clients) merged into cluster 0") and len(run.clusters()) == 2


def test_at_partial_participation_a_probe_asks_both_clusters_members_beyond_the_sample():
    tasks = {k: TASK_A if int(k) < 8 else TASK_B for k in KEYS}
    # clusters 0 (clients 0-3) and 2 (4-7) both of task A, cluster 1 (8-11) of task B
    run = Federation({k: 0 if int(k) < 4 else 2 if int(k) < 8 else 1 for k in KEYS},
                     {0: np.zeros(40), 1: np.zeros(40), 2: MIXTURE}, tasks)
    run.strategy.state.merge_probes = {2: {"host": 0, "queued": 1, "cosine": 0.4}}
    sample = ["0", "4", "8", "9"]  # one member of each probed cluster: too few to compare
    said = run.round(2, sample)
    own, probe = run.asked[2]
    assert sorted(own, key=int) == sample and run.averaged == sample  # the sample trains and is averaged
    # the second exchange: every guest, and the host's members beyond the sample, on cluster 0's model
    assert sorted(probe, key=int) == ["1", "2", "3", "4", "5", "6", "7"]
    assert all(np.array_equal(probe[k], run.strategy.state.models[0]["w"]) for k in probe)
    assert "FedClust: cluster 2's members trained cluster 0's model (a merge probe)" in said
    assert run.strategy.state.merge_probes[2]["rounds"][0]["round"] == 2
    said = run.round(3, ["1", "5", "10", "11"])
    assert "FedClust: cluster 2 (4 clients) merged into cluster 0" in said and len(run.clusters()) == 2


def held_federation(models: dict[int, np.ndarray], tasks: dict[str, np.ndarray]) -> Federation:
    """Clusters 0 (clients 0–5) and 1 (6–11) that the revisits hold apart: apart beyond
    group-free rotations in rounds 1 and 2 (set by hand)."""
    run = Federation({k: 0 if int(k) < 6 else 1 for k in KEYS}, models, tasks)
    run.strategy.state.revisit_apart = {"0-1": [1, 2]}
    return run


def test_one_task_held_apart_after_an_early_split_is_probed_on_one_model_and_joined():
    run = held_federation({0: np.zeros(40), 1: np.zeros(40)}, dict.fromkeys(KEYS, TASK_A))
    said = run.round(3)
    # alike on their own models, held apart before: queued, the smaller (here the later) the guest
    assert said.startswith("FedClust: clusters 0 and 1 point alike on their own models (mean-update cosine ")
    assert said.endswith("but were held apart before: cluster 1's members will train cluster 0's model too (a merge "
                         "probe), which tells two tasks whose models converge from one task cut in two")
    assert run.strategy.state.merge_probes[1]["host"] == 0 and run.strategy.state.merge_probes[1]["held"] is True
    said = run.round(4)
    assert "FedClust: cluster 1's members trained cluster 0's model (a merge probe)" in said
    said = run.round(5)
    assert "FedClust: cluster 1 (6 clients) merged into cluster 0: trained on cluster 0's model" in said
    assert run.clusters() == [KEYS]


def test_while_a_held_pair_is_probed_the_merge_test_does_not_call_it_two_tasks():
    state = FedClust(seed=0).state
    state.models = {0: {}, 1: {}}
    state.revisit_apart, state.revisit_alike = {"0-1": [1, 2]}, {"0-1": 3}
    state.merge_probes = {1: {"host": 0, "queued": 3, "cosine": 0.9}}
    rng = np.random.default_rng(0)
    rows = {c: TASK_A + 0.05 * rng.normal(size=(6, 40)) for c in (0, 1)}
    said = revisit._merges(state, FedClust(seed=0).params, 4, rows, "FedClust")
    assert said == [said[0]] and said[0].startswith("FedClust: clusters 0 and 1 not merged: ")
    assert said[0].endswith("but were apart beyond group-free rotations in rounds 1 and 2: left to a merge probe, "
                            "which compares them on one model")
    # once a probe found them apart (here an earlier one), or without merge-probe: two tasks
    state.merge_probes[1] = {"host": 5, "queued": 4, "cosine": 0.9, "verdict": "apart",
                             "earlier": [{"host": 0, "queued": 3, "cosine": 0.9, "verdict": "apart"}]}
    said = revisit._merges(state, FedClust(seed=0).params, 5, rows, "FedClust")
    assert said[0].endswith("in rounds 1 and 2: two tasks whose models converge")
    state.merge_probes = {}
    said = revisit._merges(state, FedClust(seed=0, merge_probe=False).params, 6, rows, "FedClust")
    assert said[0].endswith("in rounds 1 and 2: two tasks whose models converge")


def test_two_tasks_held_apart_whose_models_converge_stay_apart_on_one_model_and_are_not_probed_again():
    # each cluster's model short of its task's optimum by the same step: alike on their own models
    step = 0.5 * ELSEWHERE
    run = held_federation({0: TASK_A - step, 1: TASK_B - step}, {k: TASK_A if int(k) < 6 else TASK_B for k in KEYS})
    assert "(a merge probe)" in run.round(3)
    said = run.round(4)
    assert "FedClust: cluster 1 kept apart from cluster 0: trained on cluster 0's model (a merge probe)" in said
    said = run.round(5)
    assert said.endswith("two tasks whose models converge") and "merge probe" not in said
    assert len(run.asked[5]) == 1 and run.clusters() == [KEYS[:6], KEYS[6:]]


def test_a_guest_whose_probe_ended_is_probed_again_with_a_cluster_it_is_held_apart_from():
    run = held_federation({0: np.zeros(40), 1: np.zeros(40)}, dict.fromkeys(KEYS, TASK_A))
    first = {"host": 6, "queued": 1, "cosine": 0.2, "verdict": "apart"}
    ended = {"host": 5, "queued": 2, "cosine": 0.3, "verdict": "apart"}
    run.strategy.state.merge_probes = {1: {**ended, "earlier": [dict(first)]}}
    run.round(3)
    # the earlier probes kept, oldest first, in one flat list
    assert run.strategy.state.merge_probes[1]["host"] == 0
    assert run.strategy.state.merge_probes[1]["earlier"] == [first, ended]


def test_a_held_pair_whose_smaller_cluster_is_in_another_probe_waits_and_without_merge_probe_is_not_queued():
    # clusters 0 (clients 0-5) and 1 (6-9) held apart; 1, the smaller, is also probed on cluster 2's (10, 11) model
    run = Federation({k: 0 if int(k) < 6 else 1 if int(k) < 10 else 2 for k in KEYS},
                     {0: np.zeros(40), 1: np.zeros(40), 2: np.zeros(40)}, dict.fromkeys(KEYS, TASK_A))
    run.strategy.state.revisit_apart = {"0-1": [1, 2]}
    run.strategy.state.merge_probes = {1: {"host": 2, "queued": 2, "cosine": 0.5}}
    said = run.round(3)
    assert "cluster 1's members trained cluster 2's model (a merge probe)" in said and "held apart before" not in said
    # alike this round, but cluster 1 is busy: the larger cluster is not made the guest instead
    assert run.strategy.state.revisit_alike["0-1"] == 3 and list(run.strategy.state.merge_probes) == [1]
    run = held_federation({0: np.zeros(40), 1: np.zeros(40)}, dict.fromkeys(KEYS, TASK_A))
    run.strategy.params = run.strategy.params.model_copy(update={"merge_probe": False})
    assert "merge probe" not in run.round(3) and run.strategy.state.merge_probes == {}


def test_a_sampled_host_member_whose_training_failed_is_replaced_in_the_probe_exchange():
    tasks = {k: TASK_A if int(k) < 11 else TASK_B for k in KEYS}
    # cluster 0 (clients 0-8, judged on 8 of them), the guests (9, 10), cluster 1 (11)
    run = Federation({k: 0 if int(k) < 9 else 2 if int(k) < 11 else 1 for k in KEYS},
                     {0: np.zeros(40), 1: np.zeros(40), 2: MIXTURE}, tasks)
    run.strategy.state.merge_probes = {2: {"host": 0, "queued": 1, "cosine": 0.4}}
    run.round(2, [str(i) for i in range(8)], failing={"1"})
    _, probe = run.asked[2]
    # 8 of the host's members were sampled and 7 replied: client 8 makes the eighth, client 1 is not asked again
    assert sorted(probe, key=int) == ["8", "9", "10"]
    assert run.strategy.state.merge_probes[2]["rounds"][0]["round"] == 2
