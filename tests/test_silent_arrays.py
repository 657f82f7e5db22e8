"""Arrays that carry no signal never decide, and the compared layer is chosen by evidence:
a frozen backbone (its arrays come back unchanged) is left out of every comparison and of
every layer rule; a classifier head that is not the model's last layer is found by the
structure of the clients' updates; a one-cluster decision says why in the round line."""

from __future__ import annotations

import logging

import numpy as np
from harness import drive_round, make

import clusterfed
from clusterfed.clustering.layer_evidence import most_structured, score_layers
from clusterfed.models.layers import matrix_layers
from clusterfed.models.parameters import silent_names
from clusterfed.strategies import strategy_class
from clusterfed.core.contract import ending_sentence
import pytest

GROUPS = {str(i): i % 2 for i in range(8)}  # two groups of four


def client_update(key: str, name: str, shape: tuple[int, ...], structured: tuple[str, ...]) -> np.ndarray:
    """conv1.* frozen (zero); the ``structured`` layers' updates point one way per group
    with a little noise; every other array moves by noise alone, the same for both groups."""
    rng = np.random.default_rng(1000 + int(key) * 31 + len(name))
    if name.startswith("conv1"):
        return np.zeros(shape, np.float32)
    noise = 0.05 * rng.standard_normal(shape)
    if name.rsplit(".", 1)[0] in structured:
        direction = np.random.default_rng(7 + GROUPS[key]).standard_normal(shape)
        return (direction + noise).astype(np.float32)
    return (10 * noise).astype(np.float32)


def respond_with(structured: tuple[str, ...]):
    def respond(ask):
        names = ask.upload or list(ask.model)
        if ask.config.get("return") == "update":
            return {n: client_update(ask.key, n, ask.model[n].shape, structured) for n in names}
        return {n: ask.model[n] + client_update(ask.key, n, ask.model[n].shape, structured) for n in names}
    return respond


def test_silent_names_are_the_arrays_no_client_changed():
    start = {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32), "c": np.full(3, 100.0, np.float32)}
    updates = [{"a": np.zeros(3), "b": np.array([0.0, 1e-3, 0.0]), "c": np.full(3, 5e-6)},
               {"a": np.zeros(3), "b": np.zeros(3), "c": np.zeros(3)}]
    # c moved by less than the floor scaled by its start (100 × 1e-7 = 1e-5): rounding, not training
    assert silent_names(updates, ["a", "b", "c"], start) == ["a", "c"]
    assert silent_names([], ["a"], start) == []


def test_the_most_structured_layer_wins_and_noise_finds_none():
    rng = np.random.default_rng(0)
    groups = np.repeat([0, 1, 2], 4)
    centres = 3 * rng.standard_normal((3, 500))
    rows = {"noise": rng.standard_normal((12, 500)), "head": centres[groups] + 0.3 * rng.standard_normal((12, 500))}
    scores = score_layers(rows, metric="cosine", linkage="average", min_silhouette=0.25, reference_draws=19)
    assert [s.layer for s in scores] == ["noise", "head"]
    best = most_structured(scores)
    assert best.layer == "head" and best.clusters == 3
    # group-free clients: with two candidate layers, each cut must beat twice the draws, so
    # a choice among layers finds groups in noise about as rarely as one layer's 5 % test
    found = 0
    for seed in range(20):
        noise = np.random.default_rng(100 + seed).standard_normal((2, 12, 500))
        scores = score_layers({"a": noise[0], "b": noise[1]}, metric="cosine", linkage="average",
                              min_silhouette=0.25, reference_draws=19, seed=seed)
        found += most_structured(scores).clusters > 1
    assert found <= 3


def test_matrix_layers_are_the_layers_with_a_weight_matrix():
    arrays = {"emb.weight": np.zeros((10, 4)), "norm.weight": np.zeros(4), "norm.bias": np.zeros(4),
              "lstm.weight_ih_l0": np.zeros((8, 4)), "lstm.weight_hh_l0": np.zeros((8, 2)), "lstm.bias_ih_l0": np.zeros(8),
              "lstm.bias_hh_l0": np.zeros(8), "head.weight": np.zeros((3, 8)), "head.bias": np.zeros(3),
              "bn.running_mean": np.zeros(3)}
    # a recurrent layer's input and hidden weights are a layer each, with their own biases
    assert matrix_layers(arrays) == {"emb": ["emb.weight"], "lstm.ih_l0": ["lstm.weight_ih_l0", "lstm.bias_ih_l0"],
                                     "lstm.hh_l0": ["lstm.weight_hh_l0", "lstm.bias_hh_l0"],
                                     "head": ["head.weight", "head.bias"]}


