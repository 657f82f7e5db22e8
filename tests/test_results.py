import pytest

from clusterfed.results import assignment_ari, summarize, summary_table


def _round(n, acc, up, down, evaluated=4, known=4):
    return {"round": n, "accuracy": acc, "accuracy_std": 0.0, "cum_bytes_up": up, "cum_bytes_down": down,
            "ari": 1.0, "num_clusters": 2, "rejected": 0, "failures": 0, "clients_evaluated": evaluated,
            "clients_known": known}


def test_rounds_and_mb_to_target():
    rounds = [_round(1, 0.5, 1e6, 1e6), _round(2, 0.85, 2e6, 2e6), _round(3, 0.8, 3e6, 3e6)]
    summary = summarize(rounds, target=0.8)
    assert summary["rounds_to_target"] == 2
    assert summary["mb_to_target"] == pytest.approx(4.0)
    assert summary["final_accuracy"] == 0.8 and summary["best_accuracy"] == 0.85
    assert summary["total_mb"] == pytest.approx(6.0)
    assert summarize(rounds, target=0.9)["rounds_to_target"] is None
    assert "-" in summary_table([{**summarize(rounds, 0.9), "strategy": "x"}])


def test_a_round_that_missed_clients_does_not_reach_the_target():
    rounds = [_round(1, 0.95, 1e6, 1e6, evaluated=3), _round(2, 0.9, 2e6, 2e6)]
    assert summarize(rounds, target=0.9)["rounds_to_target"] == 2
    assert summarize(rounds, target=0.9, coverage=0.75)["rounds_to_target"] == 1


def test_ari_of_one_model_against_several_groups_is_zero():
    groups = {"0": 0, "1": 0, "2": 1, "3": 1}
    assert assignment_ari({k: 0 for k in groups}, groups) == 0.0
    assert assignment_ari({"0": 5, "1": 5, "2": 9, "3": 9}, groups) == 1.0
