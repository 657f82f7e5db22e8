"""Secure-aggregation settings, the small-group rule, the client's own refusals, and why
Flower's secaggplus_mod does not serve a Message-API ClientApp (checked on the installed Flower)."""

from __future__ import annotations

import pytest
import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from secagg_harness import Federation, model, over_the_wire

from clusterfed.secagg import (
    GroupProtocol,
    GroupTooSmall,
    ProtocolViolation,
    SecAggSettings,
    SecAggSettingsError,
    group_plan,
    secagg_client_mod,
    split_groups,
    wire,
)


@pytest.mark.parametrize("values, message", [
    ({"threshold": 5, "shares": 3}, "threshold (5) cannot exceed shares (3)"),
    ({"threshold": 1}, "threshold as a count must be at least 2"),
    ({"threshold": 0.3}, "must be in [0.5, 1]"),
    ({"shares": 4}, "shares must be odd"),
    ({"shares": 1}, "shares: Input should be greater than or equal to 3"),
    ({"modulus": 3 * 2**20}, "modulus must be a power of two"),
    ({"modulus": 2**32, "max_weight": 2**10, "quantization_range": 2**24}, "one member's weighted values would wrap"),
    ({"clipping_range": float("nan")}, "clipping_range: Input should be a finite number"),
    ({"clipping-range": -1.0}, "clipping-range: Input should be greater than 0"),
    ({"min_group_size": 2}, "min_group_size: Input should be greater than or equal to 3"),
    ({"shares_number": 3}, "Extra inputs are not permitted"),
])
def test_bad_settings_are_refused_with_one_message(values, message):
    with pytest.raises(SecAggSettingsError) as error:
        SecAggSettings(**values)
    text = str(error.value)
    assert message in text and text.startswith("secure aggregation settings: ") and "\n" not in text


def test_settings_take_run_config_names_and_defaults_are_safe():
    settings = SecAggSettings(**{"clipping-range": 4.0, "min-group-size": 5})
    assert settings.clipping_range == 4.0 and settings.minimum_group_size() == 5
    plan = group_plan(SecAggSettings(), 4)
    assert (plan.shares, plan.threshold, plan.tolerated_dropouts, plan.complete_graph) == (4, 3, 1, True)
    plan = group_plan(SecAggSettings(shares=15, threshold=0.67), 100)
    assert (plan.shares, plan.threshold, plan.tolerated_dropouts, plan.complete_graph) == (15, 11, 4, False)
    assert group_plan(SecAggSettings(), 3).tolerated_dropouts == 0


def test_a_group_below_the_minimum_is_refused_before_any_ask_and_held_back_by_split_groups():
    with pytest.raises(GroupTooSmall, match="a group of 2 member.s. is below the secure-aggregation minimum of 3"):
        GroupProtocol(["a", "b"])
    with pytest.raises(GroupTooSmall, match="minimum of 4"):
        GroupProtocol(["a", "b", "c"], SecAggSettings(threshold=4))
    secure, held = split_groups({0: ["a", "b", "c"], 1: ["d", "e"], 2: ["f"]}, SecAggSettings())
    assert secure == {0: ["a", "b", "c"]} and set(held) == {1, 2}
    assert "never summed in the clear" in held[1]
    with pytest.raises(SecAggSettingsError, match="lists a member twice"):
        GroupProtocol(["a", "b", "a"])
    with pytest.raises(SecAggSettingsError, match="for a group of 300"):
        GroupProtocol(range(300), SecAggSettings(modulus=2**48, max_weight=2**16, quantization_range=2**24))


def _message(content: RecordDict) -> Message:
    return Message(over_the_wire(content)[0], dst_node_id=100, message_type=MessageType.TRAIN, group_id="1")


def test_the_client_refuses_a_setup_that_would_not_hide_its_update():
    fed = Federation(["a", "b", "c"], {})
    ask = GroupProtocol(["a", "b", "c"], session="s").asks()["a"]
    for weak in ({"threshold": 1}, {"min-group-size": 2}, {"shares": 1}):
        with pytest.raises(ProtocolViolation, match="setup refused"):
            fed.app(_message(wire.ask_content({**ask, **weak})), fed.contexts["a"])
    with pytest.raises(ProtocolViolation, match="arrived after"):  # stages in order, one session
        fed.app(_message(wire.ask_content({"stage": wire.UNMASK, "session": "s"})), fed.contexts["a"])


def test_plain_train_messages_pass_through_unless_the_client_requires_secure_aggregation():
    from flwr.clientapp import ClientApp

    def train(msg, context):
        return Message(RecordDict({"metrics": ConfigRecord({"plain": True})}), reply_to=msg)

    context = Context(run_id=1, node_id=100, node_config={}, state=RecordDict(), run_config={})
    plain = _message(RecordDict({"config": ConfigRecord({"server-round": 1})}))
    app = ClientApp(mods=[secagg_client_mod()])
    app.train()(train)
    assert app(plain, context).content["metrics"]["plain"] is True
    strict = ClientApp(mods=[secagg_client_mod(require=True)])
    strict.train()(train)
    # a reply without arrays (IFCA's choice step under secure aggregation) passes; one with arrays does not
    assert strict(plain, context).content["metrics"]["plain"] is True
    uploading = ClientApp(mods=[secagg_client_mod(require=True)])

    @uploading.train()
    def train_and_upload(msg, context):
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(3))})}), reply_to=msg)

    with pytest.raises(ProtocolViolation, match="sends arrays only under secure aggregation"):
        uploading(plain, context)


def test_flowers_secaggplus_mod_cannot_read_a_message_api_reply():
    """Flower's mod reads the train reply through the legacy FitRes conversion
    (recorddict_to_fitres), which looks for 'fitres.parameters': a Message-API reply
    ({"arrays", "metrics"}) fails there, after training, every time."""
    from flwr.app import Array, ArrayRecord, MetricRecord
    from flwr.client.mod import secaggplus_mod
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage

    trained = []

    def train(msg, context):
        trained.append(True)
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(model(0)["layer0.w"])}),
                                   "metrics": MetricRecord({"num-examples": 5})}), reply_to=msg)

    context = Context(run_id=1, node_id=100, node_config={}, state=RecordDict(), run_config={})
    context.state.config_records[RECORD_KEY_STATE] = ConfigRecord({"current_stage": Stage.SHARE_KEYS})
    configs = ConfigRecord({Key.STAGE: Stage.COLLECT_MASKED_VECTORS, Key.CIPHERTEXT_LIST: [b"x"],
                            Key.SOURCE_LIST: [1]})
    content = RecordDict({"arrays": ArrayRecord({"w": Array(model(0)["layer0.w"])}), RECORD_KEY_CONFIGS: configs})
    with pytest.raises(KeyError, match="fitres.parameters"):
        secaggplus_mod(_message(content), context, train)
    assert trained == [True]


def test_a_device_imports_the_mod_without_the_servers_packages():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("import sys\nimport clusterfed.secagg\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('scipy', 'sklearn', 'matplotlib', 'ray', 'torch')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
