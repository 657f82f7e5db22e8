"""The one run-config schema: every key, its type, default and allowed range.

Keys are kebab-case, exactly as in ``[tool.flwr.app.config]`` of ``pyproject.toml`` and in
``clusterfed run --set key=value``. Flower run configs hold only scalars, so lists are
strings (``rotations = "0,90,180,270"``) and "no value" is spelled ``"auto"``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from clusterfed import privacy
from clusterfed.datasets import DATASETS, PARTITIONERS
from clusterfed.datasets.sources import is_known_dataset
from clusterfed.models import MODELS
from clusterfed.report.watchers import parse_log_to
from clusterfed.strategies import strategy_class
from clusterfed.core.aggregation import check_aggregator
from clusterfed.strategies.base import ClusteredStrategy
from clusterfed.core.params import StrategyParams
from clusterfed.strategy_config import ConfigError, own_values, paper_keys, split_strategy_params, validate_params

__all__ = ["ConfigError", "RunConfig", "coerce_value", "config_defaults", "config_keys", "load_config_file",
           "parse_config", "parse_overrides"]

class RunConfig(BaseModel):
    """Validated run configuration. Field aliases are the kebab-case config keys."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    # what to run
    strategy: str = Field("fedavg", description="strategy name, or 'package.module:Class' of a strategy defined elsewhere")
    preset: Literal["none", "paper"] = Field(
        "none", description="paper: the strategy's parameters as its paper runs them (its PAPER preset, no extension "
                            "beyond the paper); a strategy key given beside it still wins")
    rounds: int = Field(30, ge=1, le=100_000)
    seed: int = Field(0, ge=0)
    out_dir: str = Field("results/run", alias="out-dir")
    timeout: float = Field(600.0, gt=0, description="seconds to wait for one phase's replies")
    probe_timeout: float = Field(120.0, alias="probe-timeout", gt=0,
                                 description="seconds the run's first profile probe waits for the nodes' replies (a "
                                             "ClientApp's cold start: importing torch, loading data); at least timeout")
    checkpoint: bool = Field(True, description="write the full state after every round (out-dir/checkpoint.json + .npz)")
    resume_from: str = Field("", alias="resume-from",
                             description="folder of a checkpoint to continue from; \"auto\": out-dir's checkpoint "
                                         "if it has one, else start fresh")

    # membership in a deployment (simulation always has exactly num-clients nodes)
    min_clients: int = Field(0, alias="min-clients", ge=0,
                             description="deployment: start once this many SuperNodes are up; 0 = num-clients")
    wait_timeout: float = Field(300.0, alias="wait-timeout", gt=0,
                                description="deployment: seconds to wait for min-clients SuperNodes before giving up")
    absent_after: int = Field(2, alias="absent-after", ge=1,
                              description="a client unreachable in this many consecutive rounds is marked absent")

    # data
    dataset: str = "digits"
    data_dir: str = Field("", alias="data-dir", description="folder of torchvision data sets")
    partitioner: str = "label-groups"
    num_clients: int = Field(20, alias="num-clients", ge=1, le=100_000)
    num_groups: int = Field(4, alias="num-groups", ge=1)
    alpha: float = Field(0.7, gt=0, le=1, description="dominant-class fraction")
    beta: float = Field(0.5, gt=0, description="Dirichlet concentration")
    labels_per_client: int = Field(2, alias="labels-per-client", ge=1)
    label_groups: str = Field("0,1;2,3;4,5;6,7;8,9", alias="label-groups")
    rotations: str = "0,90,180,270"
    min_samples: int = Field(10, alias="min-samples", ge=1)
    test_fraction: float = Field(0.2, alias="test-fraction", gt=0, lt=1)

    # model and local training
    model: str = "auto"
    local_epochs: int = Field(1, alias="local-epochs", ge=1)
    batch_size: int = Field(16, alias="batch-size", ge=1)
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.5, ge=0, lt=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    client_batching: Literal["auto", "off"] = Field(
        "auto", alias="client-batching",
        description="in-process engine: auto = the clients of a round that the built-in task or the client helper's "
                    "default loop trains are trained together (torch.func, on CUDA when present), the others one "
                    "after another, with one log line saying why; off = one after another")
    compare_arrays: str = Field(
        "auto", alias="compare-arrays",
        description="arrays whose updates clustering compares: auto = floating-point arrays that are not buffers "
                    "(BatchNorm running statistics, counters), or a regular expression on their names")
    aggregator: str = Field("fedavg", description="how each cluster aggregates its members' models: a Flower "
                            "aggregation strategy by name with literal options, e.g. 'fedadam(eta=0.01)', "
                            "'fedavgm(server_momentum=0.9)', 'fedtrimmedavg(beta=0.2)', 'krum(num_malicious_nodes=1)'; "
                            "each cluster keeps its own optimiser state (docs/aggregation.md)")

    # participation and measurement
    fraction_train: float = Field(1.0, alias="fraction-train", gt=0, le=1)
    fraction_evaluate: float = Field(1.0, alias="fraction-evaluate", ge=0, le=1)
    target_accuracy: float = Field(0.9, alias="target-accuracy", gt=0, le=1)
    target_coverage: float = Field(1.0, alias="target-coverage", gt=0, le=1,
                                   description="a round counts towards the target only if this share of the clients sampled for "
                                               "evaluation (fraction-evaluate) replied")

    # client-level differential privacy on each cluster's average (clusterfed.privacy; docs/privacy.md)
    dp_noise_multiplier: float = Field(0.0, alias="dp-noise-multiplier", ge=0,
                                       description="Gaussian noise std = this x dp-clipping-norm / (a cluster's replies) "
                                                   "on each cluster's average; 0 = no noise")
    dp_clipping_norm: float = Field(0.0, alias="dp-clipping-norm", ge=0,
                                    description="clip each reply's update to this L2 norm, average with equal weights; 0 = off")
    dp_delta: float = Field(0.0, alias="dp-delta", ge=0, lt=1,
                            description="report ε at this δ (below 1/num-clients); 0 = no accounting")

    # secure aggregation inside each cluster (clusterfed.secagg; docs/privacy.md): the strategies' Params check them
    secure_aggregation: str = Field("off", alias="secure-aggregation",
                                    description="'secaggplus': SecAgg+ per cluster, the server sees each cluster's sum, "
                                                "never one client's update; 'off': plain replies")
    secagg_shares: int = Field(0, alias="secagg-shares", ge=0,
                               description="secure aggregation: share holders per member (odd, >= 3); 0 = every member")
    secagg_threshold: int | float = Field(2 / 3, alias="secagg-threshold",
                                          description="secure aggregation: shares needed to rebuild a secret (a "
                                                      "fraction in [0.5, 1] of the shares, or a count >= 2)")
    secagg_clipping_range: float = Field(8.0, alias="secagg-clipping-range", gt=0,
                                         description="secure aggregation: values clipped to [-r, r] before quantization")
    secagg_quantization_range: int = Field(2**24, alias="secagg-quantization-range", ge=16, le=2**40,
                                           description="secure aggregation: quantization steps over [-r, r]")
    secagg_min_group_size: int = Field(3, alias="secagg-min-group-size", ge=3,
                                       description="secure aggregation: smaller clusters are held back that round")

    # fault injection on the clients, for tests and benchmarks (clusterfed/faults.py)
    fault_rate: float = Field(0.0, alias="fault-rate", ge=0, le=1, description="share of train messages whose client raises")
    fault_nan_rate: float = Field(0.0, alias="fault-nan-rate", ge=0, le=1, description="... that return NaN/Inf weights")
    fault_shape_rate: float = Field(0.0, alias="fault-shape-rate", ge=0, le=1,
                                    description="... that return a wrong shape or a missing/extra array")
    fault_slow_rate: float = Field(0.0, alias="fault-slow-rate", ge=0, le=1, description="... that reply fault-delay seconds late")
    fault_delay: float = Field(0.0, alias="fault-delay", ge=0, description="seconds a slow fault waits; 0 = timeout + 1")
    fault_attackers: float = Field(0.0, alias="fault-attackers", ge=0, le=1,
                                   description="share of the clients that attack every train reply (the same clients all run)")
    fault_attack: Literal["sign-flip", "scale"] = Field("sign-flip", alias="fault-attack",
                                                        description="what an attacker does to its update")
    fault_attack_factor: float = Field(4.0, alias="fault-attack-factor", gt=0,
                                       description="an attacker sends -factor × update (sign-flip) or factor × update (scale)")

    # simulated newcomers: a share of the clients is held back and joins later
    newcomer_fraction: float = Field(0.0, alias="newcomer-fraction", ge=0, lt=1,
                                     description="simulation: share of clients held back until newcomer-round")
    newcomer_round: int = Field(10, alias="newcomer-round", ge=1, description="simulation: the round the newcomers join")

    # where to watch the run (clusterfed/report/)
    log_to: str = Field("report", alias="log-to",
                        description="comma-separated: report = out-dir/report.html redrawn during the run (at most a tenth of its "
                                    "time) and at its end; tensorboard = "
                                    "out-dir/tensorboard (extra clusterfed[tensorboard]); mlflow = MLFLOW_TRACKING_URI "
                                    "or out-dir/mlruns (extra clusterfed[mlflow]); none = nothing")

    # the chosen strategy's Params, validated once when the config is (``_strategy_params``)
    _params: StrategyParams | None = PrivateAttr(None)
    # the class ``strategy`` names, resolved once with the config (``_strategy_params``)
    _strategy_cls: type | None = PrivateAttr(None)

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        if is_known_dataset(value):  # a built-in name or hf:<name or folder>
            return value
        return _one_of(value, (*DATASETS, "hf:<name or folder>"))

    @field_validator("log_to")
    @classmethod
    def _known_destinations(cls, value: str) -> str:
        parse_log_to(value)
        return value

    @field_validator("aggregator")
    @classmethod
    def _known_aggregator(cls, value: str) -> str:
        return check_aggregator(value)

    @field_validator("partitioner")
    @classmethod
    def _known_partitioner(cls, value: str) -> str:
        return _one_of(value, PARTITIONERS)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        return _one_of(value, ("auto", *MODELS))

    @model_validator(mode="after")
    def _strategy_params(self, info: ValidationInfo) -> "RunConfig":
        """The chosen strategy's ``Params`` from the shared run keys and its own values (handed
        in by ``parse_config`` as the validation context ``strategy_params``): validated here,
        once, by the strategy's own schema."""
        cls = self._strategy_cls = strategy_class(self.strategy)
        if issubclass(cls, ClusteredStrategy):
            given = (info.context or {}).get("strategy_params", {})
            if self.preset == "paper":
                given = {**paper_keys(cls), **given}
            self._params = validate_params(cls, self.shared_params(), given)
        elif self.preset != "none":
            raise ConfigError(f"preset = {self.preset!r}: strategy {self.strategy!r} is no clustered strategy and has "
                              f"no presets")
        return self

    @model_validator(mode="after")
    def _dp_for_this_run(self) -> "RunConfig":
        """What the strategy's Params cannot check of the dp-* keys (checked with them): δ
        below 1/num-clients, and a strategy that takes them at all."""
        if self._params is not None:
            try:
                privacy.check_population(self._params.dp, self.num_clients)
            except ValueError as error:  # the library's parameter name (dp_delta) as the config key
                raise ConfigError(f"{self.namespace}: {str(error).replace('dp_delta', 'dp-delta')}") from None
        elif self.dp_noise_multiplier or self.dp_clipping_norm or self.dp_delta:
            raise ConfigError(f"strategy {self.strategy!r} does not take the dp-* keys: use a clustered strategy "
                              f"(fedavg is FedAvg with differential privacy per cluster)")
        if self._params is None and self.secure_aggregation != "off":
            raise ConfigError(f"strategy {self.strategy!r} does not take secure-aggregation: use a clustered strategy "
                              f"(fedavg is FedAvg with SecAgg+ per cluster)")
        return self

    @model_validator(mode="after")
    def _fault_rates_add_up(self) -> "RunConfig":
        total = self.fault_rate + self.fault_nan_rate + self.fault_shape_rate + self.fault_slow_rate
        if total > 1:
            raise ValueError(f"fault rates add up to {total:g} > 1")
        return self

    def shared_params(self) -> dict[str, Any]:
        """The run keys every clustered strategy's ``Params`` also take (Flower's usual ones,
        the compared arrays, the aggregator, differential privacy)."""
        return {"fraction-train": self.fraction_train, "fraction-evaluate": self.fraction_evaluate, "seed": self.seed,
                "compare-arrays": self.compare_arrays, "aggregator": self.aggregator,
                "dp-noise-multiplier": self.dp_noise_multiplier, "dp-clipping-norm": self.dp_clipping_norm,
                "dp-delta": self.dp_delta, "secure-aggregation": self.secure_aggregation,
                "secagg-shares": self.secagg_shares, "secagg-threshold": self.secagg_threshold,
                "secagg-clipping-range": self.secagg_clipping_range,
                "secagg-quantization-range": self.secagg_quantization_range,
                "secagg-min-group-size": self.secagg_min_group_size}

    @property
    def params(self) -> StrategyParams | None:
        """The chosen strategy's validated ``Params`` (None for a strategy that is not clustered)."""
        return self._params

    @property
    def strategy_params(self) -> dict[str, Any]:
        """The chosen strategy's own parameters by kebab key, without the namespace and the shared keys."""
        return own_values(self._params) if self._params is not None else {}

    @property
    def strategy_cls(self) -> type:
        """The class that implements ``strategy`` (resolved when the config was validated)."""
        if self._strategy_cls is None:  # a config made without validation (model_construct)
            self._strategy_cls = strategy_class(self.strategy)
        return self._strategy_cls

    @property
    def namespace(self) -> str:
        """The prefix of the chosen strategy's parameters in a run config (its ``name``)."""
        return getattr(self.strategy_cls, "name", self.strategy)

    def to_flower(self) -> dict[str, bool | int | float | str]:
        """Kebab-case scalar dict, the shape of a Flower run config: the run keys and the
        chosen strategy's parameters as ``<strategy>.<param>``."""
        out = self.model_dump(by_alias=True)
        if own := self.strategy_params:
            namespace = self.namespace
            out.update({f"{namespace}.{k}": v for k, v in own.items()})
        return out

    def build_strategy(self, recorder: Any = None) -> Any:
        """The Flower ``Strategy`` that runs ``strategy``: a clustered strategy built from the
        ``Params`` validated with this config (not validated again), or Flower's own FedAvg
        (``flwr-fedavg``) reading this config and recording into ``recorder`` (a ``RunRecorder``;
        a clustered strategy's driver records)."""
        cls = self.strategy_cls
        return cls(self._params) if issubclass(cls, ClusteredStrategy) else cls(self, recorder)


