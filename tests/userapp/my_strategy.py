"""A strategy defined outside clusterfed, on its base: two fixed clusters by node order
(a stand-in for a user's own clustering rule), with a typed parameter of its own."""

from dataclasses import dataclass, field

from pydantic import Field

from clusterfed import ClusteredState, ClusteredStrategy, StrategyParams


class HalvesParams(StrategyParams):
    halves: int = Field(2, ge=1, description="number of clusters, by client order")


@dataclass
class HalvesState(ClusteredState):
    seen: list[str] = field(default_factory=list)


class Halves(ClusteredStrategy):
    """Clients split into ``halves`` clusters by the order they were first seen."""

    name = "halves"
    Params = HalvesParams
    State = HalvesState

    def init_clusters(self) -> None:
        for _ in range(self.params.halves):
            self.new_cluster(self.state.theta0)

    def admit(self, rnd, keys):
        for key in keys:
            self.state.seen.append(key)
            self.state.assignment[key] = len(self.state.seen) % self.params.halves
