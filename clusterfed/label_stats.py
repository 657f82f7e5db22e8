"""Label-histogram statistics a client reports (AdaCFL's L_c and s_c), NumPy only.

Kept out of ``clusterfed.clustering`` (which needs SciPy) so that a device's ClientApp
imports without SciPy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def _counts(histogram: Sequence[float] | Mapping[object, float] | np.ndarray) -> np.ndarray:
    values = list(histogram.values()) if isinstance(histogram, Mapping) else histogram
    counts = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise ValueError("label histogram must hold finite, non-negative counts")
    return counts


def label_entropy(histogram: Sequence[float] | Mapping[object, float] | np.ndarray) -> float:
    """Shannon entropy in bits of a label histogram (counts per class; a list, an array
    or a mapping class -> count). Classes with count 0 contribute nothing; an empty
    histogram has entropy 0."""
    counts = _counts(histogram)
    counts = counts[counts > 0]
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts / total
    return float(max(0.0, -np.sum(p * np.log2(p))))  # max: no -0.0 for one class


def num_classes_present(histogram: Sequence[float] | Mapping[object, float] | np.ndarray) -> int:
    """L_c: the number of classes with a positive count."""
    return int(np.count_nonzero(_counts(histogram) > 0))
