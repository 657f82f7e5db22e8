"""The server side: one SecAgg+ instance per group of clients, with no Messages in it.

A driver asks ``protocol.asks()`` for the current stage's ask to each member (a plain dict,
``wire.ask_content`` makes it a message's content; at the collect stage the driver adds its
train content), sends them, and hands the replies to ``protocol.take`` (``wire.reply_from_content``
of each reply; a member without a reply, or with an error reply, is absent or None). After the
unmask stage ``protocol.result()`` is the group's weighted sum and mean of the completed members'
arrays. ``run_groups`` runs several groups side by side, one exchange per stage for all of them.

The server holds public keys, encrypted shares it cannot open, masked vectors (summed as they
are taken, then dropped) and, at the end, the shares that rebuild the survivors' mask seeds and
the dropped members' mask keys: the sum of the survivors, never one member's values.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

from clusterfed.secagg import vectors, wire
from clusterfed.secagg.settings import GroupTooSmall, SecAggError, SecAggSettings, SecAggSettingsError, group_plan

Member = Hashable


@dataclass
class GroupResult:
    """The unmasked group sum. ``sums``/``means``: record name -> array name -> float64 array
    (the weighted sum ``sum w_i x_i`` and mean ``sum w_i x_i / W``); ``arrays`` casts the mean
    to each array's own dtype. ``members``: whose values are in the sum; ``dropped``: member ->
    the stage it dropped at and why; ``clipped``: values clipped over the whole group."""

    members: tuple[Member, ...]
    dropped: dict[Member, str]
    total_weight: int
    clipped: int
    layout: vectors.Layout
    sums: dict[str, dict[str, np.ndarray]]
    means: dict[str, dict[str, np.ndarray]]

    def arrays(self, record: str = "arrays") -> dict[str, np.ndarray]:
        dtypes = {(r, n): d for r, n, d, _ in self.layout}
        out = {}
        for name, mean in self.means[record].items():
            dtype = np.dtype(dtypes[(record, name)])
            out[name] = (np.rint(mean) if dtype.kind in "iub" else mean).astype(dtype)
        return out


@dataclass
class _Ledger:
    down: dict[str, dict[Member, int]] = field(default_factory=dict)
    up: dict[str, dict[Member, int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


class GroupProtocol:  # pylint: disable=too-many-instance-attributes
    """SecAgg+ among ``members`` (stable client keys). GroupTooSmall for a group below the
    minimum (``settings.minimum_group_size()``), SecAggSettingsError for settings that cannot
    hold this group's sum; both before any ask. ``seed`` fixes the neighbour ring (None: drawn
    from the system's randomness)."""

    def __init__(self, members: Iterable[Member], settings: SecAggSettings | None = None, *,
                 session: str = "", seed: int | None = None) -> None:
        members = list(members)
        if len(set(members)) != len(members):
            raise SecAggSettingsError(f"secure aggregation: a group lists a member twice: {members}")
        self.settings = settings if settings is not None else SecAggSettings()
        self.plan = group_plan(self.settings, len(members))
        self.session = session
        ordered = sorted(members, key=str)
        self._member = {i + 1: m for i, m in enumerate(ordered)}
        self._index = {m: i for i, m in self._member.items()}
        self.neighbours = _ring(list(self._member), self.plan.shares, seed)
        self.stage = wire.SETUP
        self.alive: set[int] = set(self._member)
        self.dropped: dict[Member, str] = {}
        self.ledger = _Ledger()
        self._keys: dict[int, tuple[bytes, bytes]] = {}
        self._shared: set[int] = set()  # U2: sent their encrypted shares
        self._forward: dict[int, list[tuple[int, bytes]]] = {}
        self._asked: dict[int, dict[str, object]] = {}
        self._last_asked: dict[int, dict[str, object]] = {}
        self._collected: set[int] = set()  # U3: sent a masked vector the sum took
        self._sum: np.ndarray | None = None
        self._layout: vectors.Layout = []
        self._result: GroupResult | None = None

    # -- the driver's interface ------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.stage == wire.DONE

    def asks(self) -> dict[Member, dict[str, object]]:
        """The current stage's ask to each member still in the protocol (plain ConfigRecord values)."""
        if self.stage not in wire.STAGES:
            raise SecAggError(f"secure aggregation {self.session!r}: no stage to ask for ({self.stage})")
        if not self._asked:
            started = time.perf_counter()
            make = {wire.SETUP: self._setup_ask, wire.SHARE_KEYS: self._share_keys_ask,
                    wire.COLLECT: self._collect_ask, wire.UNMASK: self._unmask_ask}[self.stage]
            self._asked = {i: {"stage": self.stage, "session": self.session, **make(i)} for i in sorted(self.alive)}
            self.ledger.down[self.stage] = {self._member[i]: wire.count_bytes(a) for i, a in self._asked.items()}
            self._add_seconds(started)
        return {self._member[i]: dict(ask) for i, ask in self._asked.items()}

    def take(self, replies: Mapping[Member, Mapping[str, object] | None]) -> None:
        """This stage's replies (member -> reply dict; absent or None = dropped). Advances to the
        next stage, or raises SecAggError when too few members are left (the group fails)."""
        self.asks()
        started = time.perf_counter()
        stage, asked = self.stage, self._asked
        valid: dict[int, Mapping[str, object]] = {}
        self.ledger.up[stage] = {}
        for i in asked:
            reply = replies.get(self._member[i])
            if reply is None:
                self._drop(i, "no reply")
                continue
            self.ledger.up[stage][self._member[i]] = wire.count_bytes(reply)
            if reply.get("stage") != stage or reply.get("session") != self.session:
                self._drop(i, f"a reply for {reply.get('stage')!r} of session {reply.get('session')!r}")
                continue
            valid[i] = reply
        self._asked, self._last_asked = {}, asked
        try:
            {wire.SETUP: self._take_setup, wire.SHARE_KEYS: self._take_share_keys,
             wire.COLLECT: self._take_collect, wire.UNMASK: self._take_unmask}[stage](valid)
            if stage != wire.UNMASK:
                self._check_viable()
        except SecAggError:
            self.stage = wire.FAILED
            raise
        finally:
            self._add_seconds(started, stage)
        self.stage = wire.STAGES[wire.STAGES.index(stage) + 1] if stage != wire.UNMASK else wire.DONE

    def result(self) -> GroupResult:
        if self._result is None:
            raise SecAggError(f"secure aggregation {self.session!r}: no result ({self.stage})")
        return self._result

    # -- stages ------------------------------------------------------------------------------
    def _setup_ask(self, i: int) -> dict[str, object]:
        s = self.settings
        return {"index": i, "threshold": self.plan.threshold, "shares": len(self.neighbours[i]),
                "clipping-range": float(s.clipping_range), "levels": s.quantization_range,
                "modulus-bits": s.modulus_bits, "max-weight": s.max_weight, "weight-key": s.weight_key or "",
                "min-group-size": s.min_group_size}

    def _take_setup(self, valid: Mapping[int, Mapping[str, object]]) -> None:
        for i, reply in valid.items():
            pk1, pk2 = reply.get("pk1"), reply.get("pk2")
            if not (isinstance(pk1, bytes) and isinstance(pk2, bytes)):
                self._drop(i, "no public keys")
                continue
            self._keys[i] = (pk1, pk2)

    def _share_keys_ask(self, i: int) -> dict[str, object]:
        members = sorted(self.neighbours[i] & self.alive)
        return {"neighbours": members, "pk1": [self._keys[m][0] for m in members],
                "pk2": [self._keys[m][1] for m in members]}

    def _take_share_keys(self, valid: Mapping[int, Mapping[str, object]]) -> None:
        sent: dict[int, list[tuple[int, bytes]]] = {}
        for i, reply in valid.items():
            dsts, ctxts = list(reply.get("dsts", [])), list(reply.get("ctxts", []))
            expected = set(self._last_asked[i]["neighbours"]) - {i}
            if len(dsts) != len(ctxts) or set(dsts) != expected or not all(isinstance(c, bytes) for c in ctxts):
                self._drop(i, "its encrypted shares do not match its neighbours")
                continue
            sent[i] = list(zip(dsts, ctxts))
        self._shared = set(sent)
        self._forward = {i: [] for i in sent}
        for src, pairs in sorted(sent.items()):
            for dst, ciphertext in pairs:
                if dst in self._forward:
                    self._forward[dst].append((src, ciphertext))

    def _collect_ask(self, i: int) -> dict[str, object]:
        return {"srcs": [src for src, _ in self._forward[i]], "ctxts": [c for _, c in self._forward[i]]}

    def _take_collect(self, valid: Mapping[int, Mapping[str, object]]) -> None:
        dtype = vectors.wire_dtype(self.settings.modulus_bits)
        texts = {i: r.get("layout") for i, r in valid.items() if isinstance(r.get("layout"), str)}
        counts = Counter(texts.values())
        common = min(counts, key=lambda text: (-counts[text], text)) if counts else ""
        self._layout = vectors.layout_from_text(common) if common else []
        size = vectors.HEADER + vectors.layout_size(self._layout)
        total = np.zeros(size, dtype=np.uint64)
        for i, reply in sorted(valid.items()):
            vector = reply.get(wire.VECTOR)
            if texts.get(i) != common:
                self._drop(i, "its arrays (names, shapes, dtypes) differ from the group's")
            elif not isinstance(vector, np.ndarray) or vector.dtype != dtype or vector.shape != (size,):
                self._drop(i, "a masked vector of the wrong type or size")
            else:
                total += vector.astype(np.uint64)  # wraps modulo 2**64; reduced below
        self._sum = vectors.reduce(total, self.settings.modulus_bits)

    def _unmask_ask(self, i: int) -> dict[str, object]:
        holds = {src for src, _ in self._forward[i]} | {i}
        return {"alive": sorted(self.neighbours[i] & self.alive & holds),
                "dead": sorted(self.neighbours[i] & (self._shared - self.alive) & holds)}

    def _take_unmask(self, valid: Mapping[int, Mapping[str, object]]) -> None:
        survivors, dead = set(self._collected), self._shared - self._collected
        shares: dict[int, list[bytes]] = {i: [] for i in survivors | dead}
        for i, reply in valid.items():
            owners, given = list(reply.get("owners", [])), list(reply.get("shares", []))
            asked = self._last_asked[i]
            if (len(owners) != len(given) or set(owners) != set(asked["alive"]) | set(asked["dead"])
                    or not all(isinstance(share, bytes) for share in given)):
                self._drop(i, "its shares do not match the ask")
                continue
            for owner, share in zip(owners, given):
                shares[owner].append(share)
        total = self._sum
        for owner in sorted(survivors):
            total -= vectors.mask(self._secret(owner, shares[owner], "mask seed"), total.size, self.settings.modulus_bits)
        for owner in sorted(dead):
            try:
                key = bytes_to_private_key(self._secret(owner, shares[owner], "mask key"))
            except ValueError as error:
                raise SecAggError(self._failure(f"member {self._member[owner]!r}'s mask key: {error}")) from None
            for j in sorted(survivors):
                if owner in {src for src, _ in self._forward[j]}:
                    pairwise = vectors.mask(vectors.mask_key(generate_shared_key(key, bytes_to_public_key(
                        self._keys[j][0]))), total.size, self.settings.modulus_bits)
                    total = total - pairwise if j > owner else total + pairwise
        self._finish(vectors.reduce(total, self.settings.modulus_bits), survivors)

    def _secret(self, owner: int, shares: list[bytes], what: str) -> bytes:
        if len(shares) < self.plan.threshold:
            raise SecAggError(self._failure(f"member {self._member[owner]!r}'s {what} has {len(shares)} of the "
                                            f"{self.plan.threshold} shares needed"))
        try:
            return combine_shares(shares[: self.plan.threshold])
        except ValueError as error:
            raise SecAggError(self._failure(f"member {self._member[owner]!r}'s {what}: {error}")) from None

    def _finish(self, total: np.ndarray, survivors: set[int]) -> None:
        s = self.settings
        weight, clipped = int(total[0]), int(total[1])
        sums, means = vectors.dequantize(total[vectors.HEADER:], weight, s.clipping_range, s.quantization_range)
        self._sum = None
        self._result = GroupResult(
            members=tuple(self._member[i] for i in sorted(survivors)), dropped=dict(self.dropped),
            total_weight=weight, clipped=clipped, layout=self._layout,
            sums=vectors.unflatten(sums, self._layout), means=vectors.unflatten(means, self._layout))

    # -- bookkeeping ---------------------------------------------------------------------------
    def _drop(self, i: int, why: str) -> None:
        self.alive.discard(i)
        self.dropped[self._member[i]] = f"{self.stage}: {why}"

    def _check_viable(self) -> None:
        if self.stage == wire.COLLECT:
            self._collected = set(self.alive)
        needed = max(self.plan.threshold, self.settings.min_group_size)
        if len(self.alive) < needed:
            raise SecAggError(self._failure(f"{len(self.alive)} member(s) left, fewer than {needed} "
                                            f"(threshold {self.plan.threshold}, min_group_size "
                                            f"{self.settings.min_group_size})"))
        owners = self._shared if self._shared else self.alive
        short = [self._member[i] for i in sorted(owners) if len(self.neighbours[i] & self.alive) < self.plan.threshold]
        if short:
            raise SecAggError(self._failure(f"fewer than {self.plan.threshold} neighbours left to hold the shares "
                                            f"of {short}"))

    def _failure(self, why: str) -> str:
        return (f"secure aggregation of group {self.session!r} failed at {self.stage}: {why}; the group's sum "
                "is not produced and no member's values were revealed")

    def _add_seconds(self, started: float, stage: str | None = None) -> None:
        stage = stage or self.stage
        self.ledger.seconds[stage] = self.ledger.seconds.get(stage, 0.0) + time.perf_counter() - started


