"""What an algorithm asks clients for and what it gets back, and what a round hands the
driver (its diagnostics, its reports for scoring): plain values, no transport.

The runner turns each ``Ask`` into a Flower message, validates the reply and hands the
algorithm a ``TrainReply``; an algorithm never sees a message, a node id or a bad reply.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray]

# the message contract's names (an Ask's "upload"/"return" values, IFCA's multi-model ask),
# shared with the client
from clusterfed.protocol import (  # noqa: E402,F401
    CHOICE,
    CHOICES,
    RETURN_UPDATE,
    RETURN_WEIGHTS,
    UPLOAD_FULL,
    apply_difference,
    difference,
    pack_models,
    unpack_model,
)

# an Ask's "phase" when the client trains the model it is sent for the round's update (IFCA's
# warm-up trains θ0 so): what Flower's single-phase configure_train may send; "cluster" and
# "placement" ask for clustering work before training
TRAINING_PHASES = ("train", "warmup")


@dataclass
class ClientInfo:
    """What the server learnt of a client from its profile."""

    key: str
    num_examples: int
    true_group: int  # metrics only: no algorithm may read it (the oracle excepted)
    label_stats: dict[str, float] = field(default_factory=dict)
    # a stock Flower ClientApp (no profile query): it trains its own run config's
    # local-epochs, whatever the message says, and returns its whole model
    stock: bool = False


# What a hook returns about its round, beside its effect on the state: column -> JSON value
# (numbers, strings, lists, dicts), written into the round's row of rounds.jsonl. The round
# merges its hooks' diagnostics in the order they ran; the driver records them.
Diagnostics = dict[str, Any]


def diagnostics_of(value: Any) -> Diagnostics:
    """What a hook returned, as a new diagnostics dict ({} for None); TypeError for anything else."""
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"a strategy hook returned a {type(value).__name__}: a hook returns its diagnostics "
                        f"(a dict of rounds.jsonl columns) or None")
    return dict(value or {})


def add_diagnostics(into: Diagnostics, more: Any) -> None:
    """Merge a step's diagnostics (``diagnostics_of``) into the round's: later columns win,
    except the round line's words (``decision``), which each step adds after the earlier ones'."""
    more = diagnostics_of(more)
    said = [text for text in (into.get("decision"), more.pop("decision", None)) if text]
    into.update(more)
    if said:
        into["decision"] = "; ".join(said)


def steps(result: Iterator | Diagnostics | None) -> Steps:
    """``diagnostics = yield from steps(hook(...))``: a hook written as a plain method asks
    nothing (what it returns is its diagnostics); one written as a generator is run to its
    end (what it ``return``s is). Gives the hook's diagnostics ({} for None)."""
    return diagnostics_of((yield from result) if isinstance(result, Iterator) else result)


@dataclass(eq=False)
class SplitCompared:
    """A split, made or refused, as the driver's scoring reads it: the clients it compared
    (the rows of ``similarity``, the matrix it decided on) and the strategy's records of it.
    A strategy never sees true groups: the scoring writes into ``records`` how the matrix
    separates them (Sattler's gap of the true groups), after the round."""

    keys: list[str]
    similarity: np.ndarray
    records: list[dict[str, Any]] = field(default_factory=list)


@dataclass(eq=False)
class NewcomersPlaced:
    """Newcomers placed in one step, in order: their newcomer-log ``entries`` (``client``,
    ``cluster``, ``new_cluster``), into which the driver's scoring writes each one's true
    group and whether it joined the cluster of its group, after the round."""

    entries: list[dict[str, Any]]


@dataclass
class Ask:
    """Train ``model`` on client ``key`` with ``config`` (phase, cluster-id, upload, return,
    local-epochs, lr and algorithm extras; the runner adds the data/model spec). ``evidence``
    (never sent): the training is asked for a decision's evidence only, compared and never
    averaged (``Round.evidence_only``, a further exchange's ``evidence_replies``); the driver
    leaves it out of the round's train metrics, and its failure does not fail a client whose
    averaged training of the round was accepted."""

    key: str
    model: Arrays
    config: dict[str, Any]
    evidence: bool = False

    @property
    def upload(self) -> list[str] | None:
        """The array names the client must return; None = all of the model's."""
        value = str(self.config.get("upload", UPLOAD_FULL))
        return None if value == UPLOAD_FULL else [name for name in value.split(",") if name]

    @property
    def choices(self) -> int:
        """K for a multi-model ask (the client picks one of K models), else 0."""
        return int(self.config.get(CHOICES, 0) or 0)

    def chosen(self, metrics) -> tuple[int, Arrays]:
        """(cluster, model sent) that a reply with ``metrics`` trained: for a multi-model
        ask, the model whose index the client reported (ValueError when it is missing or
        out of range); otherwise the ask's cluster and model."""
        if not self.choices:
            return int(self.config["cluster-id"]), self.model
        value = metrics.get(CHOICE) if hasattr(metrics, "get") else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) \
                or not 0 <= int(value) < self.choices:
            raise ValueError(f"{CHOICE} must be an integer in 0..{self.choices - 1}, got {value!r}")
        return int(value), unpack_model(self.model, int(value))


