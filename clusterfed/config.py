"""The one run-config schema: every key, its type, default and allowed range.

Keys are kebab-case, exactly as in ``[tool.flwr.app.config]`` of ``pyproject.toml`` and in
``clusterfed run --set key=value``. Flower run configs hold only scalars, so lists are
strings (``rotations = "0,90,180,270"``) and "no value" is spelled ``"auto"``.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from clusterfed.datasets import DATASETS, PARTITIONERS
from clusterfed.models import MODELS
from clusterfed.strategies import REGISTRY

STRATEGY_NAMES = tuple(REGISTRY)

# keys that only some strategies read (each strategy class lists its own in ``reads``);
# one set away from its default for a strategy that does not read it is reported as ignored
STRATEGY_KEYS = (
    "proximal-mu", "cluster-epochs", "cluster-layers", "lambda", "distance", "linkage", "auto-min-silhouette", "cluster-sample",
    "warmup-rounds", "share-label-stats", "entropy-gap", "epsilon", "split-criteria", "eps1", "eps2", "rel-eps1",
    "rel-eps2", "split-min-silhouette", "split-silhouette-max-k", "min-split-size", "min-split-round", "skew",
    "correct-clustering-check", "window", "stability-eps", "xi", "num-clusters", "ifca-init", "ifca-restarts", "w",
    "hold-rounds", "stabilizer", "anneal-tau", "stability-eps-rel", "hicfl-timing", "hicfl-split", "hicfl-min-silhouette", "hicfl-min-side",
    "merge", "merge-min-cosine", "merge-max-silhouette",
)


class ConfigError(ValueError):
    """A run-config key or value is wrong; the message names it and what is allowed."""


class RunConfig(BaseModel):
    """Validated run configuration. Field aliases are the kebab-case config keys."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    # what to run
    strategy: str = Field("fedavg", description="strategy name (see STRATEGY_NAMES)")
    rounds: int = Field(30, ge=1, le=100_000)
    seed: int = Field(0, ge=0)
    out_dir: str = Field("results/run", alias="out-dir")
    timeout: float = Field(600.0, gt=0, description="seconds to wait for one phase's replies")
    checkpoint: bool = Field(True, description="write the full state after every round (out-dir/checkpoint.pkl)")
    resume_from: str = Field("", alias="resume-from", description="folder of a checkpoint to continue from")

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

    # participation and measurement
    fraction_train: float = Field(1.0, alias="fraction-train", gt=0, le=1)
    fraction_evaluate: float = Field(1.0, alias="fraction-evaluate", ge=0, le=1)
    target_accuracy: float = Field(0.9, alias="target-accuracy", gt=0, le=1)
    target_coverage: float = Field(1.0, alias="target-coverage", gt=0, le=1,
                                   description="a round counts towards the target only if this share of known clients was evaluated")

    # fault injection on the clients, for tests and benchmarks (clusterfed/faults.py)
    fault_rate: float = Field(0.0, alias="fault-rate", ge=0, le=1, description="share of train messages whose client raises")
    fault_nan_rate: float = Field(0.0, alias="fault-nan-rate", ge=0, le=1, description="... that return NaN/Inf weights")
    fault_shape_rate: float = Field(0.0, alias="fault-shape-rate", ge=0, le=1,
                                    description="... that return a wrong shape or a missing/extra array")
    fault_slow_rate: float = Field(0.0, alias="fault-slow-rate", ge=0, le=1, description="... that reply fault-delay seconds late")
    fault_delay: float = Field(0.0, alias="fault-delay", ge=0, description="seconds a slow fault waits; 0 = timeout + 1")

    # FedProx
    proximal_mu: float = Field(0.01, alias="proximal-mu", ge=0)

    # one-shot clustering (FedClust, AdaCFL)
    cluster_epochs: int = Field(10, alias="cluster-epochs", ge=1)
    cluster_layers: str = Field("auto", alias="cluster-layers", description="layer rule or names; auto = the strategy's own")
    lambda_: str = Field("auto", alias="lambda", description='distance threshold, or "auto"')
    distance: Literal["l2", "cosine"] = "l2"
    linkage: Literal["average", "single", "complete", "ward"] = "average"
    auto_min_silhouette: float = Field(0.25, alias="auto-min-silhouette", ge=-1, le=1)
    cluster_sample: int = Field(0, alias="cluster-sample", ge=0,
                                description="cluster this many sampled clients, place the rest by nearest reference (0 = all)")
    warmup_rounds: int = Field(1, alias="warmup-rounds", ge=0)
    share_label_stats: bool = Field(True, alias="share-label-stats")
    entropy_gap: float = Field(0.1, alias="entropy-gap", ge=0)
    epsilon: str = Field("auto", alias="epsilon", description='newcomer distance for a new cluster, or "auto"')
    newcomer_fraction: float = Field(0.0, alias="newcomer-fraction", ge=0, lt=1)
    newcomer_round: int = Field(10, alias="newcomer-round", ge=1)

    # recursive bi-partitioning (CFL, LayerCFL, HiCFL)
    split_criteria: Literal["relative", "absolute"] = Field("relative", alias="split-criteria")
    eps1: float = Field(0.4, gt=0)
    eps2: float = Field(1.6, gt=0)
    rel_eps1: float = Field(0.9, alias="rel-eps1", gt=0, le=1, description="stationary below this x peak mean norm")
    rel_eps2: float = Field(3.0, alias="rel-eps2", gt=0, description="heterogeneous above this x mean-update norm")
    split_min_silhouette: float = Field(0.3, alias="split-min-silhouette", ge=-1, le=1,
                                        description="keep a proposed bi-partition only if the best cut's silhouette on 1 - cos reaches this")
    split_silhouette_max_k: int = Field(6, alias="split-silhouette-max-k", ge=2, le=20,
                                        description="the silhouette tested is the best over cuts into 2..k clusters (2: the proposed split's own)")
    min_split_size: int = Field(3, alias="min-split-size", ge=2)
    min_split_round: int = Field(5, alias="min-split-round", ge=1)
    merge: bool = Field(True, description="CFL/LayerCFL/HiCFL: merge two leaf clusters whose updates became indistinguishable")
    merge_min_cosine: float = Field(0.6, alias="merge-min-cosine", ge=-1, le=1,
                                    description="merge only if the cosine of the two clusters' mean updates reaches this")
    merge_max_silhouette: float = Field(0.5, alias="merge-max-silhouette", ge=-1, le=1,
                                        description="... and the silhouette of their members (labelled by cluster) is at most this")
    skew: Literal["label", "feature", "unknown"] = "unknown"
    correct_clustering_check: bool = Field(False, alias="correct-clustering-check",
                                           description="LayerCFL: refuse splits failing Theorem 1 (false: record it only)")
    window: int = Field(5, ge=1)
    stability_eps: str = Field("auto", alias="stability-eps",
                               description='HiCFL absolute ε (the paper\'s mode), or "auto" = relative (stability-eps-rel)')
    stability_eps_rel: float = Field(1.5, alias="stability-eps-rel", gt=0,
                                     description="HiCFL: ε as a multiple of each layer's median windowed stability at the cluster's first full window")
    hicfl_timing: Literal["all", "median"] = Field("median", alias="hicfl-timing",
                                                   description="HiCFL: a layer is ready when every member / the median member is below ε")
    hicfl_split: Literal["reference", "linkage"] = Field("linkage", alias="hicfl-split",
                                                         description="HiCFL: sign of the cosine with the reference (paper) or complete linkage (CFL)")
    hicfl_min_side: int = Field(2, alias="hicfl-min-side", ge=1,
                                description="HiCFL: fewest members on each side of a split")
    hicfl_min_silhouette: float = Field(0.45, alias="hicfl-min-silhouette", ge=-1, le=1,
                                        description="HiCFL structure test on the proposed split; -1 = off (paper: heterogeneity stop rule)")
    xi: str = Field("auto", description='HiCFL ξ, or "auto" = 0.05·lr')

    # IFCA
    num_clusters: int = Field(4, alias="num-clusters", ge=1, description="IFCA: K cluster models")
    ifca_init: Literal["random", "kmeans++"] = Field("random", alias="ifca-init")
    ifca_restarts: int = Field(1, alias="ifca-restarts", ge=1, le=20,
                               description="IFCA: initialisations tried in the first round (random) or seedings (kmeans++)")

    # adaptive cluster-count client selection
    w: float = Field(0.01, ge=0, description="loss-reduction ratio above which p decreases")
    hold_rounds: int = Field(2, alias="hold-rounds", ge=0, description="rounds p is held after a change")
    stabilizer: Literal["none", "annealing", "experience"] = "none"
    anneal_tau: float = Field(50.0, alias="anneal-tau", gt=0,
                              description="annealing: keep p with probability 1 - exp(-round / anneal-tau)")

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        return _one_of(value, STRATEGY_NAMES)

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        return _one_of(value, DATASETS)

    @field_validator("partitioner")
    @classmethod
    def _known_partitioner(cls, value: str) -> str:
        return _one_of(value, PARTITIONERS)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        return _one_of(value, ("auto", *MODELS))

    @field_validator("lambda_", "epsilon", "stability_eps", "xi", mode="before")
    @classmethod
    def _number_or_auto(cls, value: Any) -> str:
        if isinstance(value, bool):
            raise ValueError('expected a positive number or "auto"')
        if isinstance(value, (int, float)):
            value = repr(float(value))
        if value != "auto":
            try:
                if float(value) <= 0:
                    raise ValueError
            except (TypeError, ValueError):
                raise ValueError(f'expected a positive number or "auto", got {value!r}') from None
        return value

    @model_validator(mode="after")
    def _fault_rates_add_up(self) -> "RunConfig":
        total = self.fault_rate + self.fault_nan_rate + self.fault_shape_rate + self.fault_slow_rate
        if total > 1:
            raise ValueError(f"fault rates add up to {total:g} > 1")
        return self

    def number_or_none(self, key: str) -> float | None:
        """A "number or auto" field as a float, or None for "auto"."""
        value = getattr(self, key)
        return None if value == "auto" else float(value)

    def to_flower(self) -> dict[str, bool | int | float | str]:
        """Kebab-case scalar dict, the shape of a Flower run config."""
        return self.model_dump(by_alias=True)


def _one_of(value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{value!r} is not one of: {', '.join(allowed)}")
    return value


def config_defaults() -> dict[str, Any]:
    return RunConfig().to_flower()


def config_keys() -> list[str]:
    return [field.alias or name for name, field in RunConfig.model_fields.items()]


def parse_config(values: dict[str, Any]) -> RunConfig:
    """Validate a kebab-case mapping; raise ConfigError naming the key and what is allowed."""
    known = config_keys()
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown config key {key!r}{hint}; known keys: {', '.join(known)}")
    try:
        return RunConfig.model_validate(values)
    except ValidationError as error:
        lines = []
        for problem in error.errors():
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