def _ring(indices: Sequence[int], shares: int, seed: int | None) -> dict[int, set[int]]:
    """Each member's neighbourhood, itself included: everyone (complete graph) or, in a ring of
    the members in random order, the (shares - 1) / 2 on each side (SecAgg+'s Harary graph)."""
    if shares >= len(indices):
        return {i: set(indices) for i in indices}
    order = list(indices)
    (random.Random(seed) if seed is not None else random.SystemRandom()).shuffle(order)
    half = shares // 2
    n = len(order)
    return {order[p]: {order[(p + o) % n] for o in range(-half, half + 1)} for p in range(n)}


def split_groups(groups: Mapping[Hashable, Iterable[Member]], settings: SecAggSettings
                 ) -> tuple[dict[Hashable, list[Member]], dict[Hashable, str]]:
    """(groups to aggregate securely, groups held back -> why): the small-group rule applied
    before any message; a held-back group is not asked for updates and keeps its model."""
    secure, held = {}, {}
    for group, members in groups.items():
        members = list(members)
        try:
            group_plan(settings, len(members))
            secure[group] = members
        except GroupTooSmall as reason:
            held[group] = str(reason)
    return secure, held


Exchange = Callable[[str, dict[Hashable, dict[Member, dict[str, object]]]],
                    dict[Hashable, Mapping[Member, Mapping[str, object] | None]]]


def run_groups(protocols: Mapping[Hashable, GroupProtocol], exchange: Exchange
               ) -> dict[Hashable, GroupResult | SecAggError]:
    """Run the groups side by side: per stage one ``exchange(stage, {group: asks})`` that sends
    every group's asks and returns ``{group: {member: reply or None}}``. A group that fails
    (SecAggError) is reported as such; the others go on."""
    outcome: dict[Hashable, GroupResult | SecAggError] = {}
    for stage in wire.STAGES:
        running = {g: p for g, p in protocols.items() if g not in outcome}
        if not running:
            break
        replies = exchange(stage, {g: p.asks() for g, p in running.items()})
        for group, protocol in running.items():
            try:
                protocol.take(replies.get(group, {}))
            except SecAggError as error:
                outcome[group] = error
    return {group: outcome[group] if group in outcome else protocol.result() for group, protocol in protocols.items()}
