"""Every byte counted is an array byte actually put in or taken out of a message."""

import json

import numpy as np
from flwr.app import Array, ArrayRecord

from clusterfed import protocol
from clusterfed.server_app import initial_arrays
from clusterfed.simulation import simulate
import pytest


def test_array_bytes_is_the_sum_of_nbytes():
    arrays = {"a": np.zeros((3, 4), np.float32), "b": np.ones(5, np.float64), "c": np.arange(7, dtype=np.int16)}
    record = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    assert protocol.array_bytes(record) == sum(v.nbytes for v in arrays.values()) == 48 + 40 + 14


@pytest.mark.end_to_end
def test_round_traffic_equals_model_size_times_clients(small_config):
    config = small_config(strategy="fedavg", rounds=2, num_clients=5)
    simulate(config, engine="inprocess", stream=None)
    model_bytes = protocol.array_bytes(initial_arrays(config))
    rounds = [json.loads(line) for line in open(f"{config.out_dir}/rounds.jsonl")]
    for record in rounds:
        assert record["bytes_down"] == 5 * model_bytes  # one model per client, not one per cluster
        assert record["bytes_up"] == 5 * model_bytes
        assert record["eval_bytes_down"] == 5 * model_bytes
        assert record["transmissions"] == 5
    assert rounds[-1]["cum_bytes_up"] == 2 * 5 * model_bytes


def test_fraction_train_counts_only_the_sampled_clients(small_config):
    config = small_config(strategy="fedavg", rounds=1, num_clients=6, fraction_train=0.5)
    simulate(config, engine="inprocess", stream=None)
    model_bytes = protocol.array_bytes(initial_arrays(config))
    record = json.loads(open(f"{config.out_dir}/rounds.jsonl").readline())
    assert record["transmissions"] == 3
    assert record["bytes_up"] == record["bytes_down"] == 3 * model_bytes


def test_fast_array_encoding_matches_flower():
    """protocol.encode_array / decode_array give the bytes and arrays Flower's own Array does."""
    import numpy as np
    from flwr.app import Array

    from clusterfed.protocol import decode_array, encode_array

    for value in (np.random.default_rng(0).random((3, 4)).astype(np.float32), np.arange(5),
                  np.zeros((0, 3), np.float32), np.random.default_rng(1).random((2, 3)).T, np.ones((2, 2), bool),
                  np.array([1, 2], dtype=">i4")):
        ours, flowers = encode_array(value), Array(np.ascontiguousarray(value))
        assert ours.data == flowers.data and ours.dtype == flowers.dtype and tuple(ours.shape) == tuple(flowers.shape)
        back = decode_array(flowers)
        assert back.dtype == value.dtype and np.array_equal(back, value) and back.flags.writeable


def test_inprocess_transfer_is_an_independent_copy_equal_to_a_pickle_round_trip():
    """The in-process grid's copy of a message: equal to what pickle gives, nothing mutable
    shared with the original (an Array's immutable bytes may be)."""
    import pickle

    import numpy as np
    from flwr.app import ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from clusterfed import protocol
    from clusterfed.runner.inprocess import _transfer

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    arrays = protocol.to_array_record({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(2)})
    content = RecordDict({"config": ConfigRecord({"lr": 0.1, "names": ["a", "b"], "raw": b"x"}), "arrays": arrays,
                          "metrics": MetricRecord({"loss": 1.5, "sizes": [1, 2]})})
    message = Message(content, dst_node_id=1000, message_type=MessageType.TRAIN, group_id="1")
    copy, pickled = _transfer(message), pickle.loads(pickle.dumps(message))
    assert vars(copy.metadata) == vars(pickled.metadata) and copy.metadata is not message.metadata
    assert copy.content == pickled.content == message.content
    assert copy.content.object_id == message.content.object_id
    for name in ("config", "arrays", "metrics"):
        assert copy.content[name] is not message.content[name]
    assert copy.content["config"]["names"] is not message.content["config"]["names"]
    assert copy.content["arrays"]["w"] is not arrays["w"]
    np.testing.assert_array_equal(protocol.decode_array(copy.content["arrays"]["w"]), protocol.decode_array(arrays["w"]))
    copy.content["config"]["lr"] = 0.5  # changing the copy leaves the original as it was
    assert message.content["config"]["lr"] == 0.1
    error = _transfer(Message(Error(code=3, reason="boom"), reply_to=message))
    assert error.has_error() and (error.error.code, error.error.reason) == (3, "boom")
