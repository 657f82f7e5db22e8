"""Adaptive cluster-count client selection: the p controller on a scripted loss sequence,
the algorithm fed replies by hand, and a whole in-process run on digits."""

import json

import numpy as np
import pytest
from harness import drive_round, hand, make, round_of, trained

from clusterfed.clustering import ClusterCountController, loss_reduction_ratio
from clusterfed.strategies import strategy_class

# mean participant losses; ratios: -, .5, .4, .33, .5, .5 (good: > w = 0.1), then four bad
# rounds (the loss rises), then two good ones
LOSSES = [1.0, 0.5, 0.3, 0.2, 0.1, 0.05, 0.06, 0.07, 0.08, 0.09, 0.045, 0.02]


def _replay(stabilizer, seed):
    ratios = [None] + [loss_reduction_ratio(a, b) for a, b in zip(LOSSES, LOSSES[1:])]
    controller = ClusterCountController(8, 0.1, hold_rounds=1, stabilizer=stabilizer,
                                        rng=np.random.default_rng(seed), anneal_tau=10)
    ps = [controller.update(r, i + 1) for i, r in enumerate(ratios)]
    return ps, [s.action for s in controller.history]


def test_tcp_like_rule_with_hold_step_by_step():
    ps, actions = _replay("none", 0)
    # p 8 -1 -> 7 (d 2), held; -2 -> 5 (d 4), held; -4 -> 1, held; bad: 2p = 2, held;
    # bad: 4, held; good: 4 - 1 = 3 (d was reset to 1 by the bad rounds)
    assert ps == [8, 7, 7, 5, 5, 1, 1, 2, 2, 4, 4, 3]
    assert actions == ["no-signal", "decrease", "hold", "decrease", "hold", "decrease", "hold", "increase",
                       "hold", "increase", "hold", "decrease"]


def test_annealing_stabilizer_step_by_step_with_a_fixed_seed():
    # seed 0 draws 0.637, 0.270: round 8 keeps with 1 - e^-0.8 = 0.551 (0.637: no, p -> 2,
    # held in 9); round 10 keeps with 1 - e^-1 = 0.632 (0.270: kept at 2); round 11 good -> 1
    ps, actions = _replay("annealing", 0)
    assert ps == [8, 7, 7, 5, 5, 1, 1, 2, 2, 2, 1, 1]
    assert actions[7:10] == ["increase", "hold", "keep"]


def test_experience_stabilizer_step_by_step_with_a_fixed_seed():
    # seed 2 draws 0.262, 0.298. Round 8 at p = 1 (one earlier bad round there): keep with
    # (0 + 1) / (0 + 1 + 2) = 1/3 > 0.262: kept. Round 9 (two bad): 1/4 < 0.298: p -> 2,
    # held in 10; round 11 good -> 1, held in 12
    ps, actions = _replay("experience", 2)
    assert ps == [8, 7, 7, 5, 5, 1, 1, 1, 2, 2, 1, 1]
    assert actions[7:9] == ["keep", "increase"]


