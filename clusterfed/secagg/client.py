"""The client side: a Flower mod that runs SecAgg+'s four stages around a stock train function.

``ClientApp(mods=[secagg_mod])`` (or ``@app.train(mods=[secagg_mod])``) is all a user adds. A
train message without the protocol's record passes through untouched, so the same ClientApp
serves plain rounds (a clustering round that reads individual updates); ``secagg_client_mod(
require=True)`` instead fails every train message that is not part of the protocol, for a client
that never sends an unmasked update.

Stages (Bell et al., CCS 2020; Flower's SecAgg+ stage names and checks):

- setup: two fresh key pairs (one for the pairwise masks, one for encrypting shares); the
  public keys go to the server.
- share-keys: a fresh 32-byte mask seed; the seed and the mask key's private key are split
  into Shamir shares (threshold t), each neighbour's pair encrypted to it with a key agreed
  from the neighbours' public keys (ECDH + HKDF, Fernet).
- collect: the neighbours' encrypted shares are opened and kept; the user's train function
  runs on the message with the protocol's record removed; its reply's arrays (every
  ArrayRecord) are weighted, quantized and masked with the seed's mask and one pairwise mask
  per neighbour that shared keys; the reply carries the masked vector and the arrays' layout
  instead of the arrays, its metrics without the weight (which is in the masked vector).
- unmask: for each neighbour the server names alive, its seed share; for each named dead, its
  private-key share; never both for one neighbour. The secrets are then forgotten.

State between stages lives in ``Context.state`` (a ConfigRecord), as Flower's own mod keeps it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.common.secure_aggregation.crypto.shamir import create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, compute_clip_model_update, get_norm
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from clusterfed.secagg import vectors, wire

STATE = "clusterfed.secagg.state"  # the ConfigRecord in Context.state

Mod = Callable[[Message, Context, Callable[[Message, Context], Message]], Message]


class ProtocolViolation(ValueError):
    """The server's ask breaks the protocol; the member answers with an error (counted as dropped)."""


@dataclass
class ClientState:  # pylint: disable=too-many-instance-attributes
    session: str = ""
    stage: str = wire.DONE
    index: int = 0
    threshold: int = 0
    shares: int = 0
    clipping_range: float = 0.0
    levels: int = 0
    modulus_bits: int = 0
    max_weight: int = 0
    weight_key: str = ""
    sk1: bytes = b""
    pk1: bytes = b""
    sk2: bytes = b""
    pk2: bytes = b""
    seed: bytes = b""
    peers: list[int] = field(default_factory=list)  # neighbours (not itself) seen at share-keys
    peer_pk1: list[bytes] = field(default_factory=list)
    peer_pk2: list[bytes] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)  # whose shares this member holds (itself included)
    seed_shares: list[bytes] = field(default_factory=list)
    key_shares: list[bytes] = field(default_factory=list)

    @classmethod
    def load(cls, context: Context) -> ClientState:
        record = context.state.get(STATE)
        if record is None:
            return cls()
        known = {f.name for f in fields(cls)}
        return cls(**{k: (list(v) if isinstance(v, list) else v) for k, v in record.items() if k in known})

    def save(self, context: Context) -> None:
        context.state[STATE] = wire.to_record(asdict(self))


def secagg_client_mod(*, require: bool = False) -> Mod:
    """The mod; ``require=True``: train messages outside the protocol fail instead of passing."""

    def mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return call_next(msg, context)
        if wire.RECORD not in msg.content:
            reply = call_next(msg, context)
            if require and reply.has_content() and any(
                    isinstance(record, ArrayRecord) and len(record) for record in reply.content.values()):
                raise ProtocolViolation("this client sends arrays only under secure aggregation "
                                        "(secagg_client_mod(require=True)) and the train message carries no protocol")
            return reply
        ask = dict(msg.content[wire.RECORD])
        state = ClientState.load(context)
        stage = ask.get("stage")
        _check_order(state, ask)
        if stage == wire.SETUP:
            content = RecordDict({wire.RECORD: wire.to_record(_setup(state, ask))})
        elif stage == wire.SHARE_KEYS:
            content = RecordDict({wire.RECORD: wire.to_record(_share_keys(state, ask))})
        elif stage == wire.COLLECT:
            content = _collect(state, ask, msg, context, call_next)
            if isinstance(content, Message):  # the train function answered with an error: pass it on
                state.stage = wire.FAILED
                state.save(context)
                return content
        else:
            content = RecordDict({wire.RECORD: wire.to_record(_unmask(state, ask))})
        state.save(context)
        return Message(content, reply_to=msg)

    return mod


