"""How a client finds its leaf of a bi-partitioning tree (CFL, LayerCFL, HiCFL) without
being part of a split: newcomers, and members that sat out their cluster's split round.

Newcomers descend the tree: at each split they train once on the model the parent's members
had trained from in the split round, upload only the arrays the split was decided on, and
follow the side whose split-round direction their update resembles (CFL / LayerCFL: the
side's mean update, by cosine; HiCFL: the sign of the cosine with the reference client's
update, as in the split itself). Before the first split that is simply the root.

Partial participation (``fraction-train`` < 1): a split is decided on the members that
replied in its round. A member that did not is put on a side at once — the side its latest
recorded update points to, or the larger side when it has none — so it always holds a
cluster and a model; the placement is *provisional* (``provisional``: client → the split it
missed, recorded under the split's ``absent``). The first round it is sampled again it is
placed for real, before training, exactly as a newcomer descends the tree but starting at
that split: one local training on the split-round model, an upload of the split's arrays,
the side its update points to (and so on down any later splits). It then trains its
final cluster's model in the same round. A placement reply that is lost leaves it where it
is, still provisional.

A split's *route* (``routes[node]``) is what the descent replays: ``rule`` (``nearest-mean``
or ``reference``), ``names`` (the arrays uploaded), ``directions`` (the sides' mean updates,
or the reference's update), ``model`` (the split-round model), and optionally ``sketch``
(the map a split decided on sketches used) and ``centre`` (HiCFL's centred reference rule:
the split round's mean update, subtracted first).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Protocol

import numpy as np

from clusterfed.clustering.bipartition import ClusterTree
from clusterfed.clustering.sketch import in_sketch_space
from clusterfed.strategies.exchange import RETURN_UPDATE, Arrays, Ask, Steps
from clusterfed.strategies.parts import Host, Part
from clusterfed.strategies.update_vectors import cosine, flatten


def side_of(vector: np.ndarray, route: dict[str, Any]) -> int:
    """0 or 1: the side of a split that an update on ``route["names"]`` belongs to: mapped by
    the split's sketch if it was decided on sketches, minus the split round's mean update if
    the split was centred (HiCFL), then the side whose mean it is nearest to by cosine or,
    for the reference rule, the reference's side iff their cosine is positive."""
    vector = in_sketch_space(vector, route.get("sketch"))
    if route.get("centre") is not None:
        vector = vector - route["centre"]
    sims = [cosine(vector, d) for d in route["directions"]]
    if route["rule"] == "reference":
        return 0 if sims[0] > 0 else 1
    return int(np.argmax(sims))  # nearest side mean; ties -> side 0


class DescentState(Protocol):
    """The strategy state the descent reads (``tree``, ``routes``) and writes (``provisional``)."""

    tree: ClusterTree | None
    routes: dict[int, dict[str, Any]]
    provisional: dict[str, int]


class DescentHost(Host[DescentState], Protocol):
    """What the descent needs of its strategy beyond its state: a way to ask clients to train."""

    def train_asks(self, server_round: int, keys: list[str], *, models: dict[str, Arrays] | None = None,
                   extra: dict[str, Any] | None = None, phase: str = "train") -> list[Ask]: ...


class TreeDescent(Part[DescentState]):
    """Placement of clients by replaying splits (module docstring)."""

    host: DescentHost

    def place_absent(self, cluster: int, absent: list[str], route: dict[str, Any], last: dict[str, np.ndarray],
                     sizes: tuple[int, int]) -> tuple[list[str], list[str]]:
        """Members of ``cluster`` that did not reply in its split round: provisionally the
        side their latest update points to; with no update on record, the larger side. They
        descend from this split when next sampled; one already provisional keeps the earlier
        split it missed, whose descent passes this one."""
        extra: tuple[list[str], list[str]] = ([], [])
        for key in absent:
            side = (side_of(np.asarray(last[key], dtype=np.float64), route) if key in last
                    else (0 if sizes[0] >= sizes[1] else 1))
            extra[side].append(key)
            self.state.provisional.setdefault(key, cluster)
        return extra

    def descend(self, server_round: int, start: dict[str, int]) -> Steps:
        """From node ``start[key]`` down to a leaf per key: at each split node train once on
        the split-round model and follow the side the update points to. Returns (leaf per
        key, the split nodes passed, the keys whose placement reply was lost at some node:
        those took the larger side there)."""
        tree = self.state.tree
        at = dict(start)
        path: dict[str, list[int]] = {key: [] for key in start}
        failed: set[str] = set()
        while True:
            waiting: dict[int, list[str]] = defaultdict(list)
            for key, node in at.items():
                while (into := tree.node(node).merged_into) is not None:  # merged leaf: no choice to make
                    node = at[key] = into
                if not tree.node(node).is_leaf:
                    waiting[node].append(key)
            if not waiting:
                break
            for node, group in waiting.items():
                route = self.state.routes[node]
                children = tree.node(node).children
                sizes = tuple(len(tree.node(ch).members) for ch in children)
                replies = yield self.host.train_asks(
                    server_round, group, models={k: route["model"] for k in group}, phase="placement",
                    extra={"upload": ",".join(route["names"]), "return": RETURN_UPDATE})
                got = {r.key: flatten(r.update, route["names"]) for r in replies}
                for key in group:
                    if key in got:
                        side = side_of(got[key], route)
                    else:  # the placement round failed for this client
                        side = 0 if sizes[0] >= sizes[1] else 1
                        failed.add(key)
                    path[key].append(node)
                    at[key] = children[side]
        return at, path, failed