FOUR_GROUPS = {str(i): i // 2 for i in range(8)}


def _by_group_losses(losses):
    """Clients move their final layer by their group (so the groups are the clusters) and
    report the round's scripted training loss."""
    rng = np.random.default_rng(0)

    def respond(ask):
        group = FOUR_GROUPS[ask.key]
        out = trained(ask, 0.0)  # the final layer moves by 10 x its group (its change is clustered)
        out["fc2.bias"] = out["fc2.bias"] + np.float32(10.0 * group) + rng.normal(0, 0.01, 4).astype(np.float32)
        return out, {}, respond.loss

    respond.loss = losses
    return respond


@pytest.mark.parametrize("guard, last_p", [("none", 1), ("floor", 4)])  # paper: collapses to 1
@pytest.mark.parametrize("stabilizer", ["none", "annealing", "experience"])
def test_selection_trains_exactly_p_clients_after_warmup(stabilizer, guard, last_p):
    algorithm = make(strategy_class("selection"), FOUR_GROUPS, warmup_rounds=2, w=0.1, hold_rounds=0,
                     stabilizer=stabilizer, guard=guard)
    respond = _by_group_losses(1.0)
    loss = 1.0
    for r in (1, 2):
        batches = drive_round(algorithm, r, respond)
        (asks,) = batches
        assert len(asks) == 8 and batches.diagnostics["p"] is None
    # the paper starts at one cluster per client; the floor starts at the four groups the
    # warm-up's clustering shows
    expected_p = 8 if guard == "none" else 4
    for r in range(3, 12):
        loss *= 0.5  # every round good: the rule's p falls to 1 and stays there
        respond.loss = loss
        batches = drive_round(algorithm, r, respond)
        (asks,), extra = batches, batches.diagnostics
        assert extra["p"] == expected_p == len(asks) == extra["trained_clients"]
        assert extra["representatives"] == [a.key for a in asks]
        assert extra["models_exchanged"] == 2 * len(asks)
        # the paper's p collapses to one client; the floor is the four groups the clustering shows
        assert extra["p_floor"] == (4 if guard == "floor" else 1)
        expected_p = extra["p_next"]
    assert expected_p == last_p == algorithm.state.controller.cut
    assert algorithm.state.controller.p == 1  # the rule itself runs as in the paper
    if guard == "floor":  # once at the floor, one representative of every group trains
        assert sorted(FOUR_GROUPS[a.key] for a in asks) == [0, 1, 2, 3]


@pytest.mark.parametrize("guard, cuts", [
    ("none", [8, 7, 5, 1, 2, 4, 8]),  # the paper: three good rounds collapse p to 1, bad ones double it
    ("floor", [4, 4, 4, 4, 4, 4, 4]),  # every cut keeps one representative of each of the 4 groups
])
def test_floor_holds_the_cut_at_the_groups_through_good_and_bad_rounds(guard, cuts):
    algorithm = make(strategy_class("selection"), FOUR_GROUPS, warmup_rounds=2, w=0.1, hold_rounds=0, guard=guard)
    respond = _by_group_losses(1.0)
    for r in (1, 2):
        drive_round(algorithm, r, respond)
    used = []
    for r, loss in enumerate([0.5, 0.25, 0.125, 0.2, 0.3, 0.4, 0.5], start=3):  # 3 good rounds, then 4 bad
        respond.loss = loss
        batches = drive_round(algorithm, r, respond)
        (asks,), extra = batches, batches.diagnostics
        used.append(len(asks))
        assert extra["p"] == len(asks)
        if guard == "floor":
            assert sorted(FOUR_GROUPS[a.key] for a in asks) == [0, 1, 2, 3]
            assert extra["p_rule"] <= 4  # the rule only moves below the floor
    assert used == cuts


def test_floor_draws_from_the_warmup_groups_when_later_changes_lose_them():
    algorithm = make(strategy_class("selection"), FOUR_GROUPS, warmup_rounds=1, w=0.1, hold_rounds=0)
    respond = _by_group_losses(1.0)
    for r in (1, 2):  # the warm-up's changes show the 4 groups in two rounds in a row: settled
        drive_round(algorithm, r, respond)
    rng = np.random.default_rng(3)

    def blurred(ask):  # later changes pair groups 0 with 3 and 1 with 2: a re-cut would mix them
        out = trained(ask, 0.0)
        out["fc2.bias"] = out["fc2.bias"] + np.float32(10.0 * (FOUR_GROUPS[ask.key] in (1, 2))) + rng.normal(
            0, 0.01, 4).astype(np.float32)
        return out, {}, 1.0

    for r in range(3, 9):
        (asks,) = drive_round(algorithm, r, blurred)
        assert sorted(FOUR_GROUPS[a.key] for a in asks) == [0, 1, 2, 3]
    assert algorithm.state.floor == 4 and algorithm.state.groups == FOUR_GROUPS


def _two_then_four(ask):
    """Round 1 (by the algorithm's round counter in ``respond.round``) shows 2 groups, later rounds the 4."""
    out = trained(ask, 0.0)
    group = FOUR_GROUPS[ask.key]
    shown = group // 2 if _two_then_four.round == 1 else group
    out["fc2.bias"] = out["fc2.bias"] + np.float32(10.0 * shown) + _two_then_four.rng.normal(0, 0.01, 4).astype(
        np.float32)
    return out, {}, 1.0


def test_floor_warmup_goes_on_until_two_successive_cuts_agree_and_says_so():
    """A one-round warm-up whose cut (2 groups) the next round does not reproduce (4 groups)
    goes on: every client trains again, and the round line quotes the disagreement; once two
    rounds agree, one representative of each of the 4 groups trains."""
    algorithm = make(strategy_class("selection"), FOUR_GROUPS, warmup_rounds=1, w=0.1, hold_rounds=0)
    _two_then_four.rng = np.random.default_rng(0)
    said = []
    for r in (1, 2, 3, 4):
        _two_then_four.round = r
        batches = drive_round(algorithm, r, _two_then_four)
        said.append(batches.diagnostics.get("decision") or "")
        (asks,) = batches
        assert len(asks) == (8 if r <= 3 else 4)
    assert said[0].startswith("ClientSelection compares the clients' latest final-layer change")
    assert "warm-up goes on" in said[1] and "rounds 1 and 2 disagree" in said[1]
    assert "4 groups, one representative each from now on" in said[2] and "rounds 2 and 3 agree (ARI 1.00)" in said[2]
    assert algorithm.state.floor == 4 and [a["agreement"] for a in algorithm.state.warmup_agreement][1] == 1.0


def test_floor_warmup_that_never_reproduces_ends_at_warmup_max_and_says_so():
    algorithm = make(strategy_class("selection"), FOUR_GROUPS, warmup_rounds=1, warmup_max=3, w=0.1, hold_rounds=0)
    rng = np.random.default_rng(1)

    def shuffled(ask):  # a new random grouping every round: no cut reproduces
        out = trained(ask, 0.0)
        out["fc2.bias"] = out["fc2.bias"] + np.float32(10.0 * shuffled.groups[int(ask.key)])
        return out, {}, 1.0

    said = []
    for r in range(1, 6):
        shuffled.groups = rng.permutation([0, 0, 1, 1, 2, 2, 3, 3])
        batches = drive_round(algorithm, r, shuffled)
        said.append(batches.diagnostics.get("decision") or "")
        (asks,) = batches
        assert len(asks) == (8 if r <= 3 else algorithm.state.floor)
    assert "warm-up ends at warmup-max = 3 rounds" in said[2] and "not reproduced" in said[2]


def test_floor_keeps_every_client_when_too_few_to_cut():
    algorithm = make(strategy_class("selection"), {"0": 0, "1": 1}, warmup_rounds=1, w=0.1, hold_rounds=0)
    respond = _by_group_losses(1.0)
    respond.loss = 1.0
    drive_round(algorithm, 1, respond)
    for r in range(2, 6):
        respond.loss *= 0.5
        (asks,) = drive_round(algorithm, r, respond)
        assert len(asks) == 2


def test_floor_is_one_when_the_clients_show_no_groups():
    same = {str(i): 0 for i in range(8)}
    algorithm = make(strategy_class("selection"), same, warmup_rounds=1, w=0.1, hold_rounds=0)
    rng = np.random.default_rng(1)

    def respond(ask):  # every client's final layer moves alike, up to noise: no structure to keep
        out = trained(ask, 0.0)
        for name in ("fc2.weight", "fc2.bias"):
            out[name] = out[name] + np.float32(1.0) + rng.normal(0, 0.01, out[name].shape).astype(np.float32)
        return out, {}, respond.loss

    respond.loss = 1.0
    drive_round(algorithm, 1, respond)
    for r in range(2, 8):
        respond.loss *= 0.5
        assert drive_round(algorithm, r, respond).diagnostics["p_floor"] == 1
    assert algorithm.state.controller.cut == 1


def test_representatives_come_one_from_each_cluster_of_latest_models():
    algorithm = make(strategy_class("selection"), FOUR_GROUPS, warmup_rounds=1, w=0.1, hold_rounds=0)
    respond = _by_group_losses(1.0)
    drive_round(algorithm, 1, respond)
    algorithm.count_controller(len(hand(algorithm).active)).p = 4
    for r in range(2, 6):
        respond.loss = 1.0  # r = 0 <= w: p doubles back, so pin it again
        algorithm.state.controller.p = 4
        (asks,) = drive_round(algorithm, r, respond)
        assert sorted(FOUR_GROUPS[a.key] for a in asks) == [0, 1, 2, 3]


def test_global_model_is_the_weighted_average_of_the_representatives():
    algorithm = make(strategy_class("selection"), FOUR_GROUPS, warmup_rounds=1, guard="none")
    drive_round(algorithm, 1, _by_group_losses(1.0))
    algorithm.count_controller(len(hand(algorithm).active)).p = 2
    shifts = {k: float(k) for k in FOUR_GROUPS}
    examples = {k: 10 * (int(k) + 1) for k in FOUR_GROUPS}
    before = {n: v.copy() for n, v in algorithm.models[0].items()}
    (asks,) = drive_round(algorithm, 2, lambda ask: trained(ask, shifts[ask.key]), examples)
    keys = [a.key for a in asks]
    expected = sum(shifts[k] * examples[k] for k in keys) / sum(examples[k] for k in keys)
    np.testing.assert_allclose(algorithm.models[0]["fc1.weight"], before["fc1.weight"] + expected, rtol=1e-5)


def test_floor_weighs_each_representative_by_its_groups_samples():
    # groups of unequal size: the paper's weights (the representatives' own samples) would
    # change every round with the draw; the floor's are the groups' totals, as FedAvg's
    # (group-step = fresh, the default: the representative's change alone; latest is below)
    examples = {k: 10 * (int(k) + 1) for k in FOUR_GROUPS}
    algorithm = make(strategy_class("selection"), FOUR_GROUPS, warmup_rounds=1)
    respond = _by_group_losses(1.0)
    for r in (1, 2):  # two warm-up rounds agree on the groups
        drive_round(algorithm, r, respond, examples)
    shifts = {k: float(k) for k in FOUR_GROUPS}
    group_samples = {g: sum(n for k, n in examples.items() if FOUR_GROUPS[k] == g) for g in range(4)}
    for r in (3, 4):
        before = {n: v.copy() for n, v in algorithm.models[0].items()}

        def moved(ask):
            out = respond(ask)[0]  # its group's final-layer change, so the cut stays the groups
            out["fc1.weight"] = before["fc1.weight"] + np.float32(shifts[ask.key])
            return out

        (asks,) = drive_round(algorithm, r, moved, examples)
        keys = [a.key for a in asks]
        assert sorted(FOUR_GROUPS[k] for k in keys) == [0, 1, 2, 3]
        weights = [group_samples[FOUR_GROUPS[k]] for k in keys]
        expected = sum(shifts[k] * w for k, w in zip(keys, weights)) / sum(weights)
        np.testing.assert_allclose(algorithm.models[0]["fc1.weight"], before["fc1.weight"] + expected, rtol=1e-5)


# ----------------------------------------------------------- a whole run (digits)
def _rounds(out_dir):
    return [json.loads(line) for line in open(f"{out_dir}/rounds.jsonl")]


@pytest.mark.end_to_end
def test_selection_run_records_p_trains_p_clients_and_ignores_evaluation(small_config, tmp_path):
    from clusterfed.plots.run import plot_run
    from clusterfed.simulation import simulate

    values = dict(strategy="selection", partitioner="label-groups", label_groups="0,1;2,3;4,5;6,7", num_clients=8,
                  rounds=6, warmup_rounds=2, warmup_max=3, w=0.05, hold_rounds=0, seed=3)
    quiet = small_config(**values, fraction_evaluate=0.0, out_dir=str(tmp_path / "quiet"))
    loud = small_config(**values, fraction_evaluate=1.0, out_dir=str(tmp_path / "loud"))
    for config in (quiet, loud):
        simulate(config, engine="inprocess", stream=None)
    rounds = _rounds(loud.out_dir)
    assert [r["trained_clients"] for r in rounds[:2]] == [8, 8]
    # the warm-up goes on until two rounds' cuts agree, round 3 at the most (warmup-max)
    assert all(r["warmup"] and r["trained_clients"] == 8 and r["p"] is None for r in rounds if r["round"] <= 2)
    for r in rounds[2:]:
        if r["warmup"]:
            assert r["round"] <= 3 and r["trained_clients"] == 8 and r["p"] is None
            continue
        assert r["trained_clients"] == r["p"] == r["transmissions"] == len(r["representatives"])
    # the evaluation (test data) never reaches p nor the representatives
    pick = lambda rs: [(r["p"], r["representatives"], r["p_next"] if "p_next" in r else None) for r in rs]  # noqa: E731
    assert pick(_rounds(quiet.out_dir)) == pick(rounds)
    written = plot_run(loud.out_dir)
    assert (tmp_path / "loud" / "cluster_count.png") in written
    assert (tmp_path / "loud" / "cluster_count.png").stat().st_size > 0


def test_floor_places_a_later_client_in_the_nearest_warmup_group():
    algorithm = make(strategy_class("selection"), FOUR_GROUPS, warmup_rounds=1)
    drive_round(algorithm, 1, _by_group_losses(1.0))
    algorithm.state.latest["late"] = algorithm.state.group_refs[2] + 0.1  # a change like group 2's
    assert algorithm.group_of("late") == 2 == algorithm.state.groups["late"]


LATEST = {"selection.warmup-rounds": 1, "selection.group-step": "latest", "selection.draw": "oldest"}


def test_floor_steps_each_group_by_the_mean_of_its_members_latest_changes():
    """group-step = latest, draw = oldest (opt-in): one representative per group trains,
    members in turn, and each group's step is the sample-weighted mean of its members' latest
    changes — the representative's fresh one, the other member's kept from the round it last
    trained — so the global model does not swing with whichever member was drawn. Four
    rounds after the warm-up every member trained twice; the kept change of a member is the
    one it sent, applied to the current model."""
    examples = {k: 10 * (int(k) + 1) for k in FOUR_GROUPS}
    algorithm = make(strategy_class("selection"), FOUR_GROUPS, **LATEST)
    assert (algorithm.params.group_step, algorithm.params.draw) == ("latest", "oldest")
    respond = _by_group_losses(1.0)
    for r in (1, 2):  # two warm-up rounds agree on the groups
        drive_round(algorithm, r, respond, examples)
    total = sum(examples.values())
    last: dict[str, float] = {k: 0.0 for k in FOUR_GROUPS}  # fc1's change each client sent last (warm-up: 0)
    drawn = []
    for r in range(3, 7):
        before = {n: v.copy() for n, v in algorithm.models[0].items()}
        shift = {k: float(k) + r / 10 for k in FOUR_GROUPS}

        def moved(ask):
            out = respond(ask)[0]
            out["fc1.weight"] = before["fc1.weight"] + np.float32(shift[ask.key])
            return out

        batches = drive_round(algorithm, r, moved, examples)
        keys = [a.key for a in batches[0]]
        assert sorted(FOUR_GROUPS[k] for k in keys) == [0, 1, 2, 3]
        for k in keys:
            last[k] = shift[k]
        expected = sum(examples[k] * last[k] for k in FOUR_GROUPS) / total  # every member, FedAvg's weights
        np.testing.assert_allclose(algorithm.models[0]["fc1.weight"], before["fc1.weight"] + expected, rtol=1e-5)
        assert batches.diagnostics["kept_changes"] == 4
        drawn.append(set(keys))
    # members in turn: rounds 3 and 4 draw the two members of each group once each, and again
    assert drawn[0] | drawn[1] == set(FOUR_GROUPS) == drawn[2] | drawn[3] and drawn[0] == drawn[2]


def test_floor_leaves_out_the_kept_change_of_a_member_that_stopped_replying():
    """A kept change older than twice its group's size in rounds (here 4) no longer steps the
    global model: a member gone for good does not pull it forever."""
    algorithm = make(strategy_class("selection"), FOUR_GROUPS, **LATEST)
    respond = _by_group_losses(1.0)
    for r in (1, 2):
        drive_round(algorithm, r, respond)
    gone = "0"
    group = [k for k, g in FOUR_GROUPS.items() if g == FOUR_GROUPS[gone]]
    kept = []
    for r in range(3, 10):
        batches = drive_round(algorithm, round_of(algorithm, r, active=[k for k in FOUR_GROUPS if k != gone]),
                              respond)
        assert gone not in [a.key for a in batches[0]]
        kept.append(batches.diagnostics["kept_changes"])
    assert algorithm.state.trained_round[gone] == 2 and len(group) == 2
    assert kept[-1] == 3  # the three other groups' other members; not the one gone since round 2


def test_paper_preset_and_defaults_step_by_the_representatives_alone():
    import clusterfed
    for strategy in (clusterfed.ClientSelection.paper(), clusterfed.ClientSelection()):
        params = strategy.params
        assert (params.group_step, params.draw, params.budget) == ("fresh", "random", 0.0)
        assert not strategy.keeps_updates()


def test_kept_changes_go_through_a_checkpoint_and_an_older_one_resumes_without_them():
    from test_state_codec import round_trip

    algorithm = make(strategy_class("selection"), FOUR_GROUPS, **LATEST)
    respond = _by_group_losses(1.0)
    for r in (1, 2, 3):
        drive_round(algorithm, r, respond)
    saved, _ = round_trip(algorithm.get_state())
    assert set(saved["updates"]) == set(FOUR_GROUPS) and saved["trained_round"]["0"] >= 2
    resumed = make(strategy_class("selection"), FOUR_GROUPS, **LATEST)
    resumed.set_state(saved)
    older = make(strategy_class("selection"), FOUR_GROUPS, **LATEST)
    older.set_state({k: v for k, v in saved.items() if k not in ("updates", "trained_round")})
    assert older.state.updates == {} and older.state.trained_round == {}
    for strategy in (algorithm, resumed, older):
        drive_round(strategy, 4, respond)
    np.testing.assert_array_equal(resumed.models[0]["fc1.weight"], algorithm.models[0]["fc1.weight"])
    assert older.state.trained_round  # the older one goes on, keeping changes from now on


def test_floor_spends_the_spare_budget_on_full_rounds_and_stays_within_it():
    """budget: after the warm-up, a round in which every client's reply still keeps the models
    exchanged within ``budget`` of FedAvg's is a full round (every client trains, each by its
    own samples, as in the warm-up); the others draw one representative per group. A full
    round never takes the share above the budget; budget = 0 draws representatives only."""
    respond = _by_group_losses(1.0)
    for budget in (0.6, 0.0):
        algorithm = make(strategy_class("selection"), FOUR_GROUPS, **{"selection.warmup-rounds": 1,
                                                                       "selection.budget": budget})
        full, sizes = [], []
        for r in range(1, 31):
            extra = drive_round(algorithm, r, respond).diagnostics
            sizes.append(extra["trained_clients"])
            if extra.get("full_round"):
                full.append(r)
                assert extra["trained_clients"] == 8 and extra["representatives"] == []
                assert algorithm.state.transmissions <= budget * algorithm.state.fedavg_models  # within, with it
        if budget:
            assert full and all(r > 2 for r in full) and set(sizes) == {8, 4}
            assert sum(sizes) / (8 * 30) <= budget
        else:
            assert not full and sizes[2:] == [4] * 28
