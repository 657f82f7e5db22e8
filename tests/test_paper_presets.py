"""The paper presets: ``Cls.paper(**overrides)`` and the run config's ``preset = "paper"`` give
the parameter values (``Cls.PAPER``) that run the published algorithm with no extension; each
preset checked on a hand-computed case against its paper's rule."""

from __future__ import annotations

import numpy as np
import pytest
from harness import SHAPES, drive_round, hand, theta0, trained

import clusterfed
from clusterfed.config import ConfigError, parse_config
from clusterfed.strategies.base import ClusteredStrategy
from clusterfed.core.exchange import CHOICE, ClientInfo, unpack_model
from clusterfed.core.params import StrategyParams

KEYS = ["0", "1", "2", "3"]


def ready(algorithm, start: float = 0.0):
    """``algorithm`` initialised on the harness model (every array ``start``) with ``KEYS`` active."""
    hand(algorithm).train_config = {"lr": 0.05, "local-epochs": 1}
    algorithm.init(theta0(start), hand(algorithm).train_config)
    for key in KEYS:
        hand(algorithm).clients[key] = ClientInfo(key, 50, 0)
    hand(algorithm).active = list(KEYS)
    return algorithm


# ------------------------------------------------------------------ the mechanism
def test_paper_gives_the_papers_values_and_overrides_go_on_top():
    assert clusterfed.IFCA.paper().params.init == "random" and clusterfed.IFCA.paper().params.restarts == 1
    ifca = clusterfed.IFCA.paper(num_clusters=2, restarts=3)
    assert (ifca.params.num_clusters, ifca.params.restarts, ifca.params.init) == (2, 3, "random")
    selection, default = clusterfed.ClientSelection.paper(), clusterfed.ClientSelection()
    assert (selection.params.guard, selection.params.cluster_on) == ("none", "weights")
    assert (default.params.guard, default.params.cluster_on) == ("floor", "changes")  # the extensions
    assert selection.params.warmup_rounds == default.params.warmup_rounds  # the rest as the defaults
    for cls in (clusterfed.FedAvg, clusterfed.FedProx):  # their defaults are their papers'
        assert cls.PAPER == {} and cls.paper().params == cls().params


@pytest.mark.parametrize("cls", [clusterfed.Local, clusterfed.Oracle])
def test_a_baseline_without_a_paper_has_no_preset(cls):
    with pytest.raises(clusterfed.StrategyParamsError, match=rf"^{cls.name}: no paper preset"):
        cls.paper()


def test_a_preset_naming_no_parameter_is_refused_where_the_class_is_written():
    with pytest.raises(TypeError, match=r"Typo.PAPER names \['gaurd'\], not fields of StrategyParams"):
        type("Typo", (ClusteredStrategy,), {"name": "typo", "Params": StrategyParams, "PAPER": {"gaurd": "none"}})


def test_the_run_config_preset_builds_the_same_parameters():
    built = parse_config({"strategy": "selection", "preset": "paper"}).build_strategy()
    assert built.params == clusterfed.ClientSelection.paper().params
    mixed = parse_config({"strategy": "selection", "preset": "paper", "selection.guard": "floor"}).build_strategy()
    assert (mixed.params.guard, mixed.params.cluster_on) == ("floor", "weights")  # a key beside the preset wins
    assert parse_config({"strategy": "ifca", "preset": "paper", "ifca.num-clusters": 2}).build_strategy().params \
        == clusterfed.IFCA.paper(num_clusters=2).params
    assert parse_config({"strategy": "selection"}).build_strategy().params.guard == "floor"  # preset = "none"


@pytest.mark.parametrize("strategy, says", [("local", "strategy 'local' has no paper preset"),
                                            ("flwr-fedavg", "'flwr-fedavg' is no clustered strategy")])
def test_the_run_config_refuses_a_preset_the_strategy_lacks(strategy, says):
    with pytest.raises(ConfigError, match=says):
        parse_config({"strategy": strategy, "preset": "paper"})


