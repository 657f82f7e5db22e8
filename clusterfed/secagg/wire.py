"""What the protocol puts in Flower records, in one place: record names, stages, and the two
conversions a driver needs (an ask into a train message's content, a reply's content back into
the plain dict ``GroupProtocol.take`` reads), plus the byte count of a plain ask or reply.

Every stage is a ``train`` message, so a mod on the ClientApp (or on its train function)
sees them all. Only the collect stage reaches the user's train function; the driver puts its
usual train content (``arrays``, ``config``) beside the protocol's record.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

RECORD = "clusterfed.secagg"  # ConfigRecord: the stage's ask (server -> client) or reply
MASKED = "clusterfed.secagg.masked"  # ArrayRecord of the collect stage's reply: {"vector": masked vector}
VECTOR = "vector"

SETUP, SHARE_KEYS, COLLECT, UNMASK = "setup", "share-keys", "collect", "unmask"
STAGES = (SETUP, SHARE_KEYS, COLLECT, UNMASK)
DONE, FAILED = "done", "failed"


def to_record(values: Mapping[str, object]) -> ConfigRecord:
    """A ConfigRecord without None and empty lists (Flower 1.41's ConfigRecord.count_bytes
    fails on an empty list); readers default a missing list to empty."""
    return ConfigRecord({k: v for k, v in values.items() if v is not None and not (isinstance(v, list) and not v)})


def ask_content(ask: Mapping[str, object], train: RecordDict | None = None) -> RecordDict:
    """The content of the train message that carries ``ask`` (for the collect stage, next to
    the driver's ``train`` content: the model and its config)."""
    content = RecordDict(dict(train.items()) if train is not None else {})
    content[RECORD] = to_record(ask)
    return content


def reply_from_content(content: RecordDict) -> dict[str, object]:
    """The protocol's part of a reply's content as the plain dict ``GroupProtocol.take`` reads:
    the ConfigRecord's values, and the masked vector under ``"vector"`` when there is one.
    KeyError when the reply has no protocol record."""
    reply: dict[str, object] = dict(content[RECORD])
    if MASKED in content:
        reply[VECTOR] = content[MASKED][VECTOR].numpy()
    return reply


def masked_record(vector: np.ndarray) -> ArrayRecord:
    return ArrayRecord({VECTOR: Array(vector)})


def count_bytes(values: Mapping[str, object]) -> int:
    """Payload bytes of a plain ask or reply: bytes and strings by length, numbers 8 bytes,
    arrays by ``nbytes`` (record framing not counted)."""
    return sum(len(key.encode()) + _value_bytes(value) for key, value in values.items())


def _value_bytes(value: object) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, (list, tuple)):
        return sum(_value_bytes(item) for item in value)
    if isinstance(value, bool):
        return 1
    return 8
