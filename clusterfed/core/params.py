"""The parameters every clustered strategy shares (``StrategyParams``: Flower's usual ones,
the compared arrays, the within-cluster aggregator, differential privacy), and how a
strategy's ``Params`` become its constructor's signature, its docstring and one clear
message per wrong parameter."""

from __future__ import annotations

import difflib
import functools
import inspect
import operator
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from clusterfed import privacy
from clusterfed.secagg import SecAggSettings, SecAggSettingsError
from clusterfed.strategies.registry import clustered_classes
from clusterfed.core.aggregation import check_aggregator, template_of


class StrategyParams(BaseModel):
    """Flower's usual strategy parameters, shared by every clustered strategy. In a run
    config they are top-level keys (``fraction-train``); a strategy's own parameters are
    namespaced (``fedclust.lambda``)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    fraction_train: float = Field(1.0, alias="fraction-train", gt=0, le=1,
                                  description="share of the placed clients that train each round")
    fraction_evaluate: float = Field(1.0, alias="fraction-evaluate", ge=0, le=1,
                                     description="share of the placed clients evaluated each round")
    min_available_nodes: int = Field(0, alias="min-available-nodes", ge=0,
                                     description="start once this many nodes are connected (waits up to the timeout)")
    min_train_nodes: int = Field(1, alias="min-train-nodes", ge=1,
                                 description="train at least this many clients per round, whatever fraction_train gives")
    min_evaluate_nodes: int = Field(1, alias="min-evaluate-nodes", ge=1,
                                    description="evaluate at least this many clients per round (when fraction_evaluate > 0)")
    seed: int = Field(0, ge=0, description="seed of the strategy's own sampling and initialisations")
    compare_arrays: str | list[str] | Callable[[str, Any], bool] = Field(
        "auto", alias="compare-arrays",
        description="the arrays whose updates are compared (distances, split criteria, layer rules, stability): "
                    "auto = floating-point arrays that are not buffers (BatchNorm running statistics, counters, "
                    "scalars); else a regular expression on the names, a list of names, or (from Python) a "
                    "predicate (name, array) -> bool. The other arrays are only averaged per cluster")
    aggregator: Any = Field(
        "fedavg",
        description="how each cluster aggregates its members' models: a Flower aggregation strategy, by name with "
                    "literal options ('fedadam', 'fedavgm(server_momentum=0.9)', 'fedtrimmedavg(beta=0.2)', "
                    "'krum(num_malicious_nodes=1)') or (from Python) an instance such as FedAdam(eta=0.01), "
                    "deep-copied per cluster so each cluster keeps its own optimiser state (checkpointed). "
                    "fedavg = the sample-weighted mean")

    @field_validator("aggregator")
    @classmethod
    def _known_aggregator(cls, value: Any) -> Any:
        return check_aggregator(value)

    # client-level differential privacy on each cluster's average (clusterfed.privacy)
    dp_noise_multiplier: float = Field(
        0.0, alias="dp-noise-multiplier", ge=0,
        description="differential privacy: Gaussian noise of std dp_noise_multiplier * dp_clipping_norm / m on each "
                    "cluster's average of m clipped replies (0 = no noise); needs dp_clipping_norm and dp_delta")
    dp_clipping_norm: float = Field(
        0.0, alias="dp-clipping-norm", ge=0,
        description="differential privacy: each reply's update is clipped to this L2 norm against the model it was "
                    "sent, and replies are averaged with equal weights (0 = no clipping); sent to clients as "
                    "'clipping_norm' for Flower's fixedclipping_mod")
    dp_delta: float = Field(0.0, alias="dp-delta", ge=0, lt=1,
                            description="differential privacy: the δ at which ε is reported per round and cluster "
                                        "(below 1/number of clients; 0 = no accounting, without noise)")

    # secure aggregation inside each cluster (clusterfed.secagg: SecAgg+, one instance per cluster)
    secure_aggregation: str | bool = Field(
        "off", alias="secure-aggregation",
        description="secure aggregation of each cluster's training replies: 'secaggplus' (or True) = SecAgg+ "
                    "(Bell et al., CCS 2020) among the cluster's trainers, the server learns each cluster's sum, "
                    "never one client's update (clients need clusterfed.secagg.secagg_mod); 'off' (or False) = "
                    "plain replies. Clustering rounds that read individual evidence (FedClust's, AdaCFL's first "
                    "round) stay in the clear; strategies that compare individual updates every round refuse it")
    secagg_shares: int = Field(
        0, alias="secagg-shares", ge=0,
        description="secure aggregation: members holding shares of each member's secrets, itself included (odd, "
                    ">= 3; SecAgg+'s neighbourhood); 0 = every member of the cluster")
    secagg_threshold: int | float = Field(
        2 / 3, alias="secagg-threshold",
        description="secure aggregation: shares needed to rebuild a secret, a fraction in [0.5, 1] of the shares or "
                    "a count >= 2; up to shares - threshold members may drop after the key exchange")
    secagg_clipping_range: float = Field(
        8.0, alias="secagg-clipping-range", gt=0,
        description="secure aggregation: every returned value is clipped to [-r, r] before quantization (choose r "
                    "above the largest model weight; the cluster's count of clipped values is reported)")
    secagg_quantization_range: int = Field(
        2**24, alias="secagg-quantization-range", ge=16, le=2**40,
        description="secure aggregation: quantization steps over [-r, r]; a cluster's mean is off by less than "
                    "2 r / steps per value (9.5e-7 with the defaults)")
    secagg_min_group_size: int = Field(
        3, alias="secagg-min-group-size", ge=3,
        description="secure aggregation: a cluster with fewer trainers this round is held back (not asked to train, "
                    "its model kept, said in the round line), never summed in the clear")

    # the dp_* settings as one object (privacy.ClusterDP), None when DP is off; set by ``_dp_settings``
    _dp: privacy.ClusterDP | None = PrivateAttr(None)
    # the secure-aggregation settings (clusterfed.secagg.SecAggSettings), None when it is off
    _secagg: Any = PrivateAttr(None)

    @field_validator("secure_aggregation", mode="before")
    @classmethod
    def _secure_mode(cls, value: Any) -> Any:
        if value is True or value is False:
            return "secaggplus" if value else "off"
        if value not in ("off", "secaggplus"):
            raise ValueError(f"secure_aggregation must be 'off' or 'secaggplus' (or True / False), got {value!r}")
        return value

    @model_validator(mode="after")
    def _secagg_settings(self) -> "StrategyParams":
        """The secure-aggregation settings checked together (``clusterfed.secagg.SecAggSettings``)
        when it is on; it needs the default weighted mean (the server sees only the sum)."""
        if self.secure_aggregation == "off":
            return self
        try:
            self._secagg = SecAggSettings(
                shares=self.secagg_shares or None, threshold=self.secagg_threshold,
                clipping_range=self.secagg_clipping_range, quantization_range=self.secagg_quantization_range,
                min_group_size=self.secagg_min_group_size)
        except SecAggSettingsError as error:
            raise ValueError(str(error).replace("secure aggregation settings: ", "secure_aggregation: ")) from None
        template = template_of(self.aggregator)
        if template is not None:
            raise ValueError(
                f"secure_aggregation with aggregator = {type(template).__name__!r}: under secure aggregation the "
                f"server learns only each cluster's sum, which a robust or adaptive aggregator cannot work from; "
                f"use the default weighted mean")
        return self

    @property
    def secagg(self) -> Any:
        """The validated secure-aggregation settings (``SecAggSettings``), None when it is off."""
        return self._secagg

    @model_validator(mode="after")
    def _dp_settings(self) -> "StrategyParams":
        """The dp_* settings checked together, once, where every path validates them (a run
        config's Params and ``FedClust(dp_...=...)`` alike): noise needs clipping and δ, δ needs
        noise (``privacy.dp_settings``), and DP needs the default weighted mean."""
        self._dp = privacy.dp_settings(self.dp_noise_multiplier, self.dp_clipping_norm, self.dp_delta)
        template = template_of(self.aggregator)
        if self._dp is not None and template is not None:
            raise ValueError(
                f"dp_* with aggregator = {type(template).__name__!r}: the noise is calibrated to the clipped mean "
                f"of a cluster's replies, which another aggregator does not compute (a median's or Krum's "
                f"sensitivity differs); use the default weighted mean with dp_*")
        return self

    @property
    def dp(self) -> privacy.ClusterDP | None:
        """The validated DP settings, None when DP is off."""
        return self._dp

    @field_validator("compare_arrays")
    @classmethod
    def _compare_arrays_pattern(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "auto":
            try:
                re.compile(value)
            except re.error as error:
                raise ValueError(f"not a regular expression: {error}") from None
        return value

    @staticmethod
    def number_or_none(value: float | str) -> float | None:
        """A ``number | "auto"`` parameter as a float, or None for ``"auto"``."""
        return None if value == "auto" else float(value)


SHARED_PARAMS = tuple(StrategyParams.model_fields)


def plain_type(annotation: Any) -> Any:
    """A field's annotation without pydantic's constraint metadata (``Annotated[...]``)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return plain_type(args[0])
    if origin in (typing.Union, types.UnionType):
        return functools.reduce(operator.or_, [plain_type(a) for a in args])
    return annotation


def type_text(annotation: Any) -> str:
    """A field's type as a reader writes it: ``float or 'auto'``, ``'l2' or 'cosine'``."""
    annotation = plain_type(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(a) for a in args)
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def params_signature(params: type[BaseModel]) -> inspect.Signature:
    """The constructor's signature from a ``Params`` model: each parameter keyword-only, with
    its type and default (what ``help()``, ``inspect.signature`` and completion show)."""
    return inspect.Signature([
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=plain_type(field.annotation),
                          default=field.get_default(call_default_factory=True))
        for name, field in params.model_fields.items()], return_annotation=None)


