"""The clustered strategy base: a Flower ``Strategy`` with K cluster models, assignment by
stable client key, per-cluster training requests and aggregation. As it stands it is
FedAvg (K = 1).

A user constructs a strategy in their own ServerApp where ``FedAvg(...)`` stood and calls
Flower's ``start(grid=..., initial_arrays=..., num_rounds=...)``::

    from clusterfed import FedClust
    result = FedClust(fraction_train=1.0).start(grid=grid, initial_arrays=arrays, num_rounds=20)

Each strategy module declares, and nothing else does:

- ``Params``: its typed parameters (a pydantic model; the constructor's keyword arguments,
  the run config's ``<name>.<param>`` keys, the generated configuration reference);
- ``State``: everything that decides later rounds, a plain dataclass (checkpointed as
  JSON + npz; the strategy reads and writes it as ``self.state.<field>``, which type
  checkers follow; ``get_state`` / ``set_state`` move all of it as plain data);
- ``one_cluster_reasons``: what it says when it ends as FedAvg;
- ``requires``: what it needs from clients beyond a stock Flower ClientApp.

The algorithm is written in the style of FedJAX's ``init``/``apply``: ``init(θ0)`` sets
up the state; each round ``round(rnd)`` (``rnd``: the round's ``Round``) is a generator
that yields lists of ``Ask`` (what each client is asked for) and is sent back the validated
``Replies``. A strategy's own
logic never touches a Message or the Grid: ``start`` hands the generator to the round
driver (``clusterfed.runner.driver.RoundDriver``, reached through
``clusterfed.strategy_protocol``), which alone speaks Flower (discovery, profiles, sending,
validation, byte and fault counting, evaluation, checkpoints) and hands the round its
active clients and train config (``round_steps``). Flower's single-phase hooks run the
same generator, one exchange per Flower round.

The round is written once (``round``, the skeleton every strategy runs: the dp_* population
check, sampling, newcomers, clustering steps, trainers, training, per-cluster aggregation,
the steps after training, the train loss); a strategy varies its steps, never the skeleton.
Hooks a subclass overrides, reading like its paper's algorithm box: ``admit`` (clients
not placed yet), ``before_train`` (clustering steps before this round's training),
``after_train`` (steps that use this round's training replies) and ``train_instructions``;
and where its paper trains otherwise, ``select_trainers`` (who trains: selection's
representatives), ``train`` (the exchange: IFCA offers all K models, restarts) and
``aggregate`` (how the replies become the cluster models: selection's group weights).
``admit``, ``before_train`` and ``after_train`` may ask clients for work: written as
generators (or returning one), they ``yield`` a list of asks and receive the replies; written as
plain methods, they ask nothing. Each returns its ``Diagnostics`` (column -> JSON value, or None); ``round`` returns
them, merged in the order the hooks ran, to the driver, which writes them to rounds.jsonl.

Partial participation (``fraction-train`` < 1): by default every client not placed yet is
placed at the start of a round (placing asks nothing) and the trainers are a
``fraction-train`` sample of the placed clients. A strategy whose placement asks clients
for work (a clustering round, a newcomer's partial upload) overrides ``draw_sample``: the
round's sample is then drawn among all active clients *before* placement, placement asks
only sampled clients, and the trainers are the sampled clients that are placed
(``rnd.sampled``).

Every hook gets the round (``Round``, ``rnd``) as its first argument: its number
(``rnd.number``), the active clients, the train config and the client table the driver hands
it (``round_steps``), the sample and the reports the round appends (its splits and
placements, which ``round_steps`` returns to the driver). Nothing of a round is kept on the
strategy: per-round values live in the round. ``fraction-evaluate`` samples the placed clients for evaluation.
"""

from __future__ import annotations

import copy
import logging
from collections import defaultdict
from dataclasses import dataclass, field, fields
from functools import cache
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from flwr.supercore import log
from flwr.app import ArrayRecord
from pydantic import ValidationError