def test_fedclust_compares_the_structured_layer_when_the_head_is_not_last():
    # the harness model ends with fc2; here fc2 is an auxiliary decoder whose updates hold no
    # groups, and fc1 is the classifier head that does: the papers' "final layer" is fc2
    algorithm = make(strategy_class("fedclust"), GROUPS)
    batches = drive_round(algorithm, 1, respond_with(structured=("fc1",)))
    choice = algorithm.state.layer_choice
    assert batches[0][0].upload == ["conv1.weight", "conv1.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert choice.chosen == "fc1" and algorithm.layer_keys == ["fc1.weight", "fc1.bias"]
    assert choice.silent == ["conv1.weight", "conv1.bias"]  # frozen: never scored
    assert [s["layer"] for s in choice.scores] == ["fc1", "fc2"]
    labels = [algorithm.assignment[k] for k in sorted(GROUPS)]
    assert len(set(labels)) == 2 and all(labels[i] == labels[i % 2] for i in range(8))
    decision = batches.diagnostics["decision"]
    assert decision.startswith("FedClust compared fc1.weight, fc1.bias (chosen by evidence")
    assert "left out, no client changed them: conv1.weight, conv1.bias" in decision


def test_the_papers_final_layer_finds_nothing_and_the_round_line_says_what_to_try():
    algorithm = make(strategy_class("fedclust"), GROUPS, **{"fedclust.cluster-layers": "final"})
    batches = drive_round(algorithm, 1, respond_with(structured=("fc1",)))
    assert len(set(algorithm.assignment.values())) == 1
    decision = batches.diagnostics["decision"]
    assert "FedClust: one cluster, no structure on fc2 (best silhouette" in decision
    assert "try cluster_layers='auto'" in decision


def test_layercfl_never_splits_on_a_frozen_conv_layer():
    algorithm = make(strategy_class("layercfl"), GROUPS, **{"layercfl.skew": "feature"})
    assert algorithm.state.selected_names == ["conv1.weight", "conv1.bias"]  # feature skew -> the last conv layer
    batches = drive_round(algorithm, 1, respond_with(structured=("fc1", "fc2")))
    assert algorithm.state.silent == ["conv1.weight", "conv1.bias"]
    assert algorithm.state.selected_names == ["fc1.weight", "fc1.bias"]  # the fallback: the first fc layer
    assert "conv1.weight" not in algorithm.state.compared
    # the frozen arrays, then (round 1, and a changed comparison) what LayerCFL now compares
    assert batches.diagnostics["decision"] == ("LayerCFL: left out of every comparison, no client changed them: "
                                               "conv1.weight, conv1.bias; LayerCFL: " + algorithm.compared_words())
    assert "conv1" not in algorithm.compared_words()
    # said once: the next round's replies change nothing
    later = drive_round(algorithm, 2, respond_with(structured=("fc1", "fc2")))
    assert "decision" not in later.diagnostics


def test_layercfl_with_an_unknown_skew_compares_every_array_that_trains():
    algorithm = make(strategy_class("layercfl"), GROUPS)  # the default skew, unknown: every array, as the paper
    assert algorithm.state.selected_names == algorithm.state.compared and "conv1.weight" in algorithm.state.compared
    drive_round(algorithm, 1, respond_with(structured=("fc1", "fc2")))
    assert algorithm.state.selected_names == algorithm.state.compared and "conv1.weight" not in algorithm.state.compared
    assert algorithm.compared_words().startswith("compares the clients' updates of every trained array (skew unknown)")


def test_hicfl_never_watches_a_frozen_layer():
    algorithm = make(strategy_class("hicfl"), GROUPS)
    assert "conv1" in algorithm.state.layers
    drive_round(algorithm, 1, respond_with(structured=("fc1", "fc2")))
    assert algorithm.state.layers == ["fc1", "fc2"]


def test_nothing_is_left_out_when_every_array_trains():
    algorithm = make(strategy_class("cfl"), GROUPS)
    compared = list(algorithm.state.compared)

    def respond(ask):
        return {n: np.full_like(ask.model[n], 0.1 * (1 + GROUPS[ask.key])) for n in ask.model}

    batches = drive_round(algorithm, 1, respond)
    assert algorithm.state.silent == [] and algorithm.state.compared == compared
    # round 1 says only what CFL compares: nothing left out
    assert batches.diagnostics["decision"] == "CFL: " + algorithm.compared_words()
    assert "left out" not in batches.diagnostics["decision"]
    later = drive_round(algorithm, 2, respond)
    assert "decision" not in later.diagnostics  # said once


@pytest.mark.end_to_end
def test_a_run_that_ends_as_fedavg_says_why_and_what_to_try_in_its_last_round_line(caplog):
    from test_library import run_user_app

    caplog.set_level(logging.INFO, logger="flwr")
    run_user_app(clusterfed.CFL(), 2, num_clients=4)  # min-split-round 5: no split can happen in 2 rounds
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[ROUND")]
    assert "ends with one cluster" not in lines[0]
    assert lines[1].endswith(
        "; CFL ends with one cluster: too few members or replies to split (min-split-size) or the run ended before "
        "min-split-round; min-split-size 3, min-split-round 5, 4 clients; try a smaller min-split-size or "
        "min-split-round, or more clients per round (fraction-train)")


def test_a_run_with_clusters_ends_saying_the_evidence_for_their_number():
    algorithm = make(strategy_class("adacfl"), GROUPS, **{"adacfl.share-label-stats": False, "adacfl.warmup-rounds": 0})
    drive_round(algorithm, 1, respond_with(structured=("fc1",)))
    assert ending_sentence(algorithm).startswith("AdaCFL ends with 2 clusters: lambda auto ")


def test_a_split_on_arrays_no_client_changed_is_refused():
    # cluster-layers names the frozen layer: its updates are all zero, every best cut scores
    # 0 and so does group-free data of that shape; a split must beat it, not tie it
    algorithm = make(strategy_class("layercfl"), GROUPS, **{"layercfl.cluster-layers": "conv1", "min-split-round": 1,
                                                            "split-criteria": "absolute", "eps1": 100.0, "eps2": 0.001})
    batches = drive_round(algorithm, 1, respond_with(structured=("fc1", "fc2")))
    assert algorithm.state.selected_names == ["conv1.weight", "conv1.bias"]  # kept as named, though silent
    assert algorithm.state.splits == [] and len(set(algorithm.assignment.values())) == 1
    # one training's refusal, then the same on the chain of 4 trainings (longer evidence)
    refusal, chained = batches.diagnostics["refused_splits"]
    assert refusal["reason"] == chained["reason"] == "silhouette"
    assert refusal["best_cut_silhouette"] == chained["best_cut_silhouette"] == 0.0 and chained["trainings"] == 4


def test_fedclust_states_the_evidence_for_its_number_of_clusters():
    algorithm = make(strategy_class("fedclust"), GROUPS)
    drive_round(algorithm, 1, respond_with(structured=("fc1",)))
    assert algorithm.cluster_count_basis().startswith("2 clusters: lambda auto ")
    assert algorithm.cluster_count_basis().endswith(" of 8 clients on fc1.weight, fc1.bias")
    assert ending_sentence(algorithm).startswith("FedClust ends with 2 clusters: lambda auto ")


def test_a_weight_is_a_layer_of_its_own_only_beside_its_own_bias():
    """weight_ih_l0 pairs with bias_ih_l0; weight norm's weight_g and weight_v, attention's lone
    bias_k and a recurrent layer without biases stay with their module."""
    from clusterfed.models.layers import weight_unit_of

    keys = {"fc.weight_g", "fc.weight_v", "fc.bias", "attn.in_proj_weight", "attn.in_proj_bias", "attn.bias_k",
            "gru.weight_ih_l0", "gru.weight_hh_l0"}
    assert {k: weight_unit_of(k, keys) for k in sorted(keys)} == {
        "attn.bias_k": "attn", "attn.in_proj_bias": "attn.in_proj", "attn.in_proj_weight": "attn.in_proj",
        "fc.bias": "fc", "fc.weight_g": "fc", "fc.weight_v": "fc", "gru.weight_hh_l0": "gru", "gru.weight_ih_l0": "gru"}



def test_a_recurrent_weight_unit_named_as_round_lines_name_it_is_a_layer_to_select():
    from clusterfed.models.layers import select_layers

    arrays = {"rnn.weight_ih_l0": np.zeros((8, 4)), "rnn.weight_hh_l0": np.zeros((8, 2)), "rnn.bias_ih_l0": np.zeros(8),
              "rnn.bias_hh_l0": np.zeros(8), "head.weight": np.zeros((3, 2)), "head.bias": np.zeros(3)}
    assert select_layers(arrays, "rnn.ih_l0") == ["rnn.weight_ih_l0", "rnn.bias_ih_l0"]
    assert select_layers(arrays, "rnn") == ["rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0", "rnn.bias_hh_l0"]


def test_a_near_tied_layer_whose_cut_refines_the_best_ones_is_taken_and_the_line_says_so():
    """An auxiliary head tells 3 of 5 label groups apart at silhouette 0.90, the classifier all 5
    at 0.89: the classifier's cut refines the head's and clears its bar by nearly as much, so it
    is compared; a finer cut that does not refine the best one, or trails it by more, is not."""
    from clusterfed.clustering.layer_evidence import LayerScore, finer_than

    aux = LayerScore("aux", 0.90, 3, 0.25, None, (0, 0, 1, 1, 2, 2, 2, 2, 0, 0))
    head = LayerScore("head", 0.89, 5, 0.25, None, (0, 0, 1, 1, 2, 2, 3, 3, 4, 4))
    crossing = LayerScore("crossing", 0.89, 5, 0.25, None, (0, 1, 1, 2, 2, 3, 3, 4, 4, 0))
    far = LayerScore("far", 0.80, 5, 0.25, None, head.labels)
    assert most_structured([aux, head]).layer == "head"
    assert most_structured([aux, crossing]).layer == "aux"
    assert most_structured([aux, far]).layer == "aux"
    said = finer_than(head.record(), [aux.record(), head.record()])
    assert said == ", 5 clusters: a finer cut of aux's 3 (silhouette 0.90), within 0.05 of its margin"
    assert finer_than(aux.record(), [aux.record(), head.record()]) == ""


def test_a_model_with_more_layers_than_candidates_scores_its_first_and_last_ones():
    """Beyond max-candidate-layers the first and the last half of the layers are scored: a
    shift of the inputs (rotated images) shows near the input. Of conv1, fc1 and fc2 with two
    candidates, conv1 and fc2 are uploaded and scored, and the groups that only conv1's updates
    hold are found (the last two layers, fc1 and fc2, hold none)."""
    from clusterfed.models.layers import both_ends

    assert both_ends(list(range(10)), 8) == [0, 1, 2, 3, 6, 7, 8, 9]
    assert both_ends(list(range(5)), 3) == [0, 3, 4] and both_ends([0, 1], 8) == [0, 1]

    def respond(ask):
        out = {}
        for n in ask.upload or list(ask.model):
            rng = np.random.default_rng(1000 + int(ask.key) * 31 + len(n))
            step = 0.5 * rng.standard_normal(ask.model[n].shape)
            if n.startswith("conv1"):
                step = np.random.default_rng(7 + GROUPS[ask.key]).standard_normal(ask.model[n].shape) + 0.1 * step
            out[n] = (ask.model[n] + step).astype(np.float32)
        return out

    algorithm = make(strategy_class("fedclust"), GROUPS, **{"fedclust.max-candidate-layers": 2})
    batches = drive_round(algorithm, 1, respond)
    assert batches[0][0].upload == ["conv1.weight", "conv1.bias", "fc2.weight", "fc2.bias"]
    assert algorithm.state.layer_choice.chosen == "conv1"
    labels = [algorithm.assignment[k] for k in sorted(GROUPS)]
    assert len(set(labels)) == 2 and all(labels[i] == labels[i % 2] for i in range(8))