def _one_of(value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{value!r} is not one of: {', '.join(allowed)}")
    return value


def config_defaults(strategy: str | None = None) -> dict[str, Any]:
    """The flat run config's default values (with ``strategy``'s parameters when given)."""
    return (parse_config({"strategy": strategy}) if strategy else RunConfig()).to_flower()


def config_keys() -> list[str]:
    return [field.alias or name for name, field in RunConfig.model_fields.items()]


def parse_config(values: dict[str, Any]) -> RunConfig:
    """Validate a run config (kebab-case keys; the chosen strategy's parameters as
    ``<strategy>.<param>``); raise ConfigError naming the key and what is allowed.

    Today's flat strategy keys (``distance``) still work: they are taken as the chosen
    strategy's parameter with a warning naming the new key (``fedclust.distance``).
    Parameters of other strategies (a pyproject holds every strategy's defaults) are
    allowed; one set away from its default is reported as ignored."""
    run_values, params = split_strategy_params(values, run_keys=config_keys())
    try:  # the chosen strategy's Params are validated with the run keys (``_strategy_params``)
        return RunConfig.model_validate(run_values, context={"strategy_params": params})
    except ValidationError as error:
        lines = []
        for problem in error.errors():
            if isinstance(problem.get("ctx", {}).get("error"), ConfigError):  # the strategy's Params: keys named
                lines.append(str(problem["ctx"]["error"]))
                continue
            key = ".".join(str(part) for part in problem["loc"]) or "config"
            given = problem.get("input")
            lines.append(f"config key {key!r} = {given!r}: {problem['msg']}")
        raise ConfigError("; ".join(lines)) from None


def coerce_value(text: str) -> bool | int | float | str:
    """Read a ``--set key=value`` value the way TOML would (bare words are strings)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        key, text = pair.split("=", 1)
        out[key.strip()] = coerce_value(text.strip())
    return out


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A TOML file of kebab-case keys; a pyproject's [tool.flwr.app.config] also works."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None
    return data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", data)