from clusterfed import privacy, protocol
from clusterfed.models.layers import select_layers
from clusterfed.models.parameters import compared_names
from clusterfed.core.contract import (  # noqa: F401 (re-exported: the errors are part of base's API)
    CAPABILITIES, LABEL_STATS, MULTI_MODEL, CapabilityError, ClientFailureError, ClusteredResult,
    ModelMismatchError, StrategyParamsError, mean_train_loss)
from clusterfed.core.aggregation import ClusterAggregator, template_of
from clusterfed.core.flower_hooks import FlowerHooks
from clusterfed.core.params import StrategyParams, describe_errors, document_params  # noqa: F401
from clusterfed.core.exchange import (  # noqa: F401 (Steps, steps: the author kit's, from base)
    RETURN_WEIGHTS, UPLOAD_FULL, Arrays, Ask, ClientInfo, Diagnostics, Round, RoundResult, SecureSums,
    Steps, TrainReply, Trainers, add_diagnostics, diagnostics_of, by_key, natural, steps, weighted_average)
from clusterfed.strategies import secure
from clusterfed.strategies.resampling import sample_size
from clusterfed.strategies.secure import (  # noqa: F401 (re-exported: strategies set secure_refusal = base.<one>)
    COMPARES_UPDATES_EVERY_ROUND, EACH_CLIENT_ALONE, READS_EACH_CLIENTS_MODEL, sums_train_loss)


@dataclass
class ClusteredState:
    """The base's state: cluster models, the client → cluster assignment, the newcomer
    log, the start model and its shapes, the next cluster id and the sampling RNG."""

    theta0: Arrays = field(default_factory=dict)
    shapes: dict[str, tuple[tuple[int, ...], Any]] = field(default_factory=dict)
    models: dict[int, Arrays] = field(default_factory=dict)
    assignment: dict[str, int] = field(default_factory=dict)
    newcomer_log: list[dict[str, Any]] = field(default_factory=list)
    next_cluster_id: int = 0
    rng: Any = None
    # cluster -> its aggregator's optimiser state (steps, Flower strategy attributes as plain
    # data); empty with the default weighted mean (clusterfed.core.aggregation)
    aggregator_state: dict[int, dict[str, Any]] = field(default_factory=dict)
    dp_releases: dict[str, int] = field(default_factory=dict)  # client key -> noisy releases its update entered


@cache
def state_fields(state_class: type) -> frozenset[str]:
    """The field names of a ``State`` dataclass."""
    return frozenset(f.name for f in fields(state_class))


