"""clusterfed.client: a user's own model and data (not clusterfed's) through the full message
contract, driven by hand-made messages (no server)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from clusterfed import protocol
from clusterfed.client import ClientTask, TaskData, client_app, load_task
from clusterfed.label_stats import label_entropy

NUM_CLASSES = 3
NODE = {"partition-id": 1, "client-key": "site-b"}


def _points(partition_id: int, n: int = 96) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic 3-class data: the label is the argmax of a fixed linear map of the inputs."""
    x = np.random.default_rng(partition_id).normal(size=(n, 4)).astype(np.float32)
    w = np.random.default_rng(123).normal(size=(4, NUM_CLASSES)).astype(np.float32)
    return x, (x @ w).argmax(1).astype(np.int64)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, NUM_CLASSES))


def load_data(context: Context, config: dict) -> TaskData:
    x, y = _points(int(context.node_config["partition-id"]))
    train = DataLoader(TensorDataset(torch.from_numpy(x[:64]), torch.from_numpy(y[:64])), batch_size=16)
    test = DataLoader(TensorDataset(torch.from_numpy(x[64:]), torch.from_numpy(y[64:])), batch_size=16)
    return TaskData(train, test, labels=y[:64])


TASK = ClientTask(model_fn=lambda context, config: mlp(), data_fn=load_data)


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


def initial() -> dict[str, np.ndarray]:
    return {name: value.numpy().copy() for name, value in mlp().state_dict().items()}


def send(task, message_type=MessageType.TRAIN, arrays=None, node_config=None, **config):
    values = {"server-round": 1, "phase": "train", "local-epochs": 1, "lr": 0.1, "cluster-id": 0, "upload": "full",
              "return": "weights", **config}
    content = RecordDict({protocol.CONFIG: protocol.config_record(values)})
    if arrays is not None:
        content[protocol.ARRAYS] = protocol.to_array_record(arrays)
    message = Message(content, dst_node_id=7, message_type=message_type)
    message.metadata.__dict__["_message_id"] = "m1"
    context = Context(run_id=1, node_id=7, node_config=dict(NODE if node_config is None else node_config),
                      state=RecordDict(), run_config={})
    app = task if hasattr(task, "_registered_funcs") else client_app(task)
    return app(message, context).content


def arrays_of(content) -> dict[str, np.ndarray]:
    return protocol.from_array_record(content[protocol.ARRAYS])


def test_full_upload_returns_every_array_trained():
    sent = initial()
    content = send(TASK, arrays=sent)
    got = arrays_of(content)
    assert set(got) == set(sent)
    assert any(not np.allclose(got[name], sent[name]) for name in sent)  # it trained
    metrics = content[protocol.METRICS]
    assert metrics["num-examples"] == 64 and np.isfinite(metrics["train-loss"])
    assert dict(content[protocol.CLIENT]) == {"client-key": "site-b", "true-group": -1}


def test_partial_upload_returns_exactly_the_named_arrays():
    content = send(TASK, arrays=initial(), upload="2.weight,2.bias")
    assert set(content[protocol.ARRAYS]) == {"2.weight", "2.bias"}


def test_update_is_trained_minus_received():
    sent = initial()
    weights = arrays_of(send(TASK, arrays=sent))
    update = arrays_of(send(TASK, arrays=sent, **{"return": "update"}))
    assert set(update) == set(sent)
    for name in sent:
        np.testing.assert_allclose(update[name], weights[name] - sent[name], atol=1e-6)


def test_fedprox_term_keeps_the_weights_closer_to_those_received():
    sent = initial()
    plain = arrays_of(send(TASK, arrays=sent, lr=0.5, **{"local-epochs": 5}))
    prox = arrays_of(send(TASK, arrays=sent, lr=0.5, **{"local-epochs": 5, "proximal-mu": 1.0}))

    def drift(arrays):
        return sum(float(((arrays[n] - sent[n]) ** 2).sum()) for n in sent)

    assert drift(prox) < drift(plain)


