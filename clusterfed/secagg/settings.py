"""The protocol's settings (one typed, validated object) and what they come to for a group of n.

``SecAggSettings`` is checked once, when built: a bad combination raises ``SecAggSettingsError``
with one sentence per problem, before any member is asked anything. ``group_plan`` turns the
settings into one group's numbers (shares, threshold, dropouts tolerated) or raises
``GroupTooSmall`` for a group below the minimum (the small-group rule: the package docstring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class SecAggError(RuntimeError):
    """Secure aggregation could not finish for a group (too many members dropped, or a member
    broke the protocol). The group's sum is not produced; nothing individual was revealed."""


class SecAggSettingsError(ValueError):
    """The secure-aggregation settings do not fit together (raised before any stage)."""


class GroupTooSmall(ValueError):
    """A group is below the minimum size for secure aggregation: it is not aggregated (rule in
    the package docstring), never summed in the clear."""


class SecAggSettings(BaseModel):
    """Settings of SecAgg+ (Bell et al., CCS 2020) run inside each group of clients.

    Every value has a default that is safe to run with; build it with keywords
    (``SecAggSettings(threshold=0.75)``) or from a run config with the dashed names
    (``SecAggSettings(**{"clipping-range": 4.0})``).
    """

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    shares: int | None = Field(
        None, ge=3,
        description="how many members hold shares of each member's secrets, itself included (SecAgg+'s "
                    "neighbourhood; odd: itself and as many neighbours on each side of a ring); None = every "
                    "member of the group (SecAgg's complete graph). A group smaller than this uses all its members")
    threshold: int | float = Field(
        2 / 3,
        description="shares needed to rebuild a member's secret: a fraction in [0.5, 1] of the member's shares "
                    "(rounded up, at least 2), or a count >= 2. Up to (shares - threshold) members may drop; "
                    "fewer than threshold colluding members learn nothing about another's secrets")
    clipping_range: float = Field(
        8.0, alias="clipping-range", gt=0, allow_inf_nan=False,
        description="every value a client returns is clipped to [-clipping_range, clipping_range] before "
                    "quantization (the values clipped are counted, and only their total over the group is revealed)")
    quantization_range: int = Field(
        2**24, alias="quantization-range", ge=2**4, le=2**40,
        description="number of quantization steps over [-clipping_range, clipping_range]: the weighted mean of "
                    "the group is off by less than 2 * clipping_range / quantization_range per value")
    modulus: int = Field(
        2**64, ge=2**16, le=2**64,
        description="masks and sums are taken modulo this power of two; up to 2**32 the masked vector travels "
                    "as uint32, above as uint64. Must exceed the largest possible group sum "
                    "(members * max_weight * quantization_range)")
    max_weight: int = Field(
        2**20, alias="max-weight", ge=1,
        description="the largest weight (num-examples) one member may report; a larger one fails that member's "
                    "reply (it counts as dropped)")
    weight_key: str | None = Field(
        "num-examples", alias="weight-key",
        description="the reply metric each member's arrays are weighted by (sent masked, never in the clear); "
                    "None = equal weights (1 per member)")
    min_group_size: int = Field(
        3, alias="min-group-size", ge=3,
        description="a group smaller than this (or than an integer threshold) is not securely aggregated: "
                    "its members are not asked for updates and its model is kept; a round in which fewer members "
                    "than this complete ends with SecAggError")

    def __init__(self, **values: object) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise SecAggSettingsError(_describe(error)) from None

    @model_validator(mode="after")
    def _fit_together(self) -> SecAggSettings:
        problems = []
        if isinstance(self.threshold, bool):
            problems.append("threshold must be a number, not a bool")
        elif isinstance(self.threshold, float) and not 0.5 <= self.threshold <= 1:
            problems.append(f"threshold as a fraction of the shares must be in [0.5, 1], got {self.threshold}")
        elif isinstance(self.threshold, int) and self.threshold < 2:
            problems.append(f"threshold as a count must be at least 2 (1 share would reveal a secret), "
                            f"got {self.threshold}")
        elif isinstance(self.threshold, int) and self.shares is not None and self.threshold > self.shares:
            problems.append(f"threshold ({self.threshold}) cannot exceed shares ({self.shares})")
        if self.shares is not None and self.shares % 2 == 0:
            problems.append(f"shares must be odd (a member and the same number of neighbours on each side), "
                            f"got {self.shares}")
        if self.modulus & (self.modulus - 1):
            problems.append(f"modulus must be a power of two, got {self.modulus}")
        elif self.max_weight * self.quantization_range >= self.modulus:
            problems.append(f"modulus ({self.modulus}) must exceed max_weight * quantization_range "
                            f"({self.max_weight * self.quantization_range}): one member's weighted values would wrap")
        if self.weight_key == "":
            problems.append("weight_key must be a metric name or None (equal weights)")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def modulus_bits(self) -> int:
        return self.modulus.bit_length() - 1

    def minimum_group_size(self) -> int:
        """The smallest group this protocol runs in."""
        fixed = self.threshold if isinstance(self.threshold, int) else 0
        return max(self.min_group_size, fixed)


@dataclass(frozen=True)
class GroupPlan:
    """One group's numbers: its size, the shares per member (itself included), the threshold,
    and how many members may drop after the key exchange with the sum still produced."""

    size: int
    shares: int
    threshold: int
    tolerated_dropouts: int
    complete_graph: bool


def group_plan(settings: SecAggSettings, size: int) -> GroupPlan:
    """The numbers for a group of ``size``; GroupTooSmall below the minimum, SecAggSettingsError
    when the modulus cannot hold the group's sum."""
    minimum = settings.minimum_group_size()
    if size < minimum:
        raise GroupTooSmall(
            f"a group of {size} member(s) is below the secure-aggregation minimum of {minimum} "
            f"(min_group_size={settings.min_group_size}, threshold={settings.threshold}): it is not aggregated "
            f"this round (its members are not asked for updates and its model is kept), never summed in the clear")
    if size * settings.max_weight * settings.quantization_range >= settings.modulus:
        raise SecAggSettingsError(
            f"modulus ({settings.modulus}) must exceed members * max_weight * quantization_range "
            f"({size} * {settings.max_weight} * {settings.quantization_range}) for a group of {size}")
    shares = size if settings.shares is None else min(settings.shares, size)
    if isinstance(settings.threshold, int):
        threshold = settings.threshold
    else:
        threshold = max(2, math.ceil(settings.threshold * shares - 1e-9))
    tolerated = max(0, min(shares - threshold, size - settings.min_group_size))
    return GroupPlan(size, shares, threshold, tolerated, complete_graph=shares == size)


def _describe(error: ValidationError) -> str:
    """One line: each problem with the setting it is about."""
    parts = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"])
        message = str(problem.get("ctx", {}).get("error", problem["msg"]))
        given = f" (got {problem['input']!r})" if where and "input" in problem else ""
        parts.append(f"{where}: {message}{given}" if where else message)
    return "secure aggregation settings: " + "; ".join(parts)