secagg_mod = secagg_client_mod()


def _check_order(state: ClientState, ask: dict) -> None:
    stage, session = ask.get("stage"), ask.get("session")
    if stage not in wire.STAGES or not isinstance(session, str):
        raise ProtocolViolation(f"secure aggregation: unknown stage {stage!r} or no session")
    if stage == wire.SETUP:
        return
    expected = wire.STAGES[wire.STAGES.index(stage) - 1]
    if state.session != session or state.stage != expected:
        raise ProtocolViolation(f"secure aggregation: {stage} of session {session!r} arrived after "
                                f"{state.stage} of session {state.session!r} (expected {expected})")


def _setup(state: ClientState, ask: dict) -> dict[str, object]:
    new = ClientState(session=ask["session"], stage=wire.SETUP)
    for name, kind in (("index", int), ("threshold", int), ("shares", int), ("clipping_range", float),
                       ("levels", int), ("modulus_bits", int), ("max_weight", int), ("weight_key", str)):
        value = ask.get(name.replace("_", "-"))
        if type(value) is not kind:  # noqa: E721  (bool is not an int here)
            raise ProtocolViolation(f"secure aggregation setup: {name} must be {kind.__name__}, got {value!r}")
        setattr(new, name, value)
    if new.threshold < 2 or new.shares < new.threshold or ask.get("min-group-size", 0) < 3:
        raise ProtocolViolation(f"secure aggregation setup refused: threshold {new.threshold} of {new.shares} shares "
                                f"and group minimum {ask.get('min-group-size')} (at least 2 and 3) would not hide "
                                "this client's update")
    if not 16 <= new.modulus_bits <= 64 or new.max_weight * new.levels >= 2**new.modulus_bits:
        raise ProtocolViolation("secure aggregation setup: the modulus cannot hold this client's weighted values")
    sk1, pk1 = generate_key_pairs()
    sk2, pk2 = generate_key_pairs()
    new.sk1, new.pk1 = private_key_to_bytes(sk1), public_key_to_bytes(pk1)
    new.sk2, new.pk2 = private_key_to_bytes(sk2), public_key_to_bytes(pk2)
    vars(state).update(vars(new))
    return {"stage": wire.SETUP, "session": state.session, "pk1": state.pk1, "pk2": state.pk2}


def _share_keys(state: ClientState, ask: dict) -> dict[str, object]:
    members, pk1s, pk2s = list(ask.get("neighbours", [])), list(ask.get("pk1", [])), list(ask.get("pk2", []))
    if not len(members) == len(pk1s) == len(pk2s) or len(set(members)) != len(members):
        raise ProtocolViolation("secure aggregation share-keys: neighbours and keys do not match")
    if len(members) < state.threshold:
        raise ProtocolViolation(f"secure aggregation share-keys: {len(members)} members left, "
                                f"fewer than the threshold {state.threshold}")
    if len(set(pk1s + pk2s)) != 2 * len(members):
        raise ProtocolViolation("secure aggregation share-keys: some public keys are identical")
    if state.index not in members or (pk1s[members.index(state.index)], pk2s[members.index(state.index)]) != (
            state.pk1, state.pk2):
        raise ProtocolViolation("secure aggregation share-keys: this client's own keys are missing or altered")
    state.seed = os.urandom(32)
    seed_shares = create_shares(state.seed, state.threshold, len(members))
    key_shares = create_shares(state.sk1, state.threshold, len(members))
    state.owners, state.seed_shares, state.key_shares = [state.index], [], []
    dsts, ciphertexts = [], []
    for position, (member, pk1, pk2) in enumerate(zip(members, pk1s, pk2s)):
        if member == state.index:
            state.seed_shares.append(seed_shares[position])
            state.key_shares.append(key_shares[position])
            continue
        state.peers.append(member)
        state.peer_pk1.append(pk1)
        state.peer_pk2.append(pk2)
        key = generate_shared_key(bytes_to_private_key(state.sk2), bytes_to_public_key(pk2))
        plaintext = share_keys_plaintext_concat(state.index, member, seed_shares[position], key_shares[position])
        dsts.append(member)
        ciphertexts.append(encrypt(key, plaintext))
    state.stage = wire.SHARE_KEYS
    return {"stage": wire.SHARE_KEYS, "session": state.session, "dsts": dsts, "ctxts": ciphertexts}