# ------------------------------------------------------------------ IFCA (Ghosh et al. 2020, Algorithm 1)
def test_ifca_paper_each_client_trains_the_model_of_lowest_loss_and_each_cluster_averages_its_choosers():
    """Two models, all zeros and all ones; each client's data sits at its target, its loss is
    the squared distance to it, and it trains to its target. Clients 0, 2 (targets 0.1, 0.2)
    take model 0, clients 1, 3 (0.9, 0.8) model 1; the new models are 0.15 and 0.85, in one
    exchange (no restart)."""
    algorithm = ready(clusterfed.IFCA.paper(num_clusters=2))
    algorithm.state.models = {0: theta0(0.0), 1: theta0(1.0)}
    targets = {"0": 0.1, "1": 0.9, "2": 0.2, "3": 0.8}

    def client(ask):
        offered = [unpack_model(ask.model, k) for k in range(ask.choices)]
        losses = [np.mean(np.concatenate([(a - targets[ask.key]).ravel() ** 2 for a in m.values()])) for m in offered]
        choice = int(np.argmin(losses))
        return {n: np.full_like(a, targets[ask.key]) for n, a in offered[choice].items()}, {CHOICE: choice}

    batches = drive_round(algorithm, 1, client)
    assert len(batches) == 1 and all(ask.choices == 2 for ask in batches[0])  # every client offered both
    assert algorithm.assignment == {"0": 0, "1": 1, "2": 0, "3": 1}
    for cluster, mean in ((0, 0.15), (1, 0.85)):
        assert all(np.allclose(a, mean) for a in algorithm.models[cluster].values())
    assert batches.diagnostics["ifca_choices"] == {"0": 2, "1": 2}


# ------------------------------------------------------------------ client selection (Chen and Chen)
SHIFT = {"0": 1.0, "1": 1.1, "2": -1.0, "3": -1.1}  # two groups by the final layer's change
EXAMPLES = {"0": 10, "1": 30, "2": 20, "3": 40}


def moved(ask):
    """A client's reply: the global model with its final bias moved by its ``SHIFT``."""
    out = trained(ask, 0.0)
    out["fc2.bias"] = out["fc2.bias"] + np.float32(SHIFT[ask.key])
    return out


def final_layer(algorithm, bias: float, weight: float) -> np.ndarray:
    """A client's clustered row: the final layer (fc2) with every bias ``bias``, every weight ``weight``."""
    return np.concatenate([np.full(np.prod(SHAPES[n]), bias if n == "fc2.bias" else weight)
                           for n in algorithm.state.layer_keys])


def test_selection_paper_starts_p_at_the_number_of_clients_and_weighs_each_by_its_own_samples():
    """The paper: after the warm-up (every client), p starts at m = 4, so the cut into 4
    groups makes every client a representative; the global model is the n_c-weighted average:
    fc2.bias = 0.5 + 2 × Σ n_k s_k / Σ n_k = 0.5 + 2 × (10 + 33 − 20 − 44) / 100 = 0.08 after
    two rounds. The clustered rows are the latest final-layer weights."""
    algorithm = ready(clusterfed.ClientSelection.paper(), start=0.5)
    warmup = drive_round(algorithm, 1, moved, EXAMPLES).diagnostics
    assert warmup["warmup"] is True and warmup["p"] is None and warmup["trained_clients"] == 4
    assert np.allclose(algorithm.state.latest["0"], final_layer(algorithm, 0.5 + SHIFT["0"], 0.5))  # weights
    after = drive_round(algorithm, 2, moved, EXAMPLES).diagnostics
    assert (after["p"], after["p_rule"], after["trained_clients"]) == (4, 4, 4)
    assert after["representatives"] == KEYS
    assert np.allclose(algorithm.models[0]["fc2.bias"], 0.08)


def test_selection_default_draws_one_representative_per_warm_up_group_where_the_paper_draws_all():
    algorithm = ready(clusterfed.ClientSelection(), start=0.5)
    drive_round(algorithm, 1, moved, EXAMPLES)
    assert np.allclose(algorithm.state.latest["0"], final_layer(algorithm, SHIFT["0"], 0.0))  # changes
    # the default's warm-up goes on until two successive rounds' cuts agree (rounds 1 and 2 here)
    second = drive_round(algorithm, 2, moved, EXAMPLES).diagnostics
    assert second["warmup"] is True and second["trained_clients"] == 4
    assert "2 groups, one representative each from now on" in second["decision"]
    after = drive_round(algorithm, 3, moved, EXAMPLES).diagnostics
    assert (after["p"], after["p_floor"], after["trained_clients"]) == (2, 2, 2)
    first, second = after["representatives"]
    assert first in ("0", "1") and second in ("2", "3")