def test_ifca_chooses_the_model_of_lowest_training_loss_in_either_order():
    bad = initial()
    good = arrays_of(send(TASK, arrays=bad, lr=0.5, **{"local-epochs": 30}))
    for order, expected in (([bad, good], 1), ([good, bad], 0)):
        packed = {f"m{k}.{name}": value for k, model in enumerate(order) for name, value in model.items()}
        # lr 0: the arrays returned are the chosen model's, under the plain names
        content = send(TASK, arrays=packed, lr=0.0, **{"ifca-k": 2, "cluster-id": -1})
        assert content[protocol.METRICS]["ifca-choice"] == expected
        got = arrays_of(content)
        assert set(got) == set(bad)
        for name in bad:
            np.testing.assert_array_equal(got[name], good[name])


def test_label_statistics_only_when_asked():
    labels = _points(1)[1][:64]
    expected = label_entropy(np.bincount(labels))
    profile = send(TASK, protocol.PROFILE_QUERY, **{"label-stats": True})[protocol.METRICS]
    assert profile["num-examples"] == 64
    assert profile["num-classes"] == len(set(labels.tolist())) and profile["label-entropy"] == pytest.approx(expected)
    train = send(TASK, arrays=initial(), **{"label-stats": True})[protocol.METRICS]
    assert train["num-classes"] == profile["num-classes"] and train["label-entropy"] == profile["label-entropy"]
    plain = send(TASK, protocol.PROFILE_QUERY)[protocol.METRICS]
    assert "label-entropy" not in plain and "num-classes" not in plain


def test_no_label_statistics_without_labels():
    task = ClientTask(model_fn=TASK.model_fn, data_fn=lambda context, config: (load_data(context, config).train,
                                                                              load_data(context, config).test))
    metrics = send(task, protocol.PROFILE_QUERY, **{"label-stats": True})[protocol.METRICS]
    assert dict(metrics) == {"num-examples": 64}  # a (train, test) pair: counted from the DataLoaders


def test_profile_returns_the_node_configs_client_key_else_the_partition_id():
    assert send(TASK, protocol.PROFILE_QUERY)[protocol.CLIENT]["client-key"] == "site-b"
    assert send(TASK, protocol.PROFILE_QUERY, node_config={"partition-id": 4})[protocol.CLIENT]["client-key"] == "4"
    keyed = ClientTask(model_fn=TASK.model_fn, data_fn=load_data, key_fn=lambda context: "mine")
    assert send(keyed, protocol.PROFILE_QUERY)[protocol.CLIENT]["client-key"] == "mine"


def test_default_evaluation_reports_loss_and_accuracy():
    metrics = send(TASK, MessageType.EVALUATE, arrays=initial(), phase="evaluate")[protocol.METRICS]
    assert metrics["num-examples"] == 32 and 0.0 <= metrics["eval-accuracy"] <= 1.0 and metrics["eval-loss"] > 0


def regression_data(context, config) -> TaskData:
    x, _ = _points(int(context.node_config["partition-id"]))
    y = x.sum(1, keepdims=True)
    return TaskData(DataLoader(TensorDataset(torch.from_numpy(x[:64]), torch.from_numpy(y[:64])), batch_size=16),
                    DataLoader(TensorDataset(torch.from_numpy(x[64:]), torch.from_numpy(y[64:])), batch_size=32))


@torch.no_grad()
def mse(model, data, config, device) -> dict[str, float]:
    errors = [((model(x.to(device)) - y.to(device)) ** 2).sum().item() for x, y in data.test]
    return {"eval-mse": sum(errors) / len(data.test.dataset)}


def linear():
    torch.manual_seed(0)
    return nn.Linear(4, 1)


REGRESSION = ClientTask(model_fn=lambda context, config: linear(), data_fn=regression_data, evaluate_fn=mse,
                        loss_fn=nn.MSELoss())