def _open_shares(state: ClientState, ask: dict) -> list[int]:
    """Decrypt and keep the neighbours' shares; the members this one masks with."""
    srcs, ciphertexts = list(ask.get("srcs", [])), list(ask.get("ctxts", []))
    if len(srcs) != len(ciphertexts) or len(set(srcs)) != len(srcs) or len(srcs) + 1 < state.threshold:
        raise ProtocolViolation(f"secure aggregation collect: {len(srcs)} neighbours' shares for a threshold "
                                f"of {state.threshold}")
    for src, ciphertext in zip(srcs, ciphertexts):
        if src not in state.peers:
            raise ProtocolViolation(f"secure aggregation collect: shares from {src}, not a neighbour")
        pk2 = state.peer_pk2[state.peers.index(src)]
        key = generate_shared_key(bytes_to_private_key(state.sk2), bytes_to_public_key(pk2))
        actual_src, dst, seed_share, key_share = share_keys_plaintext_separate(decrypt(key, ciphertext))
        if (actual_src, dst) != (src, state.index):
            raise ProtocolViolation(f"secure aggregation collect: a share from {actual_src} to {dst} "
                                    f"was forwarded as from {src} to {state.index}")
        state.owners.append(src)
        state.seed_shares.append(seed_share)
        state.key_shares.append(key_share)
    return srcs


def _collect(state: ClientState, ask: dict, msg: Message, context: Context,
             call_next: Callable[[Message, Context], Message]) -> RecordDict | Message:
    partners = _open_shares(state, ask)
    del msg.content[wire.RECORD]  # the user's train function sees a plain train message
    norm = _clipping_norm(msg)
    sent = ({key: array.numpy().copy() for key, array in msg.content[_ARRAYS].items()}
            if norm is not None and _ARRAYS in msg.content else None)
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    records = {name: {key: array.numpy() for key, array in record.items()}
               for name, record in reply.content.items() if isinstance(record, ArrayRecord)}
    if norm is not None:  # distributed DP: the update is clipped here, before anything leaves
        if sent is None or _ARRAYS not in records:
            raise ProtocolViolation("secure aggregation with a clipping norm: the train message and its reply "
                                    f"must carry the model under {_ARRAYS!r}")
        records[_ARRAYS] = clip_update(records[_ARRAYS], sent, norm)
    metrics = {name: record for name, record in reply.content.items() if isinstance(record, MetricRecord)}
    weight = _weight(state, metrics)
    layout = vectors.layout_of(records)
    values = vectors.flatten(records, layout)
    if not np.all(np.isfinite(values)):
        raise ProtocolViolation("secure aggregation: the reply has non-finite values; the server cannot check "
                                "them under secure aggregation, so this client drops out of the round")
    vector = _masked_vector(state, partners, values, weight)
    content = RecordDict({name: record for name, record in reply.content.items()
                          if name not in records and name not in metrics})
    for name, record in metrics.items():
        content[name] = MetricRecord({k: v for k, v in record.items() if k != state.weight_key})
    content[wire.RECORD] = wire.to_record({"stage": wire.COLLECT, "session": state.session,
                                           "layout": vectors.layout_to_text(layout)})
    content[wire.MASKED] = wire.masked_record(vector)
    state.stage = wire.COLLECT
    return content


_ARRAYS = "arrays"  # the model's record in a train message and its reply (Flower's FedAvg names it so)


