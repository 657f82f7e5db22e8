"""Oracle: clusters are the true groups. An upper bound for benchmarks only — the one
strategy allowed to read the ground truth (the clients' reported ``true-group``).

Partial participation (``fraction-train`` < 1): every client is in its group's cluster from
the start; a random sample trains; a cluster none of whose members was sampled keeps its
model that round."""

from dataclasses import dataclass, field

from clusterfed.strategies.base import ClusteredState, ClusteredStrategy, Round


@dataclass
class OracleState(ClusteredState):
    cluster_of_group: dict[int, int] = field(default_factory=dict)


class Oracle(ClusteredStrategy):
    """One cluster per true group (benchmarks only)."""

    name = "oracle"
    State = OracleState
    state: OracleState

    def init_clusters(self) -> None:
        self.state.cluster_of_group = {}

    def admit(self, rnd: Round, keys: list[str]) -> None:
        for key in keys:
            group = rnd.clients[key].true_group
            if group not in self.state.cluster_of_group:
                self.state.cluster_of_group[group] = self.new_cluster(self.state.theta0)
            self.state.assignment[key] = self.state.cluster_of_group[group]
