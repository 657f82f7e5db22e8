"""Every public strategy, built in a user's own ServerApp with a δ that 4 clients cannot meet
(dp_delta = 0.5 ≥ 1/4), is refused with one StrategyParamsError before any message reaches
the grid: through ``start`` and through Flower's single-phase hooks alike. And the round
skeleton every strategy runs checks it itself: no strategy writes its own round (IFCA and
client selection once did, and sent round 1 where FedAvg refused)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord
from flwr.clientapp import ClientApp
from harness import hand, round_of

import clusterfed
from clusterfed import protocol
from clusterfed.runner.inprocess import InProcessGrid
from clusterfed.strategies import public_strategies
from clusterfed.strategies.base import ClusteredStrategy
from clusterfed.core.exchange import ClientInfo

pytest.importorskip("dp_accounting", reason="noise needs the accountant's backend (clusterfed[privacy])")

CLIENTS = 4
DP = {"dp_noise_multiplier": 0.5, "dp_clipping_norm": 1.0, "dp_delta": 0.5}
REFUSAL = r"dp_delta = 0.5 is not below 1/n = 0.25 for n = 4 clients"
NAMES = sorted(public_strategies())
TRAIN = {"lr": 0.1, "local-epochs": 1}  # what some strategies read before round 1 (HiCFL's xi = "auto")


class CountingGrid(InProcessGrid):
    """The in-process grid, counting every message pushed to it."""

    pushed = 0

    def push_messages(self, messages):
        messages = list(messages)
        self.pushed += len(messages)
        return super().push_messages(messages)


def grid() -> CountingGrid:
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    # a ClientApp that answers nothing: no message may reach it
    return CountingGrid(ClientApp(), CLIENTS, node_configs=[{"partition-id": i} for i in range(CLIENTS)])


def arrays():
    return protocol.to_array_record({"fc.weight": np.zeros((2, 3), np.float32), "fc.bias": np.zeros(2, np.float32)})


def test_every_public_strategy_takes_the_dp_settings():
    for name in NAMES:
        assert getattr(clusterfed, name)(**DP).dp is not None


@pytest.mark.parametrize("name", NAMES)
def test_start_refuses_a_delta_the_clients_cannot_meet_before_any_message(name):
    strategy, on = getattr(clusterfed, name)(**DP), grid()
    with pytest.raises(clusterfed.StrategyParamsError, match=rf"^{strategy.name}: {REFUSAL}"):
        strategy.start(grid=on, initial_arrays=arrays(), num_rounds=2, train_config=ConfigRecord(TRAIN))
    assert on.pushed == 0


@pytest.mark.parametrize("name", NAMES)
def test_the_single_phase_hooks_refuse_it_before_any_message(name):
    strategy, on = getattr(clusterfed, name)(**DP), grid()
    strategy.init(arrays())
    with pytest.raises(clusterfed.StrategyParamsError, match=rf"^{strategy.name}: {REFUSAL}"):
        strategy.configure_train(1, arrays(), ConfigRecord(TRAIN), on)
    assert on.pushed == 0


@pytest.mark.parametrize("name", NAMES)
def test_the_round_skeleton_refuses_it_before_its_first_ask(name):
    """Driven by hand (no driver, no discovery): the round itself refuses before it yields."""
    strategy = getattr(clusterfed, name)(**DP)
    strategy.init(protocol.from_array_record(arrays()))
    for key in map(str, range(CLIENTS)):
        hand(strategy).clients[key] = ClientInfo(key, 50, 0)
    hand(strategy).active, hand(strategy).train_config = list(hand(strategy).clients), dict(TRAIN)
    with pytest.raises(clusterfed.StrategyParamsError, match=rf"^{strategy.name}: {REFUSAL}"):
        next(strategy.round(round_of(strategy, 1)))


def test_no_public_strategy_writes_its_own_round():
    """One round skeleton (``ClusteredStrategy.round``); a strategy varies its steps."""
    for name in NAMES:
        assert getattr(clusterfed, name).round is ClusteredStrategy.round, name