def _clipping_norm(msg: Message) -> float | None:
    """Flower's ``clipping_norm`` (what ``fixedclipping_mod`` reads) from the train config, if any."""
    for record in msg.content.config_records.values():
        value = record.get(KEY_CLIPPING_NORM)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def clip_update(trained: dict[str, np.ndarray], sent: dict[str, np.ndarray], norm: float) -> dict[str, np.ndarray]:
    """``trained`` with its update against ``sent`` clipped to L2 ``norm`` over the
    floating-point arrays (Flower's ``compute_clip_model_update``); other arrays take the values
    sent (they would be released without noise). As ``clusterfed.privacy.clip_replies`` on the server."""
    names = [n for n in trained if n in sent and np.issubdtype(np.asarray(sent[n]).dtype, np.floating)]
    updated = [np.array(trained[n], copy=True) for n in names]
    base = [np.asarray(sent[n]) for n in names]
    if get_norm([np.subtract(t, b, dtype=np.float64) for t, b in zip(updated, base)]) > norm:
        compute_clip_model_update(param1=updated, param2=base, clipping_norm=norm)
    out = {n: np.asarray(sent[n]).copy() if n in sent else trained[n] for n in trained}
    out.update({n: np.asarray(a, dtype=np.asarray(sent[n]).dtype) for n, a in zip(names, updated)})
    return out


def _weight(state: ClientState, metrics: dict[str, MetricRecord]) -> int:
    if not state.weight_key:
        return 1
    found = [record[state.weight_key] for record in metrics.values() if state.weight_key in record]
    value = found[0] if found else None
    if not isinstance(value, (int, float)) or value != int(value) or not 0 <= value <= state.max_weight:
        raise ProtocolViolation(f"secure aggregation: the reply's {state.weight_key!r} must be an integer in "
                                f"[0, {state.max_weight}] (max_weight), got {value!r}")
    return int(value)


def _masked_vector(state: ClientState, partners: list[int], values: np.ndarray, weight: int) -> np.ndarray:
    # the rounding's randomness is the session's and the member's (not secret: it only decides
    # which way a value rounds), so the same inputs give the same sum
    rng = np.random.default_rng(list(hashlib.sha256(f"{state.session}/{state.index}".encode()).digest()))
    quantized, clipped = vectors.quantize(values, state.clipping_range, state.levels, rng)
    vector = np.concatenate([np.array([weight, clipped], dtype=np.uint64), quantized * np.uint64(weight)])
    vector += vectors.mask(state.seed, vector.size, state.modulus_bits)
    sk1 = bytes_to_private_key(state.sk1)
    for partner in partners:
        pk1 = state.peer_pk1[state.peers.index(partner)]
        pairwise = vectors.mask(vectors.mask_key(generate_shared_key(sk1, bytes_to_public_key(pk1))),
                                vector.size, state.modulus_bits)
        if state.index > partner:
            vector += pairwise
        else:
            vector -= pairwise
    return vectors.reduce(vector, state.modulus_bits).astype(vectors.wire_dtype(state.modulus_bits))


def _unmask(state: ClientState, ask: dict) -> dict[str, object]:
    alive, dead = list(ask.get("alive", [])), list(ask.get("dead", []))
    if set(alive) & set(dead):
        raise ProtocolViolation("secure aggregation unmask: a member named both alive and dead "
                                "(that would reveal its update)")
    if len(alive) < state.threshold:
        raise ProtocolViolation(f"secure aggregation unmask: {len(alive)} members alive, "
                                f"fewer than the threshold {state.threshold}")
    unknown = [member for member in alive + dead if member not in state.owners]
    if unknown:
        raise ProtocolViolation(f"secure aggregation unmask: no shares held for {unknown}")
    shares = [state.seed_shares[state.owners.index(m)] for m in alive]
    shares += [state.key_shares[state.owners.index(m)] for m in dead]
    session = state.session
    vars(state).update(vars(ClientState(session=session, stage=wire.UNMASK)))  # forget the secrets
    return {"stage": wire.UNMASK, "session": session, "owners": alive + dead, "shares": shares}
