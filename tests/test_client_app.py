"""The client's side of the message contract."""

import numpy as np
import pytest
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from clusterfed import protocol
from clusterfed.client_app import app
from clusterfed.config import parse_config
from clusterfed.server_app import initial_arrays


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


def _call(config_values, arrays=None, message_type=MessageType.TRAIN, node_config=None):
    config = parse_config({"num-clients": 4, "partitioner": "iid"})
    values = {**protocol.client_spec(config.to_flower()), "server-round": 1, "local-epochs": 1, "lr": 0.05,
              "cluster-id": 0, "upload": "full", "return": "weights", **config_values}
    content = RecordDict({protocol.CONFIG: protocol.config_record(values)})
    if arrays is not None:
        content[protocol.ARRAYS] = arrays
    message = Message(content, dst_node_id=7, message_type=message_type)
    message.metadata.__dict__["_message_id"] = "m1"
    context = Context(run_id=1, node_id=7, node_config=node_config or {"partition-id": 2, "client-key": "site-b"},
                      state=RecordDict(), run_config={})
    return app(message, context), initial_arrays(config)


def test_partial_upload_returns_exactly_the_requested_arrays_and_identity():
    config = parse_config({"num-clients": 4})
    reply, _ = _call({"upload": "fc2.weight,fc2.bias"}, initial_arrays(config))
    assert set(reply.content[protocol.ARRAYS]) == {"fc2.weight", "fc2.bias"}
    assert reply.content[protocol.CLIENT]["client-key"] == "site-b"
    assert reply.content[protocol.METRICS]["num-examples"] > 0


def test_update_is_trained_minus_received():
    config = parse_config({"num-clients": 4})
    sent = initial_arrays(config)
    weights, _ = _call({"upload": "fc2.bias"}, sent)
    update, _ = _call({"upload": "fc2.bias", "return": "update"}, sent)
    received = sent["fc2.bias"].numpy()
    np.testing.assert_allclose(update.content[protocol.ARRAYS]["fc2.bias"].numpy(),
                               weights.content[protocol.ARRAYS]["fc2.bias"].numpy() - received, atol=1e-7)


def test_unknown_upload_name_is_an_error():
    config = parse_config({"num-clients": 4})
    with pytest.raises(ValueError, match="does not have"):
        _call({"upload": "head.weight"}, initial_arrays(config))


def test_label_stats_only_when_asked():
    reply, _ = _call({"label-stats": True}, message_type=protocol.PROFILE_QUERY)
    metrics = reply.content[protocol.METRICS]
    assert metrics["num-classes"] == 10 and 3.0 < metrics["label-entropy"] <= np.log2(10)
    plain, _ = _call({}, message_type=protocol.PROFILE_QUERY)
    assert "label-entropy" not in plain.content[protocol.METRICS]


def test_missing_partition_id_is_explained():
    with pytest.raises(ValueError, match="partition-id"):
        _call({}, message_type=protocol.PROFILE_QUERY, node_config={"client-key": "x"})
