"""Recursive bi-partitioning of a cluster (Clustered FL, Sattler et al. 2020).

Pure NumPy/SciPy. The pieces a CFL-style strategy needs (the scores of a proposed split —
cosine similarity, Sattler's gap, silhouettes — are in ``clusterfed.clustering.split_scores``):

- ``bipartition``: two sides by complete-linkage agglomerative clustering on ``1 - S``;
- ``split_criteria``: when to split (absolute ``eps1``/``eps2`` or the scale-free rule);
- ``split_members`` / ``ClusterTree``: map sub-matrix *positions* back to client *keys*.

Positions vs keys: every function that takes a similarity matrix answers in positions of
that matrix. After the first split a cluster's matrix is a sub-matrix of the members of
that cluster only, so position ``i`` is "the i-th member of this cluster", not client ``i``.
Storing positions as client ids is a known bug of public CFL code; ``ClusterTree.split``
takes positions into the cluster's current member list and stores keys.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.cluster.hierarchy import cut_tree, fcluster, linkage
from scipy.spatial.distance import squareform

from clusterfed.clustering.split_scores import as_similarity, as_two_sides, cosine_distances

SPLIT_MODES = ("relative", "absolute")


# --------------------------------------------------------------------------- bipartition


def bipartition(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split the m rows of similarity matrix ``S`` into two non-empty sides.

    Complete-linkage agglomerative clustering on the distance ``1 - S`` (Sattler's choice),
    cut into two clusters. Returns two sorted int arrays of positions into ``S``;
    ``side_a`` is the side holding position 0, so the output is deterministic.
    Requires m >= 2. If ``fcluster(maxclust=2)`` yields a single cluster (ties in the
    dendrogram, e.g. identical updates), the root's two children are used instead, so a side
    is never empty.
    """
    S = as_similarity(S)
    m = S.shape[0]
    if m < 2:
        raise ValueError(f"cannot bi-partition {m} client(s); need at least 2")
    if m == 2:
        return np.array([0]), np.array([1])
    Z = linkage(squareform(cosine_distances(S), checks=False), method="complete")
    labels = fcluster(Z, t=2, criterion="maxclust")
    if np.unique(labels).size != 2:
        labels = cut_tree(Z, n_clusters=2).ravel()
    in_a = labels == labels[0]
    return np.flatnonzero(in_a), np.flatnonzero(~in_a)



# --------------------------------------------------------------------------- when to split


@dataclass(frozen=True)
class SplitDecision:
    """Sattler's split criteria for one cluster in one round.

    ``reference_mean_norm`` is the norm the relative rule compared against (the largest
    mean-update norm seen so far, this round included); the caller stores it as the new
    ``max_mean_norm_seen``. In absolute mode it is the same running maximum, for the record.
    """

    mode: str
    mean_norm: float
    max_norm: float
    stationary: bool
    heterogeneous: bool
    split: bool
    reference_mean_norm: float


def split_criteria(
    updates: np.ndarray,
    weights: Sequence[float] | np.ndarray,
    *,
    mode: str = "relative",
    eps1: float = 0.4,
    eps2: float = 1.6,
    rel_eps1: float = 0.4,
    rel_eps2: float = 2.0,
    max_mean_norm_seen: float | None = None,
) -> SplitDecision:
    """Decide whether a cluster should be bi-partitioned this round.

    ``mean_norm = ||Σ_c n_c/N Δ_c||`` (norm of the weighted mean, not mean of norms) and
    ``max_norm = max_c ||Δ_c||``.

    - ``absolute``: stationary ⇔ mean_norm < eps1, heterogeneous ⇔ max_norm > eps2.
    - ``relative`` (scale-free, default): stationary ⇔ mean_norm < rel_eps1 × R where
      R = max(max_mean_norm_seen, mean_norm) is the largest mean-update norm this cluster
      has shown, this round included (``None``: nothing seen before, R = mean_norm, so a
      cluster is never stationary in its first observed round); heterogeneous ⇔
      max_norm > rel_eps2 × mean_norm.

    ``split = stationary and heterogeneous``; always False with fewer than 2 updates
    (nothing to split). Weights are sample counts ``n_c`` (normalised here; all-zero
    weights fall back to a plain mean).
    """
    if mode not in SPLIT_MODES:
        raise ValueError(f"unknown split-criteria mode {mode!r}; expected one of {SPLIT_MODES}")
    U = np.asarray(updates, dtype=np.float64)
    if U.ndim != 2 or U.shape[0] == 0:
        raise ValueError(f"expected an (m, d) matrix of updates with m >= 1, got shape {U.shape}")
    w = np.asarray(weights, dtype=np.float64).ravel()
    if w.size != U.shape[0]:
        raise ValueError(f"{w.size} weights for {U.shape[0]} updates")
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite and non-negative")
    total = w.sum()
    w = w / total if total > 0 else np.full(w.size, 1.0 / w.size)

    mean_norm = float(np.linalg.norm(w @ U))
    max_norm = float(np.linalg.norm(U, axis=1).max())
    reference = mean_norm if max_mean_norm_seen is None else max(float(max_mean_norm_seen), mean_norm)

    if mode == "absolute":
        stationary = mean_norm < eps1
        heterogeneous = max_norm > eps2
    else:
        stationary = mean_norm < rel_eps1 * reference
        heterogeneous = max_norm > rel_eps2 * mean_norm
    split = bool(stationary and heterogeneous and U.shape[0] >= 2)
    return SplitDecision(
        mode=mode,
        mean_norm=mean_norm,
        max_norm=max_norm,
        stationary=bool(stationary),
        heterogeneous=bool(heterogeneous),
        split=split,
        reference_mean_norm=reference,
    )


