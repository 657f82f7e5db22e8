"""How much of a cell's true groups its clients' updates carry at all, whatever a strategy does
with them: every client trains the cell's model once with the cell's own loop (optimiser, lr,
local epochs) from the start model and again from FedAvg's model a few rounds on, and for each
trained array, and for all of them together, the silhouette of the *true* groups under the cosine
distance between the clients' updates is scored (scikit-learn's ``silhouette_score``).

A cell whose best silhouette stays near 0, or no higher than the same best with the group labels
shuffled (``chance_best``: small arrays and few clients score high by luck), is one where one
training's updates do not tell the groups apart: the groups are as mixed in every array as
clients drawn from one population. It grades how hard a cell is, not what is possible: a strategy
that gathers more evidence (several chained trainings in a clustering round, updates over
several rounds) can find groups it does not see. It uses the true groups, so nothing in the
product may read it.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score, silhouette_score
from sklearn.metrics.pairwise import cosine_distances

from fuzz.apps import train
from fuzz.cell import Cell
from fuzz.data import loaders, true_groups
from fuzz.models import build_model

ALL = "all arrays"
CLEAR = 0.2  # a best silhouette below this: the groups as mixed as one population's clients


def shows_groups(found: dict) -> bool | None:
    """Whether a cell's true groups show in its clients' updates (``cell_signal``'s record): the best
    silhouette at least ``CLEAR`` and above chance; None for a cell without groups (an IID control)."""
    if found.get("best") is None:
        return None
    return found["best"] >= CLEAR and found["best"] > found["chance"]


def distance_matrices(updates: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray | None]:
    """Per array name (and ``ALL``: the arrays concatenated), the cosine distances between the
    clients' ``updates`` (one dict of flat arrays per client); None where some client's update
    of the array is zero (a frozen array: no direction to compare)."""
    names = sorted(updates[0])
    out: dict[str, np.ndarray | None] = {}
    for name in names + [ALL]:
        X = np.stack([np.concatenate([u[n].ravel() for n in names]) if name == ALL else u[name].ravel()
                      for u in updates]).astype(np.float64)
        out[name] = cosine_distances(X) if np.all(np.linalg.norm(X, axis=1) > 0) else None
    return out


def silhouettes(distances: dict[str, np.ndarray | None], groups) -> dict[str, float]:
    """The silhouette of ``groups`` under each array's distances (0 where there are none)."""
    return {name: 0.0 if D is None else round(float(silhouette_score(D, groups, metric="precomputed")), 4)
            for name, D in distances.items()}


def group_silhouettes(updates: list[dict[str, np.ndarray]], groups: list[int]) -> dict[str, float]:
    """Per array name (and ``ALL``), the silhouette of the true ``groups`` under the cosine
    distance between the clients' ``updates``; an array some client left unchanged scores 0.
    Empty for fewer than two groups."""
    if len(set(groups)) < 2:
        return {}
    return silhouettes(distance_matrices(updates), groups)


def chance_best(distances: list[dict[str, np.ndarray | None]], groups: list[int], draws: int = 100,
                quantile: float = 0.95, seed: int = 0) -> float:
    """What the best silhouette over every array and round reaches by chance: the ``quantile`` of
    that best over ``draws`` shufflings of the group labels (one shuffle for every array and round,
    as the true labels are). Small arrays and few clients reach high silhouettes by luck."""
    rng = np.random.default_rng(seed)
    # a shuffle that gives the true partition back (likely with few clients) is not chance
    shuffles = [s for s in (rng.permutation(groups) for _ in range(draws)) if adjusted_rand_score(groups, s) < 1.0]
    best = [max(max(silhouettes(D, shuffled).values()) for D in distances) for shuffled in shuffles]
    return round(float(np.quantile(best, quantile)), 4)


def client_updates(cell: Cell, model: torch.nn.Module, clients=None) -> list[dict[str, np.ndarray]]:
    """Each of ``clients``' (partitions; default: every client) update of each trainable array
    after one local training from ``model``."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    start = {n: t.detach().clone() for n, t in model.state_dict().items()}
    updates = []
    for partition in range(cell.clients) if clients is None else clients:
        local = copy.deepcopy(model)
        train(cell, local, loaders(cell, partition)[0], cell.local_epochs, cell.lr)
        after = local.state_dict()
        updates.append({n: (after[n] - start[n]).numpy().ravel() for n in names})
    return updates


def apply_mean_update(model: torch.nn.Module, updates: list[dict[str, np.ndarray]]) -> None:
    """FedAvg of ``updates`` into ``model`` (equal shares: every client holds as many examples)."""
    state = model.state_dict()
    for name in updates[0]:
        mean = np.mean([u[name] for u in updates], axis=0)
        state[name] = state[name] + torch.from_numpy(mean).view_as(state[name]).to(state[name].dtype)
    model.load_state_dict(state)


def cell_signal(cell: Cell, rounds: tuple[int, ...] = (1, 5)) -> dict:
    """The true groups' silhouettes in the updates of the rounds ``rounds`` (FedAvg of every client
    between them), their best over arrays and rounds with the array and round that reached it,
    and what that best reaches with the groups shuffled (``chance_best``)."""
    torch.manual_seed(cell.seed)
    model = build_model(cell)
    groups = true_groups(cell)
    found: dict[int, dict[str, float]] = {}
    kept: list[dict[str, np.ndarray | None]] = []
    for server_round in range(1, max(rounds) + 1):
        updates = client_updates(cell, model)
        if server_round in rounds and len(set(groups)) > 1:
            kept.append(distance_matrices(updates))
            found[server_round] = silhouettes(kept[-1], groups)
        apply_mean_update(model, updates)
    best = max(((s, r, n) for r, scores in found.items() for n, s in scores.items()), default=None)
    return {"rounds": {str(r): scores for r, scores in found.items()},
            "best": None if best is None else best[0], "best_round": None if best is None else best[1],
            "best_array": None if best is None else best[2],
            "chance": chance_best(kept, groups, seed=cell.seed) if kept else None,
            "all_arrays": {str(r): scores.get(ALL) for r, scores in found.items()}}
