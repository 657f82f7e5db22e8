import math

import numpy as np
import pytest

from clusterfed.clustering.cluster_count import ClusterCountController, loss_reduction_ratio

GOOD, BAD = 0.5, 0.0  # loss-reduction ratios above / below w = 0.01


class FixedDraw:
    """Stand-in for the rng: every draw returns the same value."""

    def __init__(self, value):
        self.value = value

    def random(self):
        return self.value


def run(ctl, ratios, start_round=1):
    return [ctl.update(r, start_round + i) for i, r in enumerate(ratios)]


def test_loss_reduction_ratio():
    assert loss_reduction_ratio(10.0, 8.0) == pytest.approx(0.2)
    assert loss_reduction_ratio(2.0, 3.0) == pytest.approx(-0.5)
    assert loss_reduction_ratio(None, 1.0) is None
    assert loss_reduction_ratio(1.0, float("nan")) is None
    assert loss_reduction_ratio(0.0, 0.0) == 0.0


def test_tcp_like_decrease_grows_exponentially_increase_doubles():
    ctl = ClusterCountController(m=8, w=0.01)
    assert ctl.p == 8
    # d = 1, 2, 4, 8: p 8 -> 7 -> 5 -> 1, then stays at the floor.
    assert run(ctl, [GOOD, GOOD, GOOD, GOOD]) == [7, 5, 1, 1]
    # A bad round doubles p and resets d; p never exceeds m.
    assert run(ctl, [BAD, BAD, BAD, BAD], start_round=5) == [2, 4, 8, 8]
    assert ctl.d == 1
    assert run(ctl, [GOOD, GOOD, BAD, GOOD], start_round=9) == [7, 5, 8, 7]
    assert [s.action for s in ctl.history[-4:]] == ["decrease", "decrease", "increase", "decrease"]


def test_ratio_equal_to_w_is_not_good():
    ctl = ClusterCountController(m=8, w=0.1)
    assert run(ctl, [GOOD, 0.1]) == [7, 8]


def test_no_signal_keeps_p():
    ctl = ClusterCountController(m=4, w=0.01)
    assert run(ctl, [None, GOOD, None, float("nan")]) == [4, 3, 3, 3]
    assert ctl.history[0].action == "no-signal"


def test_hold_rounds_after_a_change():
    ctl = ClusterCountController(m=8, w=0.01, hold_rounds=2)
    # Change to 7, held for 2 rounds whatever r says, then a bad round doubles (capped at 8).
    assert run(ctl, [GOOD, BAD, GOOD, BAD, GOOD, GOOD, GOOD]) == [7, 7, 7, 8, 8, 8, 7]
    assert [s.action for s in ctl.history] == ["decrease", "hold", "hold", "increase", "hold", "hold", "decrease"]
    # No change (p already at m) starts no hold.
    ctl = ClusterCountController(m=4, w=0.01, hold_rounds=3)
    assert run(ctl, [BAD, GOOD]) == [4, 3]


def test_annealing_keeps_p_late_and_not_early():
    ctl = ClusterCountController(m=8, w=0.01, stabilizer="annealing", rng=0, anneal_tau=10)
    assert ctl.annealing_keep_probability(0) == 0.0
    assert ctl.annealing_keep_probability(10) == pytest.approx(1 - math.exp(-1))
    run(ctl, [GOOD, GOOD])  # p = 5, d = 4
    assert ctl.update(BAD, 0) == 8  # round 0: keep probability 0 -> TCP rule
    run(ctl, [GOOD, GOOD], start_round=1)  # p = 7, 5
    assert ctl.update(BAD, 10_000) == 5  # late: kept
    assert ctl.history[-1].action == "keep" and ctl.d == 1  # the run of good rounds ended
    assert ctl.update(GOOD, 10_001) == 4  # good rounds still decrease


def test_annealing_keep_frequency_matches_probability():
    kept = 0
    trials = 2000
    rng = np.random.default_rng(1)
    for _ in range(trials):
        ctl = ClusterCountController(m=8, w=0.01, stabilizer="annealing", rng=rng, anneal_tau=50)
        ctl.update(GOOD, 1)
        kept += ctl.update(BAD, 50) == 7
    assert kept / trials == pytest.approx(1 - math.exp(-1), abs=0.04)


def test_experience_probability_from_earlier_rounds_at_this_p():
    ctl = ClusterCountController(m=2, w=0.01, stabilizer="experience")
    ctl.rng = FixedDraw(0.6)  # keep iff keep-probability > 0.6
    assert ctl.experience_keep_probability() == 0.5  # no experience: Laplace prior
    assert ctl.update(BAD, 1) == 2  # 0.5 < 0.6 -> double, capped at m
    assert ctl.update(GOOD, 2) == 1  # p=2 record: 1 good, 1 bad
    assert ctl.update(BAD, 3) == 2  # p=1 had no experience: 0.5 -> double
    assert ctl.update(GOOD, 4) == 1
    assert run(ctl, [GOOD, GOOD, GOOD], start_round=5) == [1, 1, 1]  # p=1: 3 good, 1 bad
    assert ctl.experience[1] == [3, 1]
    assert ctl.experience_keep_probability() == pytest.approx(4 / 6)
    assert ctl.update(BAD, 8) == 1  # 0.667 > 0.6 -> p kept
    assert ctl.history[-1].action == "keep"
    assert ctl.experience[1] == [3, 2]  # this round is counted after the decision
    assert ctl.update(BAD, 9) == 2  # now (3+1)/(5+2) = 0.571 < 0.6 -> double


def test_validation():
    with pytest.raises(ValueError):
        ClusterCountController(m=0, w=0.01)
    with pytest.raises(ValueError):
        ClusterCountController(m=4, w=0.01, stabilizer="sa")
    with pytest.raises(ValueError):
        ClusterCountController(m=4, w=0.01, hold_rounds=-1)


def test_floor_keeps_the_cut_at_the_clusters_while_the_rule_falls():
    # Every round good: the paper's p falls 8 -> 7 -> 5 -> 1 and stays there (the collapse:
    # one client trains the global model). With a floor of 4 the rule falls the same way but
    # the cut stops at 4; bad rounds double the rule's p (1 -> 2 -> 4 -> 8) and the cut only
    # grows once the rule's p has passed the floor.
    ratios = [GOOD] * 5 + [BAD] * 3
    paper = ClusterCountController(m=8, w=0.01)
    assert run(paper, ratios) == [7, 5, 1, 1, 1, 2, 4, 8]
    guarded = ClusterCountController(m=8, w=0.01)
    assert guarded.set_floor(4) == 8
    assert run(guarded, ratios) == [7, 5, 4, 4, 4, 4, 4, 8]
    assert [s.rule_p for s in guarded.history] == [7, 5, 1, 1, 1, 2, 4, 8]
    assert [s.action for s in guarded.history] == [s.action for s in paper.history]
    assert all(s.floor == 4 for s in guarded.history)


def test_floor_is_clipped_to_the_clients_and_follows_each_setting():
    ctl = ClusterCountController(m=4, w=0.01)
    assert run(ctl, [GOOD, GOOD, GOOD]) == [3, 1, 1]
    assert ctl.set_floor(9) == 4 and ctl.floor == 4  # never more groups than clients
    assert ctl.set_floor(0) == 1 and ctl.floor == 1  # nor fewer than one
    assert ctl.set_floor(2) == 2
    assert ctl.update(GOOD, 4) == 2
    assert ctl.set_floor(1) == 1  # the clustering shows no groups any more: the paper's p
