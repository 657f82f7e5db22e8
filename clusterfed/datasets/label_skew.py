"""Label-skew partitioners: clients differ in which labels they hold (Dirichlet shares,
k labels each, shards, a dominant class per group, fixed label groups). Each works on the
label vector alone and returns drafts with the number of groups where it is data-derived."""

from __future__ import annotations

import re

import numpy as np

from .partition_base import Draft, PartitionError, sizes_with_minimum

DEFAULT_LABEL_GROUPS = "0-3;3-6;4-9;0-9"
_MAX_TRIES = 100


def split_among_holders(labels: np.ndarray, holds, num_classes: int, rng: np.random.Generator) -> list[list[np.ndarray]]:
    """Each label's example indices, shuffled and split evenly among the holders that want
    it (``holds[h]``: the labels holder h wants); per holder, its shares in label order."""
    shares_of: list[list[np.ndarray]] = [[] for _ in holds]
    for label in range(num_classes):
        holders = [h for h, wanted in enumerate(holds) if label in wanted]
        if not holders:
            continue
        shares = np.array_split(rng.permutation(np.flatnonzero(labels == label)), len(holders))
        for h, share in zip(holders, shares):
            shares_of[h].append(share)
    return shares_of


def dirichlet(labels, num_classes, num_clients, beta, min_samples, rng):
    """Classic LDA split (NIID-Bench): per class, client shares ~ Dir(beta).

    No true groups exist; the ground truth is the client's most frequent label (ids
    renumbered 0..G-1 over the labels that occur as a most frequent one).
    """
    if beta <= 0:
        raise PartitionError(f"beta must be > 0, got {beta}")
    n = len(labels)
    by_class = [np.flatnonzero(labels == k) for k in range(num_classes)]
    smallest = 0
    for _ in range(_MAX_TRIES):
        pools: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx_k in by_class:
            if len(idx_k) == 0:
                continue
            idx_k = rng.permutation(idx_k)
            props = rng.dirichlet(np.full(num_clients, beta))
            # NIID-Bench balance trick: a client already holding its fair share gets no more.
            sizes = np.array([sum(len(p) for p in pool) for pool in pools])
            props = props * (sizes < n / num_clients)
            if props.sum() == 0:
                props = np.full(num_clients, 1.0 / num_clients)
            props = props / props.sum()
            cuts = (np.cumsum(props) * len(idx_k)).astype(int)[:-1]
            for pool, part in zip(pools, np.split(idx_k, cuts)):
                pool.append(part)
        idxs = [np.concatenate(pool) if pool else np.empty(0, np.int64) for pool in pools]
        smallest = min(len(i) for i in idxs)
        if smallest >= min_samples:
            dominant = [int(np.argmax(np.bincount(labels[i], minlength=num_classes))) for i in idxs]
            group_ids, groups = _renumber(dominant)
            return [Draft(i, g) for i, g in zip(idxs, groups)], len(group_ids)
    raise PartitionError(
        f"partition 'dirichlet' (beta={beta}): after {_MAX_TRIES} draws some client still had "
        f"fewer than min_samples={min_samples} samples (smallest {smallest}); use fewer clients, "
        "a larger beta or a smaller min-samples"
    )


def label_skew(labels, num_classes, num_clients, k, rng):
    """NIID-Bench `#C=k`: client i holds label i % C and k-1 further distinct random labels;
    each label's samples are split evenly among the clients holding it."""
    if not 1 <= k <= num_classes:
        raise PartitionError(f"labels_per_client must be in 1..{num_classes}, got {k}")
    holds: list[list[int]] = []
    for i in range(num_clients):
        first = i % num_classes
        others = rng.permutation(np.delete(np.arange(num_classes), first))[: k - 1]
        holds.append([first, *others.tolist()])
    idxs = split_among_holders(labels, holds, num_classes, rng)
    sets = [tuple(sorted(h)) for h in holds]
    group_ids, groups = _renumber(sets)
    return [Draft(np.concatenate(p), g) for p, g in zip(idxs, groups)], len(group_ids)


def shards(labels, num_clients, rng):
    """McMahan et al.: sort by label, cut 2*m shards, give each client 2 random shards.

    Ground truth: the set of the shards' majority labels."""
    # Shuffle first so that samples of one label are in random order within the sort.
    shuffled = rng.permutation(len(labels))
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(order, 2 * num_clients)
    pick = rng.permutation(2 * num_clients).reshape(num_clients, 2)
    idxs, sets = [], []
    for a, b in pick:
        idxs.append(np.concatenate([shards[a], shards[b]]))
        majority = {_majority(labels[shards[a]]), _majority(labels[shards[b]])}
        sets.append(tuple(sorted(majority)))
    group_ids, groups = _renumber(sets)
    return [Draft(i, g) for i, g in zip(idxs, groups)], len(group_ids)


