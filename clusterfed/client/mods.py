"""``evidence_mod``: a Flower client mod that makes a stock ClientApp's clustering upload small.

FedClust's and AdaCFL's clustering round (``cluster-layers = auto``) asks each client for its
candidate layers' updates projected by a seeded CountSketch shared with the server
(``protocol.EVIDENCE_SKETCH``): at most the paper layer's bytes. clusterfed's own client
(``clusterfed.client``) projects its reply itself. A stock Flower ClientApp returns its whole
model whatever it is asked, and trains its run config's ``local-epochs`` per message, so the
server sends it its reply back until it has trained ``cluster-epochs``, each time receiving the
whole model; it then projects the update itself: the clustering is the same, the bytes are
not saved. One line gives them back::

    from clusterfed.client import evidence_mod
    app = ClientApp(mods=[evidence_mod])

For a train message that asks for projected evidence (and only for it) the mod calls the app
until it has trained the message's ``local-epochs`` (``ceil(local-epochs / run config
local-epochs)`` calls, each on the model the call before returned; one call when the app's
metrics report ``local-epochs`` equal to the message's), then replaces the reply's arrays by
the projected updates and reports the epochs trained (``local-epochs``). Every other message
passes through unchanged. It needs only flwr, numpy and scipy.
"""

from __future__ import annotations

import math

from flwr.app import Context, Message, MessageType, MetricRecord, RecordDict

from clusterfed import protocol


def _calls(asked: int, context: Context) -> tuple[int, int]:
    per_call = context.run_config.get("local-epochs", 1) if context.run_config else 1
    per_call = max(int(per_call or 1), 1)
    return max(math.ceil(asked / per_call), 1), per_call


def evidence_mod(msg: Message, context: Context, call_next) -> Message:
    """A ClientApp mod (``ClientApp(mods=[evidence_mod])``): the clustering round's reply as
    projected updates (module docstring)."""
    if msg.metadata.message_type != MessageType.TRAIN or not msg.has_content():
        return call_next(msg, context)
    original = msg.content
    config = dict(original[protocol.CONFIG]) if protocol.CONFIG in original else {}
    if protocol.parse_evidence(config) is None or protocol.ARRAYS not in original:
        return call_next(msg, context)
    received = protocol.from_array_record(original[protocol.ARRAYS], copy=False)
    asked = int(config.get("local-epochs", 1) or 1)
    calls, per_call = _calls(asked, context)
    trained_epochs, reply = 0, None
    try:
        for call in range(calls):
            if call:  # the next call trains on from the model the last one returned
                msg.content = RecordDict({**dict(original), protocol.ARRAYS: reply.content[protocol.ARRAYS]})
            reply = call_next(msg, context)
            if reply.has_error() or protocol.ARRAYS not in reply.content:
                return reply
            reported = reply.content[protocol.METRICS].get("local-epochs") if protocol.METRICS in reply.content else None
            if reported == asked:  # the app honours the message's epochs itself
                trained_epochs = asked
                break
            trained_epochs += per_call
    finally:
        msg.content = original
    trained = protocol.from_array_record(reply.content[protocol.ARRAYS], copy=False)
    metrics = dict(reply.content[protocol.METRICS]) if protocol.METRICS in reply.content else {}
    metrics["local-epochs"] = int(trained_epochs)
    content = RecordDict({name: record for name, record in dict(reply.content).items()
                          if name not in (protocol.ARRAYS, protocol.METRICS)})
    content[protocol.ARRAYS] = protocol.to_array_record(protocol.project_evidence(trained, received, config))
    content[protocol.METRICS] = MetricRecord(metrics)
    reply.content = content
    return reply
