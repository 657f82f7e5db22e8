"""The client helper checks what the server's strategy needs when the ClientApp is built (IFCA's
loss), tells the server in its profile what the task can give, flags a train_fn that trains other
than the epochs asked, and turns on secure aggregation by one keyword. Hand-made messages, no server."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from clusterfed import IFCA, FedAvg, protocol
from clusterfed.client import ClientTask, TaskCapabilityError, client_app
from clusterfed.client.app import MISSING_KEY
from clusterfed.secagg import GroupProtocol, SecAggSettings, secagg_mod, wire
from tests.test_client_helper import TASK, initial, load_data

MULTI_MODEL_ASK = {"ifca-k": 2, "cluster-id": -1}


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


def message(content: RecordDict, message_type=MessageType.TRAIN) -> Message:
    msg = Message(content, dst_node_id=7, message_type=message_type)
    msg.metadata.__dict__["_message_id"] = "m1"
    return msg


def context() -> Context:
    return Context(run_id=1, node_id=7, node_config={"partition-id": 1, "client-key": "site-b"}, state=RecordDict(),
                   run_config={})


def content_of(arrays=None, **config) -> RecordDict:
    values = {"server-round": 1, "phase": "train", "local-epochs": 1, "lr": 0.1, "cluster-id": 0, "upload": "full",
              "return": "weights", **config}
    content = RecordDict({protocol.CONFIG: protocol.config_record(values)})
    if arrays is not None:
        content[protocol.ARRAYS] = protocol.to_array_record(arrays)
    return content


def ask(app, arrays=None, message_type=MessageType.TRAIN, **config) -> RecordDict:
    return app(message(content_of(arrays, **config), message_type), context()).content


def packed(models) -> dict[str, np.ndarray]:
    return {f"m{k}.{name}": value for k, model in enumerate(models) for name, value in model.items()}


class CountingTrain:
    """A user's own train_fn (plain SGD, its own loss inside): counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, model, data, config, device):
        self.calls += 1
        optimizer = torch.optim.SGD(model.parameters(), lr=float(config["lr"]))
        losses = []
        for _ in range(int(config["local-epochs"])):
            for x, y in data.train:
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        return float(np.mean(losses))


# ------------------------------------------------------------- IFCA's loss, at build time
@pytest.mark.parametrize("requires", [IFCA().requires(), IFCA(), "multi-model"],
                         ids=["requires()", "strategy", "name"])
def test_a_task_without_its_loss_is_refused_when_built_for_multi_model_choice(requires):
    train_fn = CountingTrain()
    task = ClientTask(model_fn=TASK.model_fn, data_fn=load_data, train_fn=train_fn)
    with pytest.raises(TaskCapabilityError) as refused:
        client_app(task, requires=requires)
    text = str(refused.value)
    assert "loss_fn" in text and "train_loss_fn" in text and "multi-model" in text
    assert "\n" not in text  # one message
    assert train_fn.calls == 0  # nothing was trained


def test_with_its_loss_the_task_is_built_and_chooses_among_the_models():
    train_fn = CountingTrain()
    bad = initial()
    trainer = client_app(TASK)  # the default loop (its loss is known) trains a better model
    good = protocol.from_array_record(ask(trainer, arrays=bad, lr=0.5, **{"local-epochs": 30})[protocol.ARRAYS])
    for given in ({"loss_fn": nn.CrossEntropyLoss()},
                  {"train_loss_fn": lambda model, data, config, device: float(
                      np.mean([nn.functional.cross_entropy(model(x), y).item() for x, y in data.train]))}):
        task = ClientTask(model_fn=TASK.model_fn, data_fn=load_data, train_fn=train_fn, **given)
        app = client_app(task, requires=IFCA())
        content = ask(app, arrays=packed([bad, good]), lr=0.0, **MULTI_MODEL_ASK)
        assert content[protocol.METRICS]["ifca-choice"] == 1
    assert train_fn.calls == 2


def test_a_strategy_that_needs_nothing_builds_any_task():
    task = ClientTask(model_fn=TASK.model_fn, data_fn=load_data, train_fn=CountingTrain())
    client_app(task, requires=FedAvg())
    client_app(task)  # no requires: the server decides from the profile


def test_unknown_capabilities_are_named():
    with pytest.raises(ValueError, match="unknown capabilities.*'telepathy'"):
        client_app(TASK, requires=["telepathy"])


def test_the_profile_lists_what_the_task_gives_and_how_to_give_the_rest():
    profile = ask(client_app(TASK), message_type=protocol.PROFILE_QUERY)[protocol.CLIENT]
    assert list(profile[protocol.CAPABILITIES_KEY]) == ["profile", "label-stats", "multi-model"]
    assert MISSING_KEY not in profile

    no_loss = ClientTask(model_fn=TASK.model_fn, data_fn=load_data, train_fn=CountingTrain())
    profile = ask(client_app(no_loss), message_type=protocol.PROFILE_QUERY)[protocol.CLIENT]
    assert list(profile[protocol.CAPABILITIES_KEY]) == ["profile", "label-stats"]
    (note,) = profile[MISSING_KEY]
    assert note.startswith("multi-model: ") and "loss_fn" in note

    def pairs(context, config):
        data = load_data(context, config)
        return data.train, data.test  # no labels: no label statistics

    bare = ClientTask(model_fn=TASK.model_fn, data_fn=pairs, train_fn=CountingTrain())
    message_ = message(content_of(), protocol.PROFILE_QUERY)
    reply = client_app(bare)(message_, context())
    profile = reply.content[protocol.CLIENT]
    assert list(profile[protocol.CAPABILITIES_KEY]) == ["profile"]  # never empty: Flower cannot count []
    assert [n.split(":")[0] for n in profile[MISSING_KEY]] == ["label-stats", "multi-model"]
    for record in reply.content.values():
        record.count_bytes()  # a reply Flower can send


