"""Train replies as Flower's own strategies read them, for calling their ``aggregate_train``
from a cluster's aggregator (``clusterfed.core.aggregation``): the strategy modules
themselves never build a Message, and this module is neither a strategy's nor the
runner's (``strategies/`` never imports ``runner/``)."""

from __future__ import annotations

import time

import numpy as np
from flwr.app import Array, ArrayRecord, Message, Metadata, MetricRecord, RecordDict


def train_reply(weights: dict[str, np.ndarray], num_examples: float) -> Message:
    """A train reply: the weights under ``arrays``, their weight under
    ``metrics["num-examples"]``. Built with explicit metadata, so it needs no run context
    (Flower's TaskIdentity)."""
    metadata = Metadata(run_id=0, message_id="", src_node_id=0, dst_node_id=0, reply_to_message_id="",
                        group_id="", created_at=time.time(), ttl=0.0, message_type="train")
    arrays = ArrayRecord({n: Array(np.asarray(v)) for n, v in weights.items()})
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": float(num_examples)})})
    return Message(content=content, metadata=metadata)