# --------------------------------------------------------------------------- positions -> keys


def split_members(
    member_keys: Sequence[Hashable],
    side_a: Sequence[int] | np.ndarray,
    side_b: Sequence[int] | np.ndarray,
) -> tuple[list, list]:
    """Translate two sides given as positions into ``member_keys`` into two lists of keys.

    The sides must partition ``range(len(member_keys))`` into two non-empty parts; anything
    else is a caller bug (e.g. positions of another matrix) and raises ``ValueError``.
    """
    keys = list(member_keys)
    m = len(keys)
    a, b = as_two_sides(side_a, side_b, m, "members' positions")
    return [keys[i] for i in a], [keys[i] for i in b]


def _jsonable(value: Any) -> Any:
    """NumPy scalars/arrays and tuples -> plain Python so ``json.dumps`` accepts them."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


@dataclass
class ClusterNode:
    """One cluster of the hierarchy. ``members`` are client keys; for an internal node they
    are the members it held when it was split."""

    cluster_id: int
    members: list
    parent: int | None
    depth: int
    children: tuple[int, int] | None = None
    info: dict | None = None  # passed when the node was created (root, split or merge)
    split_info: dict | None = None  # passed when the node was split
    merged_into: int | None = None  # the node this leaf was merged into (then no longer a leaf)

    @property
    def is_leaf(self) -> bool:
        return self.children is None and self.merged_into is None


class ClusterTree:
    """Hierarchy of clusters built by successive bi-partitions, holding client KEYS.

    Cluster ids are integers handed out in creation order (root = 0). Only leaves are active
    clusters; ``split`` turns a leaf into an internal node with two new leaf children.
    """

    def __init__(self, member_keys: Sequence[Hashable], **info: Any) -> None:
        keys = list(member_keys)
        if len(set(keys)) != len(keys):
            raise ValueError("client keys must be unique")
        self.root_id = 0
        self._nodes: dict[int, ClusterNode] = {
            0: ClusterNode(0, keys, parent=None, depth=0, info=dict(info))
        }
        self._next_id = 1

    # ---- queries
    def node(self, cluster_id: int) -> ClusterNode:
        try:
            return self._nodes[cluster_id]
        except KeyError:
            raise KeyError(f"no cluster {cluster_id}") from None

    def members(self, cluster_id: int) -> list:
        """The cluster's current member keys, in the order positions refer to."""
        return list(self.node(cluster_id).members)

    def common_ancestor(self, a: int, b: int) -> int | None:
        """The nearest node both ``a`` and ``b`` descend from (either itself included), or
        None when they share none (a merged node has no parent)."""
        ancestors, node = set(), a
        while node is not None:
            ancestors.add(node)
            node = self.node(node).parent
        node = b
        while node is not None and node not in ancestors:
            node = self.node(node).parent
        return node

    def leaves(self) -> list[int]:
        """Ids of the active (leaf) clusters, in creation order."""
        return [cid for cid, n in self._nodes.items() if n.is_leaf]

    def assignment(self) -> dict:
        """client key -> id of the leaf cluster holding it."""
        return {key: cid for cid in self.leaves() for key in self._nodes[cid].members}

    def __len__(self) -> int:
        return len(self._nodes)

    # ---- changes
    def split(
        self,
        cluster_id: int,
        positions_a: Sequence[int] | np.ndarray,
        positions_b: Sequence[int] | np.ndarray,
        **info: Any,
    ) -> tuple[int, int]:
        """Split leaf ``cluster_id``; positions index into ``members(cluster_id)``.

        Returns the two new leaf ids (side a first). ``info`` (round, gap, …) is stored on
        the split node as ``split_info`` and on both children as ``info``.
        """
        node = self.node(cluster_id)
        if not node.is_leaf:
            raise ValueError(f"cluster {cluster_id} was already split")
        keys_a, keys_b = split_members(node.members, positions_a, positions_b)
        ids = []
        for keys in (keys_a, keys_b):
            cid = self._next_id
            self._next_id += 1
            self._nodes[cid] = ClusterNode(
                cid, keys, parent=cluster_id, depth=node.depth + 1, info=dict(info)
            )
            ids.append(cid)
        node.children = (ids[0], ids[1])
        node.split_info = dict(info)
        return ids[0], ids[1]

    def split_by_keys(
        self, cluster_id: int, keys_a: Sequence[Hashable], keys_b: Sequence[Hashable], **info: Any
    ) -> tuple[int, int]:
        """``split`` with the sides given as member keys (e.g. from ``reference_split``)."""
        index = {k: i for i, k in enumerate(self.node(cluster_id).members)}
        missing = [k for k in list(keys_a) + list(keys_b) if k not in index]
        if missing:
            raise ValueError(f"keys {missing} are not members of cluster {cluster_id}")
        return self.split(
            cluster_id, [index[k] for k in keys_a], [index[k] for k in keys_b], **info
        )

    def merge(self, a: int, b: int, **info: Any) -> int:
        """Merge leaves ``a`` and ``b`` into a new leaf holding both members (a's first);
        returns its id. ``a`` and ``b`` stay in the tree, pointing to it (``merged_into``);
        the new node's ``info`` records ``merged_from``. Its parent is None: a merge may join
        leaves of different branches, so the structure becomes a DAG."""
        if a == b:
            raise ValueError("a cluster cannot be merged with itself")
        na, nb = self.node(a), self.node(b)
        for node in (na, nb):
            if not node.is_leaf:
                raise ValueError(f"cluster {node.cluster_id} is not a leaf")
        cid = self._next_id
        self._next_id += 1
        self._nodes[cid] = ClusterNode(cid, list(na.members) + list(nb.members), parent=None,
                                       depth=min(na.depth, nb.depth), info={**info, "merged_from": [a, b]})
        na.merged_into = nb.merged_into = cid
        return cid

    def add_member(self, cluster_id: int, key: Hashable) -> None:
        """Place a newcomer in a leaf cluster (appended: existing positions do not move)."""
        node = self.node(cluster_id)
        if not node.is_leaf:
            raise ValueError(f"cluster {cluster_id} is not a leaf")
        if key in self.assignment():
            raise ValueError(f"client {key!r} is already assigned")
        node.members.append(key)

    def remove_member(self, cluster_id: int, key: Hashable) -> None:
        """Take a client out of a leaf cluster (to place it elsewhere with ``add_member``)."""
        node = self.node(cluster_id)
        if not node.is_leaf:
            raise ValueError(f"cluster {cluster_id} is not a leaf")
        if key not in node.members:
            raise ValueError(f"client {key!r} is not a member of cluster {cluster_id}")
        node.members.remove(key)

    # ---- serialisation
    def to_dict(self) -> dict:
        """JSON-serialisable view: root id and every node with members, parent, children,
        depth, leaf flag, creation info and split info."""
        nodes = []
        for cid, n in self._nodes.items():
            nodes.append(
                {
                    "id": cid,
                    "parent": n.parent,
                    "children": list(n.children) if n.children is not None else [],
                    "depth": n.depth,
                    "leaf": n.is_leaf,
                    "members": _jsonable(list(n.members)),
                    "info": _jsonable(n.info or {}),
                    "split_info": _jsonable(n.split_info) if n.split_info is not None else None,
                    "merged_into": n.merged_into,
                }
            )
        return {"root": self.root_id, "nodes": nodes}

    @classmethod
    def from_dict(cls, data: dict) -> ClusterTree:
        """Rebuild a tree written by ``to_dict`` (keys come back as JSON gave them)."""
        tree = cls.__new__(cls)
        tree.root_id = int(data["root"])
        tree._nodes = {}
        for d in data["nodes"]:
            children = tuple(d["children"]) if d["children"] else None
            tree._nodes[int(d["id"])] = ClusterNode(
                int(d["id"]),
                list(d["members"]),
                parent=d["parent"],
                depth=int(d["depth"]),
                children=children,
                info=dict(d.get("info") or {}),
                split_info=d.get("split_info"),
                merged_into=d.get("merged_into"),
            )
        tree._next_id = max(tree._nodes) + 1
        return tree