def dominant(labels, num_classes, num_clients, num_groups, alpha, rng):
    """Client i is in group g = i % G; a fraction alpha of its samples is class g % C,
    the rest split evenly over the other classes.

    All clients get the same size n, the largest for which no class is over-drawn, so
    the pool is divided without using a sample twice."""
    if num_classes < 2:
        raise PartitionError("partition 'dominant' needs at least 2 classes")
    if not 0.0 <= alpha <= 1.0:
        raise PartitionError(f"alpha must be in [0, 1], got {alpha}")
    if num_groups < 1:
        raise PartitionError(f"num_groups must be >= 1, got {num_groups}")
    counts = np.bincount(labels, minlength=num_classes)
    groups = np.arange(num_clients) % num_groups
    dominant = groups % num_classes

    def demand(n: int) -> np.ndarray:
        """(clients, classes) sample counts for client size n."""
        table = np.zeros((num_clients, num_classes), dtype=np.int64)
        n_dom = int(round(alpha * n))
        rest = n - n_dom
        for i in range(num_clients):
            others = np.delete(np.arange(num_classes), dominant[i])
            share = np.full(num_classes - 1, rest // (num_classes - 1))
            # Rotate where the remainder goes so that it spreads over the classes.
            extra = (i + np.arange(rest % (num_classes - 1))) % (num_classes - 1)
            share[extra] += 1
            table[i, others] = share
            table[i, dominant[i]] = n_dom
        return table

    n = len(labels) // num_clients
    table = demand(n)
    while n > 0 and np.any(table.sum(axis=0) > counts):
        # Jump close to the feasible size, then step down for the rounding remainders.
        ratio = np.min(counts / np.maximum(table.sum(axis=0), 1))
        n = min(n - 1, int(n * ratio) + 1)
        table = demand(n)
    by_class = [rng.permutation(np.flatnonzero(labels == k)) for k in range(num_classes)]
    taken = np.zeros(num_classes, dtype=np.int64)
    drafts = []
    for i in range(num_clients):
        parts = []
        for k in range(num_classes):
            parts.append(by_class[k][taken[k] : taken[k] + table[i, k]])
            taken[k] += table[i, k]
        drafts.append(Draft(np.concatenate(parts), int(groups[i])))
    return drafts


def parse_label_groups(spec: str, num_classes: int) -> list[list[int]]:
    """Parse `0-3;3-6;4-9;0-9` or `0,1;2,3`: groups split by ';', items by ',',
    `a-b` an inclusive range.  Empty spec -> the default clipped to num_classes."""
    fmt = "groups separated by ';', each a comma list of labels or inclusive ranges, e.g. '0-3;3-6;4-9;0-9' or '0,1;2,3'"
    clip = not spec.strip()
    text = DEFAULT_LABEL_GROUPS if clip else spec
    groups: list[list[int]] = []
    for chunk in text.split(";"):
        members: set[int] = set()
        items = [item.strip() for item in chunk.split(",")]
        for item in items:
            m = re.fullmatch(r"(\d+)\s*(?:-\s*(\d+))?", item)
            if m is None:
                raise PartitionError(f"malformed label-groups {spec!r} (item {item!r}): expected {fmt}")
            lo = int(m.group(1))
            hi = int(m.group(2)) if m.group(2) is not None else lo
            if hi < lo:
                raise PartitionError(f"malformed label-groups {spec!r}: range {item!r} runs backwards; expected {fmt}")
            if clip:
                hi = min(hi, num_classes - 1)
            elif hi >= num_classes:
                raise PartitionError(
                    f"label-groups {spec!r}: label {hi} out of range 0..{num_classes - 1}"
                )
            members.update(range(lo, hi + 1))
        if members:
            groups.append(sorted(members))
        elif not clip:
            raise PartitionError(f"malformed label-groups {spec!r}: empty group; expected {fmt}")
    return groups


def label_groups(labels, num_classes, num_clients, spec, min_samples, rng):
    """Client i is in group i % G and draws only that group's labels.

    A label wanted by several groups is split evenly among them; within a group the
    client sizes follow Dirichlet(1.0) conditioned on every client having >= min_samples
    (for Dir(1), i.e. uniform on the simplex, that conditional is exactly min_samples
    each plus a Dir(1) split of the rest, so no rejection loop is needed)."""
    wanted = parse_label_groups(spec, num_classes)
    num_groups = len(wanted)
    group_pools = split_among_holders(labels, wanted, num_classes, rng)
    groups = np.arange(num_clients) % num_groups
    drafts: list[Draft | None] = [None] * num_clients
    for g in range(num_groups):
        members = np.flatnonzero(groups == g)
        if len(members) == 0:
            continue
        pool = rng.permutation(np.concatenate(group_pools[g]))
        sizes = sizes_with_minimum(len(pool), len(members), 1.0, min_samples, rng)
        if sizes is None:
            raise PartitionError(
                f"partition 'label-groups': group {g} (labels {_fmt_labels(wanted[g])}) has "
                f"{len(pool)} samples for {len(members)} clients, fewer than "
                f"min_samples={min_samples} each; use fewer clients or a smaller min-samples"
            )
        for i, part in zip(members, np.split(pool, np.cumsum(sizes)[:-1])):
            drafts[i] = Draft(part, g)
    return drafts, num_groups



def _majority(y: np.ndarray) -> int:
    return int(np.argmax(np.bincount(y)))


def _renumber(keys: list) -> tuple[list, list[int]]:
    """Map hashable keys to ids 0..G-1 in sorted key order."""
    distinct = sorted(set(keys))
    lookup = {k: g for g, k in enumerate(distinct)}
    return distinct, [lookup[k] for k in keys]


def _fmt_labels(members: list[int]) -> str:
    return ",".join(str(m) for m in members)
