"""Partitioners over IID samples: clients hold the same label mix and differ by a per-group
shift instead (none, image rotation, sample count, a label permutation). Each returns drafts
(and the number of groups where it is data-derived)."""

from __future__ import annotations

import math

import numpy as np

from .partition_base import Draft, PartitionError, sizes_with_minimum


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[Draft]:
    return [Draft(idx, 0) for idx in np.array_split(rng.permutation(len(labels)), num_clients)]


def parse_rotations(spec: str) -> list[float]:
    try:
        angles = [float(a) for a in spec.split(",") if a.strip()]
    except ValueError:
        angles = []
    if not angles:
        raise PartitionError(f"malformed rotations {spec!r}: expected comma-separated degrees, e.g. '0,90,180,270'")
    return angles


def rotation(labels, num_clients, spec, rng):
    """IID samples; client i is in group i % G and sees its images rotated by angle G."""
    angles = parse_rotations(spec)
    drafts = iid(labels, num_clients, rng)
    for i, d in enumerate(drafts):
        d.group = i % len(angles)
        d.rotation = angles[d.group]
    return drafts, len(angles)


def quantity(labels, num_clients, beta, min_samples, rng):
    """IID labels, client sizes ~ Dir(beta).  min_samples is given to every client
    first and the rest split by Dir(beta), so large client counts never fail by chance."""
    if beta <= 0:
        raise PartitionError(f"beta must be > 0, got {beta}")
    sizes = sizes_with_minimum(len(labels), num_clients, beta, min_samples, rng)
    if sizes is None:
        raise PartitionError(
            f"partition 'quantity': {len(labels)} samples cannot give {num_clients} clients "
            f"min_samples={min_samples} each; use fewer clients or a smaller min-samples"
        )
    parts = np.split(rng.permutation(len(labels)), np.cumsum(sizes)[:-1])
    return [Draft(p, 0) for p in parts]


def label_swap(labels, num_classes, num_clients, num_groups, rng):
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
    drafts = iid(labels, num_clients, rng)
    for i, d in enumerate(drafts):
        d.group = i % num_groups
        d.label_perm = perms[d.group].copy()
    return drafts