@dataclass
class TrainReply:
    """A validated train reply: exactly the arrays asked for, finite, of the right shapes."""

    key: str
    cluster: int
    arrays: Arrays  # what the client returned (weights or updates)
    sent: Arrays  # the model it was sent (same names as ``arrays``)
    num_examples: int
    train_loss: float | None  # None: a stock client that reported none
    metrics: dict[str, float]
    is_update: bool = False

    @property
    def update(self) -> Arrays:
        return self.arrays if self.is_update else {k: difference(self.arrays[k], self.sent[k]) for k in self.arrays}

    @property
    def weights(self) -> Arrays:
        return {k: apply_difference(self.sent[k], self.arrays[k]) for k in self.arrays} if self.is_update else self.arrays


class Replies(list):
    """The validated replies of one request, in the order the asks were sent.
    ``bytes_up`` counts every array byte received for it, rejected replies included."""

    def __init__(self, replies=(), bytes_up: int = 0):
        super().__init__(replies)
        self.bytes_up = bytes_up


class Trainers(list):
    """The client keys that train this round (``select_trainers``), with what choosing them
    found (``diagnostics``: selection's p and representatives), which the round records."""

    def __init__(self, keys=(), diagnostics: Diagnostics | None = None):
        super().__init__(keys)
        self.diagnostics = dict(diagnostics or {})


@dataclass(eq=False)
class Round:
    """One round's values, handed to every hook as its first argument (``rnd``): the round's
    ``number``; the ``active`` client keys and the ``train_config`` the driver hands it;
    ``clients``, the driver's client table (read-only: the membership owns it); ``sampled``,
    the round's sample drawn before placement (``draw_sample``; None: trainers are sampled
    among the placed clients), set by the round skeleton; ``train_sample``, the trainers'
    sample when placement asks more clients than train (a clustering step that asks every
    active client, set by ``draw_sample``; None: ``sampled``); ``evidence_only``, clients the
    round trains only for a clustering decision's evidence, compared but not averaged (set by
    ``draw_sample``: ``split-min-repliers``, ``ask-again``); ``evidence_replies``, training
    replies asked in a further exchange of the round for a decision's evidence only (FedClust's
    and AdaCFL's merge probe: guests on another cluster's model, that cluster's members beyond
    the sample on their own): compared, never averaged; and ``reports``, the splits and
    placements (``SplitCompared``, ``NewcomersPlaced``) the round appends for the driver's
    scoring. Per round, never state: a round is never resumed midway."""

    number: int
    active: list[str]
    train_config: dict[str, Any] = field(default_factory=dict)
    clients: Mapping[str, ClientInfo] = field(default_factory=dict)
    sampled: list[str] | None = None
    train_sample: list[str] | None = None
    evidence_only: frozenset[str] = frozenset()
    evidence_replies: list[TrainReply] = field(default_factory=list)
    reports: list[Any] = field(default_factory=list)
    one_exchange: bool = False  # Flower's single-phase hooks drive the round: no step may ask a further exchange

    def placed(self, assignment: Mapping[str, int]) -> list[str]:
        """The active clients that ``assignment`` places, in active order."""
        return [k for k in self.active if k in assignment]

    def members(self, assignment: Mapping[str, int], cluster: int) -> list[str]:
        """The active clients ``assignment`` places in ``cluster``, by key."""
        active = set(self.active)
        return sorted((k for k, c in assignment.items() if c == cluster and k in active), key=natural)

    def reachable(self, keys: list[str]) -> list[str]:
        """``keys`` that may be asked for work this round: those in the round's sample
        (``sampled``), or all of them when the round has none."""
        if self.sampled is None:
            return list(keys)
        chosen = set(self.sampled)
        return [k for k in keys if k in chosen]


@dataclass
class RoundResult:
    """What a round hands the driver when it is over (``round_steps``' return value): its
    diagnostics (rounds.jsonl's columns) and its reports (``SplitCompared``,
    ``NewcomersPlaced``), which the driver scores against the true groups."""

    diagnostics: Diagnostics
    reports: list[Any] = field(default_factory=list)