class ClusteredStrategy(FlowerHooks):
    """FedAvg on the clustered base: one cluster, every client in it. Subclasses add clusters."""

    name: ClassVar[str] = "fedavg"
    Params: ClassVar[type[StrategyParams]] = StrategyParams
    State: ClassVar[type] = ClusteredState
    # reason code -> sentence, for a run that ends with one cluster (``one_cluster_reason``)
    one_cluster_reasons: ClassVar[dict[str, str]] = {}
    # clusters.json keys this strategy's figures read (clusterfed.plots draws what is there)
    figures: ClassVar[tuple[str, ...]] = ()
    # the paper preset: parameter values by field name that run the published algorithm with
    # no extension beyond the paper (``paper()``, the run config's ``preset = "paper"``); {}: the
    # defaults are the paper's; None: no paper to run (a baseline such as Local, or a strategy
    # that has not declared its preset)
    PAPER: ClassVar[dict[str, Any] | None] = None
    # why this strategy cannot run with ``secure_aggregation`` (its steps read individual
    # updates in rounds that train); None: its training steps work from each cluster's sum
    secure_refusal: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unknown = sorted(set(cls.PAPER or ()) - set(cls.Params.model_fields))
        if unknown:
            raise TypeError(f"{cls.__name__}.PAPER names {unknown}, not fields of {cls.Params.__name__}")
        document_params(cls)

    @classmethod
    def paper(cls, **overrides: Any) -> ClusteredStrategy:
        """The strategy as its paper runs it (``PAPER``'s values, by field name), ``overrides``
        on top (``IFCA.paper(num_clusters=2)``); StrategyParamsError for one without a paper."""
        if cls.PAPER is None:
            raise StrategyParamsError(f"{cls.name}: no paper preset: {cls.__name__} is not a published algorithm "
                                      f"or does not declare its paper's parameter values (PAPER)")
        return cls(**{**cls.PAPER, **overrides})

    def __init__(self, params: StrategyParams | None = None, /, **keywords: Any) -> None:
        given = params if params is not None and not keywords else {**dict(params or {}), **keywords}
        try:  # cls(params): ``Params`` validated already (a run config's) are taken as they are (pydantic
            # would run their model validators, the dp_* check among them, again)
            self.params = given if isinstance(given, self.Params) else self.Params.model_validate(given)
        except ValidationError as error:
            raise StrategyParamsError(describe_errors(self.name, error, self.Params)) from None
        self.dp = self.params.dp  # checked with the Params (StrategyParams._dp_settings), not again here
        self.secagg = self.params.secagg  # SecAggSettings, None when secure aggregation is off
        if self.secagg is not None and self.secure_refusal:
            raise StrategyParamsError(f"{self.name}: secure_aggregation = {self.params.secure_aggregation!r} "
                                      f"refused: {self.secure_refusal}")
        try:
            self.dp_accountant = privacy.Accountant(self.dp) if self.dp and self.dp.noise_multiplier > 0 else None
        except ValueError as error:  # the accountant's backend is not installed
            raise StrategyParamsError(f"{self.name}: {error}") from None
        # per-round values (the active clients, the train config, the client table, the sample,
        # the reports) are not kept here: each round gets them in its ``Round`` (``round_steps``)
        self.run_options = None  # RunOptions: how a user's own ServerApp passes options (the app's go to the driver)
        self.driver = None  # the driver of the current run, as the runner built it for start / the hooks
        # the within-cluster aggregator (``aggregator``); None: the sample-weighted mean
        template = template_of(self.params.aggregator)
        self.aggregator = ClusterAggregator(template) if template is not None else None
        self.state: ClusteredState = self.State()

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        """Everything that decides later rounds, as plain data (a deep copy of ``State``'s fields)."""
        return copy.deepcopy({f.name: getattr(self.state, f.name) for f in fields(self.state)})

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned (a checkpoint's ``algorithm`` entry)."""
        unknown = set(state) - state_fields(self.State)
        if unknown:
            raise ValueError(f"state fields {sorted(unknown)} are not part of {self.State.__name__}")
        self.state = self.State(**copy.deepcopy(state))
        object.__setattr__(self, "_initialised", True)  # a resumed run remembers only what is declared too

    if not TYPE_CHECKING:  # hidden from type checkers, which see only self.state.<field>
        # guard rails for a strategy written when ``State`` fields were read as ``self.<field>``:
        # one clear message instead of a bare AttributeError, and never an attribute that
        # shadows a field and escapes the checkpoint
        def __getattr__(self, name: str) -> Any:
            if name in state_fields(type(self).State):
                raise AttributeError(f"{type(self).__name__}.{name} is a field of {type(self).State.__name__}: "
                                     f"read it as self.state.{name}")
            if name in type(self).Params.model_fields:
                raise AttributeError(f"{type(self).__name__}.{name} is a parameter: read it as self.params.{name}")
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

        def __setattr__(self, name: str, value: Any) -> None:
            if name in state_fields(type(self).State):
                raise AttributeError(f"{type(self).__name__}.{name} is a field of {type(self).State.__name__}: "
                                     f"write it as self.state.{name} (checkpointed), not as an attribute")
            if self.__dict__.get("_initialised") and name not in self.__dict__ and not hasattr(type(self), name):
                # after init(θ0) a new attribute would decide later rounds and be lost on resume
                raise AttributeError(f"{type(self).__name__}.{name} is not declared: add it to "
                                     f"{type(self).State.__name__} (read and written as self.state.{name}, "
                                     f"checkpointed) or set it in __init__")
            object.__setattr__(self, name, value)

    # what a run's caller reads after ``start`` (the driver, a user's ServerApp, tests): the
    # base's state, by name
    @property
    def models(self) -> dict[int, Arrays]:
        """Each cluster's model, by cluster id (``state.models``)."""
        return self.state.models

    @property
    def assignment(self) -> dict[str, int]:
        """Each placed client's cluster, by client key (``state.assignment``)."""
        return self.state.assignment

    @property
    def theta0(self) -> Arrays:
        """The start model (``state.theta0``; empty before ``init``)."""
        return self.state.theta0

    @property
    def shapes(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Each array's shape and dtype in the start model (``state.shapes``)."""
        return self.state.shapes

    # how to run this strategy with stock ClientApps when ``requires`` names a capability they
    # lack, if there is a way (quoted by the CapabilityError)
    stock_alternative: str | None = None

    def requires(self) -> set[str]:
        """Client capabilities this configuration needs beyond a stock Flower ClientApp (``CAPABILITIES``)."""
        return set()

    def check_train_config(self, train_config: dict[str, Any]) -> None:
        """Raise StrategyParamsError when ``train_config`` lacks what this strategy needs (before round 1)."""

    # ------------------------------------------------------------- lifecycle
    def init(self, theta0: Arrays | ArrayRecord, train_config: Mapping[str, Any] | None = None) -> None:
        """Start from ``theta0`` (NumPy arrays by name, or Flower's ArrayRecord): the first
        clusters. ``train_config``: the clients' train config where the caller knows it before
        round 1 (a strategy whose start reads it, HiCFL's lr, may use it; the base does not)."""
        if isinstance(theta0, ArrayRecord):
            theta0 = protocol.from_array_record(theta0)
        self.state = self.State()
        object.__setattr__(self, "_initialised", True)  # from here on, what is remembered is declared
        self.state.rng = np.random.default_rng(self.params.seed)
        self.state.theta0 = {k: v.copy() for k, v in theta0.items()}
        self.state.shapes = {k: (tuple(v.shape), v.dtype) for k, v in theta0.items()}
        secure.check_dp(self.name, self.dp, self.secagg, theta0)  # distributed DP's bound, before round 1
        self.init_clusters()

    def round_steps(self, server_round: int, active: list[str], train_config: dict[str, Any],
                    clients: Mapping[str, ClientInfo], one_exchange: bool = False) -> Steps:
        """The round the driver runs (in ``start`` and behind Flower's single-phase hooks):
        ``round(rnd)`` over the ``active`` client keys with ``train_config``, reading
        ``clients`` (the driver's client table, read-only: the membership owns it), all held by
        the round's ``Round``. What the generator returns is the round's ``RoundResult``: its
        diagnostics and its reports, which the driver scores."""
        rnd = Round(server_round, list(active), dict(train_config), MappingProxyType(clients),
                    one_exchange=one_exchange)
        return self.with_reports(rnd, self.round(rnd))

    def with_reports(self, rnd: Round, round_steps: Steps) -> Steps:
        """``round_steps`` run to its end; returns its diagnostics with ``rnd``'s reports."""
        diagnostics = yield from round_steps
        return RoundResult(diagnostics_of(diagnostics), list(rnd.reports))

    def check_population(self, clients: int) -> None:
        """StrategyParamsError, before anything is sent, when the dp_* settings cannot protect
        a population of ``clients`` (δ ≥ 1/n: ``privacy.check_population``)."""
        try:
            privacy.check_population(self.dp, clients)
        except ValueError as error:
            raise StrategyParamsError(f"{self.name}: {error}") from None

    def round(self, rnd: Round) -> Steps:
        """The one round skeleton of every strategy: check the population against the dp_*
        settings, draw the round's sample, place newcomers (``admit``), clustering steps
        (``before_train``), choose the trainers (``select_trainers``), train them (``train``:
        one exchange by default), average per cluster (``aggregate``: every reply but those of
        clients asked for evidence only, ``rnd.evidence_only``), the steps that use the training
        replies (``after_train``) and the mean train loss of those averaged; returns the diagnostics,
        merged in that order (each step's words after the earlier ones'). A strategy varies the steps, never the skeleton."""
        rnd.reports.clear()
        self.check_population(max(len(rnd.clients), len(rnd.active)))
        rnd.sampled = self.draw_sample(rnd)
        unplaced = [k for k in rnd.active if k not in self.state.assignment]
        diagnostics = (yield from steps(self.admit(rnd, unplaced))) if unplaced else {}
        add_diagnostics(diagnostics, (yield from steps(self.before_train(rnd))))
        trainers = self.select_trainers(rnd)
        if isinstance(trainers, Trainers):  # what choosing them found
            add_diagnostics(diagnostics, trainers.diagnostics)
        if self.secagg is not None:  # each cluster's sum, never one client's update
            sums, trained = yield from self.secure_train(rnd, trainers)
            add_diagnostics(diagnostics, trained)
            add_diagnostics(diagnostics, self.aggregate_sums(rnd, sums))
            add_diagnostics(diagnostics, self.after_secure_train(rnd, sums))
            diagnostics["train_loss"] = sums_train_loss(sums)
            return diagnostics
        replies, trained = yield from self.train(rnd, trainers)
        add_diagnostics(diagnostics, trained)
        averaged = [r for r in replies if r.key not in rnd.evidence_only]  # the others judge decisions only
        add_diagnostics(diagnostics, self.aggregate(rnd, averaged))
        add_diagnostics(diagnostics, (yield from steps(self.after_train(rnd, replies))))
        diagnostics["train_loss"] = mean_train_loss(averaged)
        return diagnostics

    def train(self, rnd: Round, trainers: list[str]) -> Steps:
        """The round's training: asks ``trainers`` to train (each its cluster's model, one
        exchange); returns (the replies, its diagnostics). IFCA offers every model and restarts here."""
        replies = yield self.train_asks(rnd, trainers)
        return replies, {}

    def aggregate(self, rnd: Round, replies: list[TrainReply]) -> Diagnostics:
        """Each cluster's new model from the training ``replies`` the round averages, each
        weighing what ``weigh`` says (``aggregate_clusters``); returns the diagnostics."""
        return self.aggregate_clusters(self.weigh(replies))

    # ------------------------------------------------------- secure aggregation
    # (the steps are ``clusterfed.strategies.secure``'s functions, handed this strategy's values)
    def secagg_settings(self) -> Any:
        """The protocol's settings this run uses: ``params.secagg``, with equal weights under dp_*."""
        return secure.settings(self.secagg, self.dp)

    def secure_train(self, rnd: Round, trainers: list[str]) -> Steps:
        """The round's training under secure aggregation: the trainers, grouped by cluster, each
        group one SecAgg+ instance (``SecureTrain``); a group below the minimum is held back (not
        asked, its model kept: ``clusterfed.secagg.split_groups``). Returns (``SecureSums``, the
        diagnostics)."""
        groups = secure.by_cluster(trainers, self.state.assignment)
        return (yield from self.secure_groups(rnd, groups, lambda keys: self.train_asks(rnd, keys)))

    def secure_groups(self, rnd: Round, groups: dict[int, list[str]], asks_of: Any) -> Steps:
        """Run ``groups`` (cluster -> trainer keys) under secure aggregation, each trainer asked
        what ``asks_of(keys)`` asks; the small-group rule applied first. Returns (``SecureSums``
        with ``held`` set, the diagnostics)."""
        return (yield from secure.secure_groups(rnd.number, groups, self.secagg_settings(), asks_of))

    def aggregate_sums(self, rnd: Round, sums: SecureSums) -> Diagnostics:
        """Each cluster's new model from its unmasked mean, noise on it under dp_*
        (``secure.aggregate_sums``); returns the diagnostics (``secure_aggregation``, ``privacy``,
        ``decision``)."""
        return secure.aggregate_sums(self.state, sums, self.dp, self.secagg_settings(), self.dp_accountant)

    def after_secure_train(self, rnd: Round, sums: SecureSums) -> Diagnostics | None:
        """Steps after a securely aggregated training step (they see each cluster's sum, never
        an update; ``after_train`` is not called then). Default: none."""

    def weigh(self, replies: list[TrainReply]) -> list[TrainReply]:
        """The replies as the average weighs them: by default each by its own num-examples."""
        return replies

    # ------------------------------------------------------------------ hooks
    def init_clusters(self) -> None:
        """FedAvg: one cluster holding θ0."""
        self.new_cluster(self.state.theta0)

    def admit(self, rnd: Round, keys: list[str]) -> Steps | Diagnostics | None:
        """Place clients the server has not assigned yet (returns its diagnostics). FedAvg: the one cluster."""
        for key in keys:
            self.state.assignment[key] = min(self.state.models)

    def before_train(self, rnd: Round) -> Steps | Diagnostics | None:
        """Clustering steps that happen before this round's training (returns their diagnostics)."""

    def after_train(self, rnd: Round, replies: list[TrainReply]) -> Diagnostics | None:
        """Clustering steps that use this round's training replies (CFL splits); returns their
        diagnostics, or a generator of the asks they need (CFL's longer evidence)."""

    def train_instructions(self, rnd: Round, key: str) -> dict[str, Any]:
        """Extra config for one client's train message."""
        return {}

    def cluster_state(self) -> dict[str, Any]:
        """What clusters.json holds beyond assignment and sizes."""
        return {}

    def one_cluster_reason(self, clients: Mapping[str, ClientInfo] | None = None) -> str | None:
        """Why the run ended with one cluster; None when it has more or one cluster is the design.
        ``clients``: the run's client table, as the driver hands it (a reason may quote sizes)."""
        return None

    def one_cluster_advice(self) -> str | None:
        """The one setting most likely to change a one-cluster ending (None: none to give)."""
        return None

    def cluster_count_basis(self) -> str | None:
        """One sentence on the evidence for the final number of clusters, without true groups
        (splits accepted with their scores against the thresholds, merges made or refused);
        the recorder quotes it when a run misses its true groups (``clusterfed.cluster_misses``). None: not said."""
        return None

    # ---------------------------------------------------------------- helpers
    def compared_names(self) -> list[str]:
        """The arrays of θ0 whose updates are compared (``compare-arrays``; every other
        array is only averaged per cluster). StrategyParamsError when it selects nothing
        or names an array the model lacks."""
        try:
            return compared_names(self.state.theta0, self.params.compare_arrays)
        except ValueError as error:
            raise StrategyParamsError(f"{self.name}: {error}") from None

    def select_compared_layers(self, rule: str, compare: Any = None) -> list[str]:
        """The compared arrays of θ0 that layer ``rule`` picks (``select_layers``) among
        ``compare`` (default ``compare-arrays``); StrategyParamsError, named for the strategy,
        when the rule or the selection selects nothing."""
        try:
            return select_layers(self.state.theta0, rule, self.params.compare_arrays if compare is None else compare)
        except ValueError as error:
            raise StrategyParamsError(f"{self.name}: {error}") from None

    def new_cluster(self, model: Arrays, inherit: int | None = None) -> int:
        """A new cluster starting from ``model``; with ``inherit``, its aggregator's optimiser
        state is a copy of that cluster's (a split's children), else it starts afresh."""
        cluster = self.state.next_cluster_id
        self.state.next_cluster_id += 1
        self.state.models[cluster] = {k: v.copy() for k, v in model.items()}
        if inherit is not None and inherit in self.state.aggregator_state:
            self.state.aggregator_state[cluster] = copy.deepcopy(self.state.aggregator_state[inherit])
        return cluster

    def members(self, rnd: Round, cluster: int) -> list[str]:
        """``rnd``'s active clients in ``cluster``, by key."""
        return rnd.members(self.state.assignment, cluster)

    def placed(self, rnd: Round) -> list[str]:
        """``rnd``'s active clients that are placed, in active order."""
        return rnd.placed(self.state.assignment)

    def sample(self, keys: list[str], fraction: float, minimum: int = 1) -> list[str]:
        if fraction >= 1.0 or not keys:
            return list(keys)
        chosen = self.state.rng.choice(len(keys), size=sample_size(len(keys), fraction, minimum), replace=False)
        return [keys[i] for i in sorted(chosen)]

    def draw_sample(self, rnd: Round) -> list[str] | None:
        """This round's ``fraction-train`` sample drawn among all active clients before
        placement, for a strategy whose placement asks clients for work (it then asks only
        these); None (the default): the trainers are sampled among the placed clients after
        placement, which asks nothing."""
        return None

    def sample_active(self, rnd: Round) -> list[str]:
        """A ``fraction-train`` sample of every client active in ``rnd``, placed or not."""
        return self.sample(list(rnd.active), self.params.fraction_train, self.params.min_train_nodes)

    def select_trainers(self, rnd: Round) -> list[str]:
        """The keys that train this round: a ``fraction-train`` sample of placed clients,
        or the sampled clients that are placed when the sample was drawn before placement
        (its training sample, ``rnd.train_sample``, when placement asked more clients)."""
        sample = rnd.train_sample if rnd.train_sample is not None else rnd.sampled
        if sample is not None:
            return [k for k in sample if k in self.state.assignment]
        return self.sample(self.placed(rnd), self.params.fraction_train, self.params.min_train_nodes)

    def train_asks(self, rnd: Round, keys: list[str], *, models: dict[str, Arrays] | None = None,
                   extra: dict[str, Any] | None = None, phase: str = "train", evidence: bool = False) -> list[Ask]:
        """Train ``keys``, each on its cluster's model (or on ``models[key]``, where given);
        ``evidence``: every ask is for a decision's evidence only (so is a training ask of a
        client in ``rnd.evidence_only``)."""
        asks = []
        for key in keys:
            cluster = self.state.assignment.get(key, -1)
            config = {"server-round": rnd.number, "phase": phase, "upload": UPLOAD_FULL, "return": RETURN_WEIGHTS,
                      "cluster-id": cluster}
            config.update(self.train_instructions(rnd, key))
            config.update(extra or {})
            if self.dp is not None:  # what Flower's fixedclipping_mod reads
                config[privacy.CLIPPING_NORM_KEY] = self.dp.clipping_norm
            asks.append(Ask(key, models[key] if models and key in models else self.state.models[cluster], config,
                            evidence=evidence or (phase == "train" and key in rnd.evidence_only)))
        return asks

    def aggregate_clusters(self, replies: list[TrainReply]) -> Diagnostics:
        """Each cluster's new model from the members that replied, by the cluster's aggregator
        (``aggregator``; the sample-weighted mean by default); a cluster none of whose members
        replied keeps its model. Returns the diagnostics: why a robust aggregator that had too
        few replies in a cluster used the weighted mean (``aggregator_fallback``), ``privacy``."""
        by_cluster: dict[int, list[TrainReply]] = defaultdict(list)
        for reply in replies:
            if reply.cluster in self.state.models and set(reply.arrays) == set(self.state.shapes):
                by_cluster[reply.cluster].append(reply)
        # optimiser states of clusters that no longer exist (split, merged, re-cut) go
        self.state.aggregator_state = {c: s for c, s in self.state.aggregator_state.items() if c in self.state.models}
        released: dict[int, dict[str, Any]] = {}
        fallbacks: dict[str, str] = {}
        for cluster, group in by_cluster.items():
            group = by_key(group)  # summed in the order of the client keys, not of arrival
            if self.dp is not None:  # clipped, equal weights (clusterfed.privacy)
                group = privacy.clip_replies(group, self.dp.clipping_norm)
            self.state.models[cluster], fallback = self.aggregate_cluster(cluster, group)
            if fallback is not None:
                fallbacks[str(cluster)] = fallback
            if self.dp is not None:
                released[cluster] = self.add_dp_noise(cluster, group)
        diagnostics: Diagnostics = {"aggregator_fallback": fallbacks} if fallbacks else {}
        if self.dp_accountant is not None:
            diagnostics["privacy"] = self.dp_accountant.report(self.state.dp_releases, self.state.assignment, released)
        return diagnostics

    def aggregate_cluster(self, cluster: int, replies: list[TrainReply]) -> tuple[Arrays, str | None]:
        """One cluster's new model from its members' ``replies`` (weighed by num-examples), by its
        own aggregator (optimiser state kept per cluster), and why the aggregator fell back to
        the weighted mean (None when it did not). The weighted mean adds each reply as sent
        model + update (``weighted_average``), so replies of weights and of updates agree."""
        counts = [r.num_examples for r in replies]
        if self.aggregator is None:
            return weighted_average([r.update for r in replies], counts, sent=[r.sent for r in replies]), None
        weights = [r.weights for r in replies]
        model, self.state.aggregator_state[cluster], fallback = self.aggregator.aggregate(
            self.state.models[cluster], weights, counts, self.state.aggregator_state.get(cluster))
        if fallback is not None:
            log(logging.WARNING, "cluster %s: %s", cluster, fallback)
        return model, fallback

    def add_dp_noise(self, cluster: int, group: list[TrainReply]) -> dict[str, Any]:
        """Gaussian noise on ``cluster``'s new average of ``group``'s clipped replies; each
        member's update went into one more release. Returns what was released."""
        std = self.dp.noise_std(len(group))
        self.state.models[cluster] = privacy.add_noise(self.state.models[cluster], std, self.state.rng)
        if std > 0:
            for reply in group:
                self.state.dp_releases[reply.key] = self.state.dp_releases.get(reply.key, 0) + 1
        return {"sampled": len(group), "noise_std": std}

    # ------------------------------------------------------------- evaluation
    def evaluation_models(self, server_round: int, active: list[str]) -> dict[str, tuple[int, Arrays]]:
        """Who is evaluated this round among the ``active`` client keys (the driver's, as the
        round got them), each with (its cluster, the model to test)."""
        if self.params.fraction_evaluate <= 0:
            return {}
        placed = [k for k in active if k in self.state.assignment]
        keys = self.sample(placed, self.params.fraction_evaluate, self.params.min_evaluate_nodes)
        return {k: (self.state.assignment[k], self.eval_model(k)) for k in keys}

    def eval_model(self, key: str) -> Arrays:
        return self.state.models[self.state.assignment[key]]

    def final_clusters(self, training_failed: str | None = None,
                       clients: Mapping[str, ClientInfo] | None = None) -> dict[str, Any]:
        """What clusters.json holds (the recorder adds the true groups: scoring is the driver's);
        ``training_failed``: why no client's training was accepted, when a run stopped so;
        ``clients``: the run's client table, as the driver hands it (``one_cluster_reason``)."""
        assignment = {k: self.state.assignment[k] for k in sorted(self.state.assignment, key=natural)}
        sizes: dict[str, int] = defaultdict(int)
        for cluster in assignment.values():
            sizes[str(cluster)] += 1
        state = {
            "strategy": self.name,
            "assignment": assignment,
            "sizes": dict(sizes),
            "newcomers": self.state.newcomer_log,
        }
        state.update(self.cluster_state())
        if "one_cluster_reason" not in state and self.one_cluster_reasons:
            state["one_cluster_reason"] = self.one_cluster_reason(clients)
        if (basis := self.cluster_count_basis()) is not None:
            state["cluster_count_basis"] = basis
        if self.dp_accountant is not None:
            state["privacy"] = self.dp_accountant.report(self.state.dp_releases, assignment)
        if training_failed:  # nothing trained: that, not the algorithm, is why
            state["one_cluster_reason"] = state["training_failed"] = training_failed
        return state

    def cluster_models(self) -> dict[int, Arrays]:
        """The models clients are served at the end of a run, by cluster id."""
        return self.state.models


document_params(ClusteredStrategy, base=True)
