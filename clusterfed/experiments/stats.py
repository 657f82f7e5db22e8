"""The one mean ± std over seeds (or any repeats) that every table of the project uses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np


class MeanStd(NamedTuple):
    """Mean and population std of the values present; ``present`` of ``total`` had a value."""

    mean: float | None
    std: float | None
    present: int
    total: int

    def format(self, digits: int = 3, *, general: bool = False) -> str:
        """``mean ± std`` (just the mean for one value; "–" for none), ``(k/n)`` when values are missing.
        ``general``: ``digits`` significant digits (``%g``) instead of decimals."""
        if self.mean is None:
            return "–"
        spec = f".{digits}g" if general else f".{digits}f"
        std_spec = f".{max(digits - 1, 1)}g" if general else spec
        text = f"{self.mean:{spec}}" if self.present == 1 else f"{self.mean:{spec}} ± {self.std:{std_spec}}"
        if self.present < self.total:
            text += f" ({self.present}/{self.total})"
        return text


def mean_std(values: Iterable[float | int | None]) -> MeanStd:
    """Mean ± std over the values that are not None. A std below float summation noise is 0."""
    values = list(values)
    present = np.array([v for v in values if v is not None], dtype=float)
    if not len(present):
        return MeanStd(None, None, 0, len(values))
    mean = float(present.mean())
    std = float(present.std())
    if std <= 1e-9 * max(abs(mean), 1.0):  # equal up to float summation order
        std = 0.0
    return MeanStd(mean, std, len(present), len(values))