def test_the_round_1_error_stays_for_a_client_built_without_requires():
    task = ClientTask(model_fn=TASK.model_fn, data_fn=load_data, train_fn=CountingTrain())
    with pytest.raises(ValueError, match="loss_fn"):
        ask(client_app(task), arrays=packed([initial(), initial()]), **MULTI_MODEL_ASK)


# ----------------------------------------------- a train_fn that ignores the epochs asked
@pytest.fixture
def flwr_warnings():
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(level=logging.WARNING)
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_a_train_fn_that_reports_other_epochs_than_asked_is_flagged(flwr_warnings):
    def one_epoch(model, data, config, device):  # trains one epoch whatever the message asks
        return {"train-loss": 0.5, "local-epochs": 1}

    app = client_app(ClientTask(model_fn=TASK.model_fn, data_fn=load_data, train_fn=one_epoch))
    content = ask(app, arrays=initial(), upload="0.weight", **{"local-epochs": 7})
    assert content[protocol.METRICS]["local-epochs"] == 1  # the reply says what it trained
    texts = [record.getMessage() for record in flwr_warnings]
    assert any("trained 1 epoch(s)" in t and "local-epochs=7" in t and "cluster-epochs" in t for t in texts)
    ask(app, arrays=initial(), **{"local-epochs": 1})
    assert len(flwr_warnings) == len(texts)  # as asked: nothing said


# ------------------------------------------------------------ secure aggregation, one keyword
def test_secure_aggregation_adds_the_mod_exactly_when_asked():
    def other_mod(msg, ctx, call_next):
        return call_next(msg, ctx)

    assert secagg_mod not in client_app(TASK)._mods
    assert secagg_mod not in client_app(TASK, mods=[other_mod])._mods
    secure = client_app(TASK, mods=[other_mod], secure_aggregation=True)
    assert secure._mods == [secagg_mod, other_mod]  # outside the user's mods (a clipping mod clips first)
    assert secure.clusterfed_parts.mods == (secagg_mod, other_mod)
    with pytest.raises(TypeError, match="secure_aggregation"):
        client_app(TASK, secure_aggregation="secaggplus")


def test_a_plain_train_message_passes_through_the_mod_unchanged():
    sent = initial()
    plain = ask(client_app(TASK), arrays=sent, **{"local-epochs": 2})
    secure = ask(client_app(TASK, secure_aggregation=True), arrays=sent, **{"local-epochs": 2})
    assert set(secure) == set(plain)
    assert dict(secure[protocol.METRICS]) == dict(plain[protocol.METRICS])
    got, expected = (protocol.from_array_record(c[protocol.ARRAYS]) for c in (secure, plain))
    assert set(got) == set(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
    evaluated = ask(client_app(TASK, secure_aggregation=True), arrays=sent, message_type=MessageType.EVALUATE)
    assert "eval-accuracy" in evaluated[protocol.METRICS]


def test_a_protocol_message_is_answered_by_the_mod():
    protocol_ = GroupProtocol(["a", "b", "c"], SecAggSettings(), session="1/0", seed=0)
    setup = protocol_.asks()["a"]
    secure = client_app(TASK, secure_aggregation=True)
    reply = secure(message(wire.ask_content(setup)), context()).content
    answer = wire.reply_from_content(reply)
    assert answer["stage"] == wire.SETUP and answer["pk1"] and answer["pk2"]
    with pytest.raises(Exception):  # without the mod, the helper has no model to train
        client_app(TASK)(message(wire.ask_content(setup)), context())


def _counting_train_fn(calls: list):
    def train_fn(model, data, config, device):
        calls.append(1)
        return 0.1
    return train_fn


@pytest.mark.parametrize("given", [{}, {"loss_fn": nn.CrossEntropyLoss()}])
def test_the_server_refuses_ifca_before_round_1_when_the_clients_say_they_cannot_choose(given):
    """The profile's capabilities-missing reaches the server's capability check: IFCA on helper
    clients whose task has its own train_fn and no loss stops before any training, naming
    loss_fn; with the loss the run goes ahead."""
    from flwr.app import ArrayRecord

    from clusterfed import CapabilityError
    from clusterfed.runner.inprocess import InProcessGrid
    from tests.test_client_helper import mlp

    calls: list = []
    app = client_app(ClientTask(model_fn=TASK.model_fn, data_fn=load_data, train_fn=_counting_train_fn(calls), **given))
    grid = InProcessGrid(app, 4, node_configs=[{"partition-id": i} for i in range(4)])
    strategy = IFCA(num_clusters=2)
    if given:
        strategy.start(grid=grid, initial_arrays=ArrayRecord(mlp().state_dict()), num_rounds=1)
        assert calls
        return
    with pytest.raises(CapabilityError, match="loss_fn") as error:
        strategy.start(grid=grid, initial_arrays=ArrayRecord(mlp().state_dict()), num_rounds=2)
    assert "4 client(s) say their task cannot" in str(error.value) and not calls
