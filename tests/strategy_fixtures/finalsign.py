"""FinalSign: a strategy module written as it would sit in ``clusterfed/strategies/``, from
the author kit alone (``clusterfed.strategies``). tests/test_strategy_registration.py puts it
in that package and registers it with one line, and checks that everything else follows.

Each round, before training, the round's sample trains the common start model for
``probe-epochs`` and uploads only the final layer's change (a partial upload, ``phase``
``probe``); a client joins cluster 0 or 1 by the sign of that change's mean; the hook
returns how many replied (a column of rounds.jsonl). A toy rule: it exercises the
conventions a real strategy uses, not a paper."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from clusterfed.strategies import (
    RETURN_UPDATE,
    ClusteredState,
    ClusteredStrategy,
    Round,
    Steps,
    StrategyParams,
    select_layers,
    stack_partials,
    upload_names,
)


class FinalSignParams(StrategyParams):
    probe_epochs: int = Field(1, alias="probe-epochs", ge=1,
                              description="local epochs of the probe before each round's training")


@dataclass
class FinalSignState(ClusteredState):
    probed: dict[str, int] = field(default_factory=dict)  # client key -> round of its latest probe


class FinalSign(ClusteredStrategy):
    """Two clusters by the sign of the mean change of the final layer in a short probe."""

    name = "finalsign"
    Params = FinalSignParams
    State = FinalSignState

    def init_clusters(self) -> None:
        for _ in range(2):
            self.new_cluster(self.state.theta0)

    def draw_sample(self, rnd: Round) -> list[str] | None:
        return self.sample_active(rnd)  # the probe asks only this round's sample

    def before_train(self, rnd: Round) -> Steps:
        keys = rnd.reachable(self.placed(rnd))
        layer = select_layers(self.state.theta0, "final", self.params.compare_arrays)
        replies = yield self.train_asks(
            rnd, keys, models={key: self.state.theta0 for key in keys}, phase="probe",
            extra={"upload": upload_names(layer), "return": RETURN_UPDATE, "local-epochs": self.params.probe_epochs})
        for reply in replies:
            change = stack_partials([[reply.update[name] for name in layer]])[0]
            self.state.assignment[reply.key] = 0 if change.mean() >= 0 else 1
            self.state.probed[reply.key] = rnd.number
        return {"probe_replies": len(replies)}

    def cluster_state(self) -> dict:
        return {"probed": dict(self.state.probed)}