def params_docstring(params: type[BaseModel]) -> str:
    """A numpydoc ``Parameters`` section from a ``Params`` model's fields and descriptions."""
    lines = ["Parameters", "----------"]
    for name, field in params.model_fields.items():
        default = field.get_default(call_default_factory=True)
        key = f" (run config: ``{field.alias}``)" if field.alias else ""
        lines += [f"{name} : {type_text(field.annotation)}, default {default!r}{key}", f"    {field.description or ''}".rstrip()]
    return "\n".join(lines)


def document_params(cls: type, *, base: bool = False) -> None:  # a ClusteredStrategy class (base imports this module)
    """Give a strategy class the signature and the docstring's ``Parameters`` section of its
    ``Params``: one source for the constructor, ``clusterfed params NAME`` and the reference.
    A subclass with a constructor of its own (not the ``base``) keeps that one's signature."""
    if "__init__" in cls.__dict__ and not base:
        cls.__signature__ = None  # a constructor of its own: inspect reads that one
        return
    own = cls.__dict__.get("__doc__") or f"The {cls.__name__} strategy."
    cls.__doc__ = f"{inspect.cleandoc(own)}\n\n{params_docstring(cls.Params)}"
    cls.__signature__ = params_signature(cls.Params)


def _strategies_with(param: str) -> list[str]:
    """Registered strategies that have a parameter of this (snake or kebab) name."""
    wanted = {param, param.replace("-", "_")}
    return [name for name, cls in clustered_classes().items()
            if wanted & ({n for n in cls.Params.model_fields} | {f.alias for f in cls.Params.model_fields.values() if f.alias})]