@dataclass
class SecureTrain:
    """Train ``asks`` under secure aggregation: one SecAgg+ instance per group (``groups``:
    cluster -> member keys, each member's train ask in ``asks``), run by the driver over its
    exchanges (``clusterfed.secagg``). What comes back is ``SecureSums``: each group's unmasked
    weighted mean, never one member's arrays. ``settings``: the protocol's
    (``clusterfed.secagg.SecAggSettings``)."""

    asks: list[Ask]
    groups: dict[int, list[str]]
    settings: Any
    session: str = ""


@dataclass
class GroupSum:
    """One group's unmasked result: the weighted ``mean`` of its ``members``' returned arrays
    (each array in the model's dtype), the model they were ``sent``, the total weight, how
    many values the protocol clipped, who dropped out (key -> stage and why), the members'
    train losses (reported in the clear, as Flower's SecAgg+ leaves metrics) and the
    protocol's bytes each way."""

    cluster: int
    members: list[str]
    mean: Arrays
    sent: Arrays
    total_weight: int
    clipped: int = 0
    dropped: dict[str, str] = field(default_factory=dict)
    losses: dict[str, float] = field(default_factory=dict)
    bytes_down: int = 0
    bytes_up: int = 0


class SecureSums(dict):
    """The driver's answer to a ``SecureTrain``: cluster -> ``GroupSum``, or the sentence why
    the group's protocol failed (too many dropped: no sum, nothing revealed)."""


# a hook that asks clients for work: it yields lists of asks (or, for a securely aggregated
# training step, a ``SecureTrain``), is sent their replies (``Replies``; ``SecureSums``), and
# returns its diagnostics (a helper written as one returns what its hook needs)
Steps = Generator[Any, Any, Any]


def weighted_average(arrays: list[Arrays], weights: list[float], sent: list[Arrays] | None = None) -> Arrays:
    """Sample-weighted aggregate per array name, in each array's own dtype and shape.

    Floating-point (and complex) arrays: the weighted mean, summed in float64 (complex128)
    in list order. Integer arrays (``num_batches_tracked`` and other counters): the weighted
    mean rounded to the nearest integer (halves to even). Bool arrays (masks): the weighted
    majority, True on a tie.

    With ``sent`` (the models the clients were sent, one per entry), ``arrays`` are updates
    (``difference(trained, sent)``): a floating-point term is then ``sent + update`` taken in
    float64, so that replies carrying weights (turned into updates by ``difference``, the
    client's own arithmetic) and replies carrying updates sum to the same numbers bit for bit;
    ``sent + update`` rounded to the array's dtype would lose the last bit of some weights."""
    total = float(sum(weights))
    out = {}
    for n in arrays[0].keys():
        dtype = np.asarray(arrays[0][n]).dtype
        exact = np.issubdtype(dtype, np.inexact)
        wide = np.complex128 if np.issubdtype(dtype, np.complexfloating) else np.float64
        # 0 + w_0 a_0 + w_1 a_1 + ... in float64, in place: the numbers ``sum()`` of the
        # products gives (from the same zero), without two temporaries per client and array
        acc = np.zeros(np.shape(arrays[0][n]), wide)
        term = np.empty_like(acc)
        for i, (a, w) in enumerate(zip(arrays, weights)):
            if sent is not None and exact:
                np.add(sent[i][n], a[n], out=term, dtype=wide)
                term *= w
            else:
                value = a[n] if sent is None else apply_difference(sent[i][n], a[n])
                np.multiply(value, w, out=term, dtype=wide)
            acc += term
        mean = np.asarray(acc / total)  # asarray: a 0-d quotient is a numpy scalar
        if dtype == np.bool_:
            out[n] = np.asarray(mean >= 0.5)
        elif np.issubdtype(dtype, np.integer):
            out[n] = np.asarray(np.rint(mean)).astype(dtype)
        else:
            out[n] = mean.astype(dtype)
    return out


def by_key(replies: list) -> list:
    """``replies`` (anything with a client ``key``) in the order of their keys: every sum over
    clients is taken in this order, so a run does not depend on the order replies arrived in."""
    return sorted(replies, key=lambda reply: natural(reply.key))


def natural(key: str) -> tuple[int, str]:
    """Sort client keys 0, 1, 2, ..., 10 rather than 0, 1, 10, 2."""
    return (int(key), "") if key.isdigit() else (1 << 62, key)
