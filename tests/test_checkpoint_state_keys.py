"""A checkpoint's ``algorithm`` dict (``get_state()``) keeps its keys: the one-shot strategies'
parts and the explicit ``self.state.<field>`` access changed how the code reaches its state,
not what a checkpoint holds. The strategies' own keys were recorded before that change; the
base's are ``ClusteredState``'s, whatever the base declares."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from clusterfed.strategies.adacfl import AdaCFL
from clusterfed.strategies.base import ClusteredState
from clusterfed.strategies.fedclust import FedClust
from clusterfed.strategies.ifca import IFCA

OWN_KEYS = {
    # the revisits', the merge probe's and retry-after's fields (defaults: an older checkpoint resumes without them)
    FedClust: ["clustered", "cluster_start", "references", "layer_choice", "clustering_state", "evidence_plan",
               "revisit_cuts", "revisit_alike", "revisits", "revisit_scale", "revisit_waiting", "revisit_pool", "revisit_apart", "merge_probes", "retry", "unclustered", "recut_at", "recuts"],
    AdaCFL: ["clustered", "cluster_start", "references", "layer_choice", "clustering_state", "evidence_plan",
             "revisit_cuts", "revisit_alike", "revisits", "revisit_scale", "revisit_waiting", "revisit_pool", "revisit_apart", "merge_probes", "retry", "warmup_cluster"],
    IFCA: ["k", "warming_up", "choice_counts", "candidates", "idle", "last_won", "reseeds", "previous_cluster",
           "previous_update", "seeded_round"],
}
THETA0 = {"fc.weight": np.zeros((3, 4), np.float32), "fc.bias": np.zeros(3, np.float32)}


@pytest.mark.parametrize("cls", list(OWN_KEYS), ids=lambda cls: cls.__name__)
def test_checkpointed_state_has_the_same_keys(cls):
    strategy = cls()
    strategy.init(THETA0)
    base = [f.name for f in dataclasses.fields(ClusteredState)]
    assert list(strategy.get_state()) == base + OWN_KEYS[cls]
    restored = cls()
    restored.set_state(strategy.get_state())
    assert list(restored.get_state()) == base + OWN_KEYS[cls]