# Flower FedAvg arguments that clustered strategies do not take, and why
FLOWER_ONLY = {
    "weighted_by_key": "replies are always weighted by 'num-examples'",
    "arrayrecord_key": "the model travels under 'arrays'",
    "configrecord_key": "the config travels under 'config'",
    "train_metrics_aggr_fn": "train metrics are averaged by num-examples",
    "evaluate_metrics_aggr_fn": "evaluate metrics are averaged by num-examples",
}


def group_errors(error: ValidationError) -> dict[str, tuple[Any, list[str], str]]:
    """Pydantic's errors by parameter: (the value given, its messages, the first error's
    type); a ``number | "auto"`` parameter's two complaints land under one key. Errors of
    the parameters together are ``settings_errors``."""
    by_key: dict[str, tuple[Any, list[str], str]] = {}
    for problem in error.errors():
        if problem["loc"]:
            key = str(problem["loc"][0])
            by_key.setdefault(key, (problem.get("input"), [], problem["type"]))[1].append(problem["msg"])
    return by_key


def settings_errors(error: ValidationError) -> list[str]:
    """The sentences of the checks of parameters together (a model validator's, such as the
    dp_* settings'), each naming the parameters by their Python names."""
    return [str(problem.get("ctx", {}).get("error", problem["msg"])) for problem in error.errors() if not problem["loc"]]


def describe_errors(strategy: str, error: ValidationError, params: type[BaseModel] | None = None) -> str:
    """One clause per wrong parameter, naming it, what is allowed, and for an unknown one the
    closest name or the strategies that have it."""
    lines = []
    for key, (given, messages, kind) in group_errors(error).items():
        if kind != "extra_forbidden":
            lines.append(f"{strategy}: {key} = {given!r}: {' or '.join(messages)}")
            continue
        if key in FLOWER_ONLY:
            lines.append(f"strategy {strategy!r} does not take Flower's {key!r}: {FLOWER_ONLY[key]}")
            continue
        having = _strategies_with(key)
        known = list(params.model_fields) if params is not None else []
        close = difflib.get_close_matches(key, known, n=1)
        hint = (f" ({', '.join(having)} {'has' if len(having) == 1 else 'have'} it)" if having
                else f" (did you mean {close[0]!r}?)" if close else "")
        lines.append(f"strategy {strategy!r} has no parameter {key!r}{hint}; its parameters: {', '.join(known)}")
    lines += [f"{strategy}: {sentence}" for sentence in settings_errors(error)]
    return "; ".join(lines)
