"""Update rows denoised by their leading principal components, for the bi-partition of many
small clients.

A client of ten examples sends an update dominated by the noise of its few batches: the
cosine of two such updates is near 0 whether or not they share a group, so at a thousand
clients the complete-linkage bi-partition of raw cosines (Sattler et al.) finds no structure.
The groups' pulls are shared by hundreds of rows while the noise is not: the leading
principal components of the centred rows (their mean, the cluster's common progress,
removed) span the groups' mean differences, and the rest of the space holds noise only. The
rows' coordinates on the first ``rank`` components (PCA scores) keep the group structure and
drop most of the noise; cosines of these scores are what the bi-partition then compares.

The scores come from the eigen-decomposition of the m × m Gram matrix of the centred rows
(the cost of the cosine matrix itself), not from an SVD of the m × d rows.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import eigh


def principal_scores(U: np.ndarray, rank: int) -> np.ndarray:
    """(m, d) rows -> (m, r) coordinates of the centred rows on their ``rank`` leading
    principal components (r = min(rank, m − 1); components of zero variance dropped)."""
    U = np.asarray(U, dtype=np.float64)
    if U.ndim != 2 or U.shape[0] < 2:
        raise ValueError(f"expected an (m, d) matrix with m >= 2 rows, got shape {U.shape}")
    if rank < 1:
        raise ValueError(f"rank must be at least 1, got {rank}")
    m = U.shape[0]
    centred = U - U.mean(axis=0)
    gram = centred @ centred.T
    r = min(int(rank), m - 1)
    values, vectors = eigh(gram, subset_by_index=[m - r, m - 1])
    order = np.argsort(values)[::-1]
    values, vectors = values[order], vectors[:, order]
    keep = values > values[0] * 1e-12 if values[0] > 0 else np.zeros_like(values, dtype=bool)
    return vectors[:, keep] * np.sqrt(values[keep])
