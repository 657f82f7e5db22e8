"""The deployed secure-aggregation check's parts that run without a federation: the hook that
holds a device mid-protocol (benchmarks/secagg_hold_app.py) and the app folder `flwr run` gets,
and the committed result of `make test-secagg-deployed`, when there is one.

The deployed run itself (TLS, SuperNode authentication, 8 SuperNodes, 5 rounds, a SuperNode killed between
the key exchange and the masked upload) is `make test-secagg-deployed`: ~15-25 min, outside
`make test`.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

import secagg_harness  # noqa: F401  (sets TaskIdentity, which building a Message needs)
from clusterfed.secagg import wire

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # benchmarks.* (a namespace package beside tests/)
RESULT = ROOT / "benchmarks" / "results" / "secure-aggregation" / "deployed" / "summary.json"


def _message(stage: str | None, server_round: int | None) -> Message:
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(3, dtype="float32"))})})
    if server_round is not None:
        content["config"] = ConfigRecord({"server-round": server_round})
    if stage is not None:
        content[wire.RECORD] = ConfigRecord({"stage": stage, "session": f"{server_round}/0"})
    return Message(content, dst_node_id=5, message_type=MessageType.TRAIN, group_id=str(server_round))


def test_the_hook_holds_only_the_named_stage_from_the_named_round():
    from benchmarks.secagg_hold_app import held_stage

    node = {"hold-at-stage": "collect", "hold-from-round": 3, "hold-marker": "/tmp/x"}
    assert held_stage(_message("collect", 3), node) == {"stage": "collect", "session": "3/0", "round": 3}
    assert held_stage(_message("collect", 4), node)["round"] == 4
    assert held_stage(_message("collect", 2), node) is None          # before the round
    assert held_stage(_message("share-keys", 3), node) is None       # the key exchange goes through
    assert held_stage(_message(None, 3), node) is None               # a plain train message (clustering round)
    assert held_stage(_message("collect", 3), {}) is None            # every other device: off


def test_a_held_device_writes_its_marker_and_never_answers(tmp_path):
    from benchmarks.secagg_hold_app import HoldMidProtocol

    answered = []

    class Inner:
        def __call__(self, message, context):
            answered.append(message)
            return Message(RecordDict(), reply_to=message)

    app = HoldMidProtocol.__new__(HoldMidProtocol)  # the wrapper around a stand-in for the stock app
    app._inner = Inner()
    marker = tmp_path / "dev-7.held"
    context = Context(run_id=1, node_id=5, node_config={"hold-at-stage": "collect", "hold-from-round": 2,
                                                      "hold-marker": str(marker), "hold-seconds": 1.0},
                      state=RecordDict(), run_config={})
    app(_message("share-keys", 2), context)  # passes
    assert len(answered) == 1 and not marker.exists()
    errors = []
    thread = threading.Thread(target=lambda: _call(app, _message("collect", 2), context, errors))
    thread.start()
    thread.join(timeout=30)
    held = json.loads(marker.read_text())
    assert held["stage"] == "collect" and held["round"] == 2 and held["pid"] > 0
    assert len(answered) == 1  # the stock app never saw the collect ask: nothing was uploaded
    assert errors and "never killed" in errors[0]  # without the kill it gives up, failing the message


def _call(app, message, context, errors):
    try:
        app(message, context)
    except RuntimeError as error:
        errors.append(str(error))


def test_the_app_folder_swaps_only_the_clientapp(tmp_path):
    import tomllib

    from benchmarks.bench_secagg_deployed import HOLD_MODULE, hold_app

    folder = hold_app(tmp_path / "app")
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]
    theirs = tomllib.loads((folder / "pyproject.toml").read_text())["tool"]["flwr"]
    assert theirs["app"]["components"] == {"serverapp": ours["app"]["components"]["serverapp"],
                                           "clientapp": f"{HOLD_MODULE}:app"}
    assert theirs["app"]["config"] == ours["app"]["config"]  # every run-config key and default
    # flwr run checks the attribute in the module's source (an assignment, not an import)
    from flwr.supercore.object_ref import validate

    assert validate(f"{HOLD_MODULE}:app", project_dir=folder) == (True, None)


@pytest.mark.skipif(not RESULT.exists(), reason="no committed result of make test-secagg-deployed yet")
def test_the_committed_deployed_check_passed():
    summary = json.loads(RESULT.read_text())
    assert summary["nodes"] >= 6 and summary["rounds"] >= 5 and summary["tls"] and summary["supernode_auth"]
    assert summary["strategy"] == "fedclust" and summary["secure_aggregation"] == "secaggplus"
    assert summary["held"]["stage"] == "collect"
    assert summary["all_checks_pass"], summary["checks"]
