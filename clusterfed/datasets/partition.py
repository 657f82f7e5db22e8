"""Seeded non-IID partitioners: split a labelled pool over clients with ground-truth groups.

Every partitioner works on the label vector only (pure NumPy) and returns indices into the
pool; images are touched only by `client_arrays`, which applies a client's rotation and
label permutation.  Ground-truth group ids are for metrics only and lie in
range(num_groups).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .sources import DataSource

PARTITIONERS = (
    "iid",
    "dirichlet",
    "label-skew",
    "shards",
    "dominant",
    "label-groups",
    "rotation",
    "quantity",
    "label-swap",
)

DEFAULT_LABEL_GROUPS = "0-3;3-6;4-9;0-9"
_MAX_TRIES = 100


class PartitionError(ValueError):
    """The requested partition cannot be built; the message says what to change."""


@dataclass
class ClientPartition:
    train_idx: np.ndarray  # indices into the source pool
    test_idx: np.ndarray
    group: int  # ground-truth group id (metrics only)
    rotation: float = 0.0  # degrees applied to this client's images
    label_perm: np.ndarray | None = None  # label-swap: y -> label_perm[y]

    @property
    def num_samples(self) -> int:
        return int(len(self.train_idx) + len(self.test_idx))


@dataclass
class Partition:
    clients: list[ClientPartition]
    num_groups: int
    name: str

    def groups(self) -> np.ndarray:
        return np.array([c.group for c in self.clients], dtype=np.int64)


@dataclass
class _Draft:
    """A client's whole pool before the train/test split."""

    idx: np.ndarray
    group: int
    rotation: float = 0.0
    label_perm: np.ndarray | None = None


# ---------------------------------------------------------------------------------------
# public entry points


