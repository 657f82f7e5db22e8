"""Bugs the chaos soak (benchmarks/bench_chaos_soak.py) found, each pinned by an in-process
run that reproduces it (``test_membership.ChurnGrid`` stands in for a SuperLink)."""

import json

import pytest

from clusterfed.runner.checkpoint import load_checkpoint
from clusterfed.server_app import run_server
from test_membership import ChurnGrid, churn, config, rows  # noqa: F401 - churn is a fixture
pytestmark = pytest.mark.end_to_end


def test_a_resumed_deployment_whose_device_has_not_reconnected_marks_it_absent(tmp_path, churn):  # noqa: F811
    """The SuperLink was killed after round 2 and restarted; the resumed ServerApp starts
    with one of the four devices not connected yet. Its key is known from the checkpoint but
    has no node: it was asked to train (KeyError, the run failed before round 3 ended). Now
    it is absent until its device answers a probe, and then it takes part again."""
    churn["events"] = {}
    run_server(ChurnGrid(4), config(tmp_path, rounds=2), stream=None, deployment=True)
    assert load_checkpoint(tmp_path)["round"] == 2

    grid = ChurnGrid(4)
    late = grid.node_ids[3]
    grid.gone.add(late)  # not listed when the resumed run starts
    churn["events"] = {4: lambda g: g.gone.discard(late)}  # it reconnects before round 4
    resumed = config(tmp_path, **{"rounds": 5, "resume-from": str(tmp_path)})
    run_server(grid, resumed, stream=None, deployment=True)

    records = rows(tmp_path)
    assert [r["round"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["clients_absent"] for r in records] == [0, 0, 1, 0, 0]
    assert "3" not in records[2]["client_accuracy"] and "3" in records[4]["client_accuracy"]
    clusters = json.loads((tmp_path / "clusters.json").read_text())
    assert set(clusters["assignment"]) == {"0", "1", "2", "3"}


def test_a_resumed_run_stopped_before_its_first_round_leaves_rounds_jsonl_as_it_was(tmp_path, churn,  # noqa: F811
                                                                                     monkeypatch):
    """The SuperLink was killed again while the resumed ServerApp waited for its nodes: the
    new recorder had already emptied rounds.jsonl (opened for writing before the checkpoint
    was read), so the rounds done were missing from it until another resume got further."""
    from clusterfed.runner.driver import RoundDriver

    churn["events"] = {}
    run_server(ChurnGrid(4), config(tmp_path, rounds=2), stream=None, deployment=True)
    before = (tmp_path / "rounds.jsonl").read_text()
    assert [r["round"] for r in rows(tmp_path)] == [1, 2]

    def killed(driver):  # SIGKILL's stand-in: the ServerApp stops while it waits for nodes
        raise KeyboardInterrupt

    monkeypatch.setattr(RoundDriver, "wait_for_nodes", killed)
    with pytest.raises(KeyboardInterrupt):
        run_server(ChurnGrid(4), config(tmp_path, **{"rounds": 4, "resume-from": "auto"}), stream=None,
                   deployment=True)
    assert (tmp_path / "rounds.jsonl").read_text() == before


def test_after_a_resume_a_node_that_fails_before_saying_its_key_is_named_and_listed_once(tmp_path, churn):  # noqa: F811
    """The SuperLink came back on its database (nodes keep their ids); one device's node is
    listed but unreachable. Its profile probe failed as "node 1003" with no client (node
    ids are not kept, so the resumed run could not say whose node it was), and the device
    was listed twice among the absent (its key, and the node its failing profile named)."""
    churn["events"] = {}
    run_server(ChurnGrid(4), config(tmp_path, rounds=2), stream=None, deployment=True)

    grid = ChurnGrid(4)
    grid.stopped.add(grid.node_ids[3])  # listed, every message to it fails (NODE_UNAVAILABLE)
    run_server(grid, config(tmp_path, **{"rounds": 5, "resume-from": str(tmp_path)}), stream=None, deployment=True)

    records = rows(tmp_path)
    failed = [f for r in records[2:] for f in r.get("failed", [])]
    assert failed and all(f["client"] == "3" and f["node"] == grid.node_ids[3] for f in failed)
    assert [r["clients_absent"] for r in records] == [0, 0, 1, 1, 1]
    assert [[a["client"] for a in r["absent"]] for r in records[2:]] == [["3"]] * 3