def test_regression_task_with_its_own_evaluation():
    sent = {name: value.numpy().copy() for name, value in linear().state_dict().items()}
    before = send(REGRESSION, MessageType.EVALUATE, arrays=sent)[protocol.METRICS]
    assert set(before) == {"num-examples", "eval-mse"} and before["num-examples"] == 32
    trained = arrays_of(send(REGRESSION, arrays=sent, lr=0.05, **{"local-epochs": 20}))
    after = send(REGRESSION, MessageType.EVALUATE, arrays=trained)[protocol.METRICS]
    assert after["eval-mse"] < 0.1 * before["eval-mse"]  # trained with MSE by the default loop


def test_dict_batches_use_the_tasks_batch_keys():
    def dict_batches(context, config):
        data = load_data(context, config)
        as_dicts = [{"pixels": x, "target": y} for x, y in data.train]
        return TaskData(as_dicts, None, num_train=64)

    task = ClientTask(model_fn=TASK.model_fn, data_fn=dict_batches, batch_keys=("pixels", "target"))
    assert send(task, arrays=initial())[protocol.METRICS]["num-examples"] == 64
    with pytest.raises(ValueError, match=r"a batch has keys \['pixels', 'target'\]; set ClientTask\(batch_keys"):
        send(ClientTask(model_fn=TASK.model_fn, data_fn=dict_batches), arrays=initial())


def test_own_train_function_and_extra_metrics():
    def train_fn(model, data, config, device):
        return {"train-loss": 0.25, "steps": 3}

    task = ClientTask(model_fn=TASK.model_fn, data_fn=load_data, train_fn=train_fn)
    sent = initial()
    content = send(task, arrays=sent)
    assert dict(content[protocol.METRICS]) == {"num-examples": 64, "train-loss": 0.25, "steps": 3}
    for name in sent:
        np.testing.assert_array_equal(arrays_of(content)[name], sent[name])
    with pytest.raises(ValueError, match="loss_fn.*train_loss_fn"):  # IFCA needs the loss it trains
        send(task, arrays={f"m{k}.{n}": v for k in range(2) for n, v in sent.items()}, **{"ifca-k": 2})


def test_bad_upload_name_is_an_error_naming_the_arrays():
    with pytest.raises(ValueError, match=r"does not have: \['head.weight'\]; it has \['0.weight', '0.bias', "):
        send(TASK, arrays=initial(), upload="2.weight,head.weight")


def test_arrays_that_do_not_fit_the_model_are_named():
    sent = initial()
    del sent["2.bias"]
    with pytest.raises(ValueError, match=r"missing \['2.bias'\]"):
        send(TASK, arrays=sent)
    with pytest.raises(ValueError, match="has no 'arrays' record"):
        send(TASK)


def test_task_paths_and_types_are_checked():
    assert load_task("test_client_helper:TASK") is TASK
    with pytest.raises(ValueError, match="package.module:name"):
        client_app("test_client_helper.TASK")
    with pytest.raises(TypeError, match="not a clusterfed.client.ClientTask"):
        load_task("test_client_helper:mlp")
    with pytest.raises(TypeError, match="model_fn must be a function"):
        ClientTask(model_fn=None, data_fn=load_data)
    with pytest.raises(ValueError, match="no 'client-key'"):
        TASK.key(Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={}))


@pytest.mark.end_to_end
def test_a_users_task_by_import_path_is_answered_by_the_warm_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERFED_WORKER_DIR", str(tmp_path / "w"))
    app = client_app("test_client_helper:TASK")
    sent = initial()
    try:
        by_worker = send(app, arrays=sent, node_config={**NODE, "warm-worker": True})
        in_process = send(app, arrays=sent, node_config={**NODE, "warm-worker": False})
        (pid_file,) = (tmp_path / "w").glob("*.pid")
        assert int(pid_file.read_text()) != os.getpid()
    finally:
        for pid_file in (tmp_path / "w").glob("*.pid"):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert dict(by_worker[protocol.METRICS]) == dict(in_process[protocol.METRICS])
    for name, value in arrays_of(in_process).items():
        np.testing.assert_array_equal(arrays_of(by_worker)[name], value)