def make_partition(
    labels: np.ndarray,
    num_classes: int,
    *,
    name: str,
    num_clients: int,
    num_groups: int = 4,
    alpha: float = 0.7,
    beta: float = 0.5,
    labels_per_client: int = 2,
    label_groups: str = "",
    rotations: str = "0,90,180,270",
    min_samples: int = 10,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> Partition:
    """Split the pool with labels `labels` over `num_clients` clients by setting `name`.

    Same arguments and seed give an identical partition.  See PARTITIONERS for the names;
    `alpha` is the dominant-class fraction (`dominant`), `beta` the Dirichlet
    concentration (`dirichlet`, `quantity`).
    """
    if name not in PARTITIONERS:
        raise PartitionError(f"unknown partitioner {name!r}; choose one of: {', '.join(PARTITIONERS)}")
    labels = np.asarray(labels).astype(np.int64, copy=False)
    if labels.ndim != 1:
        raise PartitionError(f"labels must be one-dimensional, got shape {labels.shape}")
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > len(labels):
        raise PartitionError(
            f"num_clients={num_clients} exceeds the {len(labels)} samples in the pool; use fewer clients"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise PartitionError(f"labels must lie in 0..{num_classes - 1}")
    if not 0.0 <= test_fraction < 1.0:
        raise PartitionError(f"test_fraction must be in [0, 1), got {test_fraction}")

    rng = np.random.default_rng(seed)
    if name == "iid":
        drafts, groups = _iid(labels, num_clients, rng), 1
    elif name == "dirichlet":
        drafts, groups = _dirichlet(labels, num_classes, num_clients, beta, min_samples, rng)
    elif name == "label-skew":
        drafts, groups = _label_skew(labels, num_classes, num_clients, labels_per_client, rng)
    elif name == "shards":
        drafts, groups = _shards(labels, num_clients, rng)
    elif name == "dominant":
        drafts, groups = _dominant(labels, num_classes, num_clients, num_groups, alpha, rng), num_groups
    elif name == "label-groups":
        drafts, groups = _label_groups(labels, num_classes, num_clients, label_groups, min_samples, rng)
    elif name == "rotation":
        drafts, groups = _rotation(labels, num_clients, rotations, rng)
    elif name == "quantity":
        drafts, groups = _quantity(labels, num_clients, beta, min_samples, rng), 1
    else:  # label-swap
        drafts, groups = _label_swap(labels, num_classes, num_clients, num_groups, rng), num_groups

    for i, draft in enumerate(drafts):
        if len(draft.idx) < min_samples:
            raise PartitionError(
                f"partition {name!r}: client {i} gets {len(draft.idx)} samples, fewer than "
                f"min_samples={min_samples}; use fewer clients or a smaller min-samples"
            )
        size = len(draft.idx)
        if test_fraction > 0 and size >= 2 and size - math.ceil(test_fraction * size) < 1:
            raise PartitionError(
                f"partition {name!r}: test-fraction {test_fraction:g} leaves client {i} ({size} samples) "
                f"no training data; lower test-fraction"
            )
    clients = []
    for draft in drafts:
        train_idx, test_idx = _train_test(draft.idx, labels, test_fraction, rng)
        clients.append(ClientPartition(train_idx, test_idx, int(draft.group), draft.rotation, draft.label_perm))
    return Partition(clients=clients, num_groups=int(groups), name=name)


def client_arrays(
    source: DataSource, part: ClientPartition
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) of one client, rotated and label-permuted."""

    def take(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = rotate_images(source.x[idx], part.rotation)
        y = source.y[idx]
        if part.label_perm is not None:
            y = np.asarray(part.label_perm, dtype=np.int64)[y]
        return np.ascontiguousarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64).copy()

    x_train, y_train = take(part.train_idx)
    x_test, y_test = take(part.test_idx)
    return x_train, y_train, x_test, y_test


def rotate_images(x: np.ndarray, degrees: float) -> np.ndarray:
    """Rotate (N, C, H, W) images counter-clockwise by `degrees`.

    Multiples of 90 use np.rot90 (exact); other angles interpolate bilinearly, filling
    the corners with the nearest edge pixel (the normalised background, not 0).
    """
    angle = float(degrees) % 360.0
    if angle == 0.0:
        return x
    if angle % 90.0 == 0.0:
        return np.rot90(x, k=int(angle // 90), axes=(2, 3))
    return _rotate_interpolated(x, angle)


def _rotate_interpolated(x: np.ndarray, angle: float) -> np.ndarray:
    from scipy import ndimage

    # axes=(3, 2) makes a positive angle turn the same way as np.rot90(axes=(2, 3)).
    return ndimage.rotate(x, angle, axes=(3, 2), reshape=False, order=1, mode="nearest")


# ---------------------------------------------------------------------------------------
# partitioners: each returns drafts (and the number of groups where it is data-derived)


def _iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[_Draft]:
    return [_Draft(idx, 0) for idx in np.array_split(rng.permutation(len(labels)), num_clients)]


def _dirichlet(labels, num_classes, num_clients, beta, min_samples, rng):
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
            return [_Draft(i, g) for i, g in zip(idxs, groups)], len(group_ids)
    raise PartitionError(
        f"partition 'dirichlet' (beta={beta}): after {_MAX_TRIES} draws some client still had "
        f"fewer than min_samples={min_samples} samples (smallest {smallest}); use fewer clients, "
        "a larger beta or a smaller min-samples"
    )


def _label_skew(labels, num_classes, num_clients, k, rng):
    """NIID-Bench `#C=k`: client i holds label i % C and k-1 further distinct random labels;
    each label's samples are split evenly among the clients holding it."""
    if not 1 <= k <= num_classes:
        raise PartitionError(f"labels_per_client must be in 1..{num_classes}, got {k}")
    holds: list[list[int]] = []
    for i in range(num_clients):
        first = i % num_classes
        others = rng.permutation(np.delete(np.arange(num_classes), first))[: k - 1]
        holds.append([first, *others.tolist()])
    idxs: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in range(num_classes):
        holders = [i for i, h in enumerate(holds) if label in h]
        if not holders:
            continue
        shares = np.array_split(rng.permutation(np.flatnonzero(labels == label)), len(holders))
        for i, share in zip(holders, shares):
            idxs[i].append(share)
    sets = [tuple(sorted(h)) for h in holds]
    group_ids, groups = _renumber(sets)
    return [_Draft(np.concatenate(p), g) for p, g in zip(idxs, groups)], len(group_ids)


def _shards(labels, num_clients, rng):
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
    return [_Draft(i, g) for i, g in zip(idxs, groups)], len(group_ids)


def _dominant(labels, num_classes, num_clients, num_groups, alpha, rng):
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
        drafts.append(_Draft(np.concatenate(parts), int(groups[i])))
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


def _label_groups(labels, num_classes, num_clients, spec, min_samples, rng):
    """Client i is in group i % G and draws only that group's labels.

    A label wanted by several groups is split evenly among them; within a group the
    client sizes follow Dirichlet(1.0) conditioned on every client having >= min_samples
    (for Dir(1), i.e. uniform on the simplex, that conditional is exactly min_samples
    each plus a Dir(1) split of the rest, so no rejection loop is needed)."""
    wanted = parse_label_groups(spec, num_classes)
    num_groups = len(wanted)
    group_pools: list[list[np.ndarray]] = [[] for _ in range(num_groups)]
    for label in range(num_classes):
        holders = [g for g, members in enumerate(wanted) if label in members]
        if not holders:
            continue
        shares = np.array_split(rng.permutation(np.flatnonzero(labels == label)), len(holders))
        for g, share in zip(holders, shares):
            group_pools[g].append(share)
    groups = np.arange(num_clients) % num_groups
    drafts: list[_Draft | None] = [None] * num_clients
    for g in range(num_groups):
        members = np.flatnonzero(groups == g)
        if len(members) == 0:
            continue
        pool = rng.permutation(np.concatenate(group_pools[g]))
        sizes = _sizes_with_minimum(len(pool), len(members), 1.0, min_samples, rng)
        if sizes is None:
            raise PartitionError(
                f"partition 'label-groups': group {g} (labels {_fmt_labels(wanted[g])}) has "
                f"{len(pool)} samples for {len(members)} clients, fewer than "
                f"min_samples={min_samples} each; use fewer clients or a smaller min-samples"
            )
        for i, part in zip(members, np.split(pool, np.cumsum(sizes)[:-1])):
            drafts[i] = _Draft(part, g)
    return drafts, num_groups


def parse_rotations(spec: str) -> list[float]:
    try:
        angles = [float(a) for a in spec.split(",") if a.strip()]
    except ValueError:
        angles = []
    if not angles:
        raise PartitionError(f"malformed rotations {spec!r}: expected comma-separated degrees, e.g. '0,90,180,270'")
    return angles


def _rotation(labels, num_clients, spec, rng):
    """IID samples; client i is in group i % G and sees its images rotated by angle G."""
    angles = parse_rotations(spec)
    drafts = _iid(labels, num_clients, rng)
    for i, d in enumerate(drafts):
        d.group = i % len(angles)
        d.rotation = angles[d.group]
    return drafts, len(angles)


def _quantity(labels, num_clients, beta, min_samples, rng):
    """IID labels, client sizes ~ Dir(beta).  min_samples is given to every client
    first and the rest split by Dir(beta), so large client counts never fail by chance."""
    if beta <= 0:
        raise PartitionError(f"beta must be > 0, got {beta}")
    sizes = _sizes_with_minimum(len(labels), num_clients, beta, min_samples, rng)
    if sizes is None:
        raise PartitionError(
            f"partition 'quantity': {len(labels)} samples cannot give {num_clients} clients "
            f"min_samples={min_samples} each; use fewer clients or a smaller min-samples"
        )
    parts = np.split(rng.permutation(len(labels)), np.cumsum(sizes)[:-1])
    return [_Draft(p, 0) for p in parts]


def _label_swap(labels, num_classes, num_clients, num_groups, rng):
    """IID samples; group g = i % G relabels y -> perm_g[y]; perm_0 is the identity, the
    others distinct, seeded, non-identity permutations."""
    if num_groups < 1:
        raise PartitionError(f"num_groups must be >= 1, got {num_groups}")
    if num_groups > math.factorial(min(num_classes, 20)):
        raise PartitionError(
            f"partition 'label-swap': {num_classes} classes allow only "
            f"{math.factorial(num_classes)} distinct label permutations, not {num_groups} groups"
        )
    perms = [np.arange(num_classes, dtype=np.int64)]
    seen = {tuple(perms[0])}
    while len(perms) < num_groups:
        perm = rng.permutation(num_classes).astype(np.int64)
        if tuple(perm) not in seen:
            seen.add(tuple(perm))
            perms.append(perm)
    drafts = _iid(labels, num_clients, rng)
    for i, d in enumerate(drafts):
        d.group = i % num_groups
        d.label_perm = perms[d.group].copy()
    return drafts


# ---------------------------------------------------------------------------------------
# helpers


def _sizes_with_minimum(total, parts, concentration, minimum, rng) -> np.ndarray | None:
    """Integer sizes summing to `total`: `minimum` each plus a Dir(concentration) split
    of the remainder (largest-remainder rounding).  None if total < parts * minimum."""
    spare = total - parts * minimum
    if spare < 0:
        return None
    props = rng.dirichlet(np.full(parts, float(concentration)))
    raw = props * spare
    sizes = np.floor(raw).astype(np.int64)
    short = spare - int(sizes.sum())
    sizes[np.argsort(-(raw - sizes), kind="stable")[:short]] += 1
    return sizes + minimum


def _train_test(idx, labels, test_fraction, rng) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train/test split of one client's pool, stratified by label when possible."""
    from sklearn.model_selection import train_test_split

    idx = np.asarray(idx, dtype=np.int64)
    state = int(rng.integers(2**31 - 1))  # drawn always, so the stream does not depend on the data
    if test_fraction == 0.0 or len(idx) < 2:
        return np.sort(idx), np.empty(0, dtype=np.int64)
    y = labels[idx]
    stratify = y if np.unique(y, return_counts=True)[1].min() >= 2 else None
    try:
        train, test = train_test_split(idx, test_size=test_fraction, random_state=state, stratify=stratify)
    except ValueError:
        # Too few test (or train) slots for one sample of every label: split unstratified.
        train, test = train_test_split(idx, test_size=test_fraction, random_state=state)
    return np.sort(train), np.sort(test)


def _majority(y: np.ndarray) -> int:
    return int(np.argmax(np.bincount(y)))


def _renumber(keys: list) -> tuple[list, list[int]]:
    """Map hashable keys to ids 0..G-1 in sorted key order."""
    distinct = sorted(set(keys))
    lookup = {k: g for g, k in enumerate(distinct)}
    return distinct, [lookup[k] for k in keys]


def _fmt_labels(members: list[int]) -> str:
    return ",".join(str(m) for m in members)
