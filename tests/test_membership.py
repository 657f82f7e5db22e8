"""Membership as a deployment sees it, in-process: start at ``min-clients``, nodes that
join late, nodes that stop answering (absent) and come back under a new node id.

``ChurnGrid`` stands in for a SuperLink: a stopped node may still be listed (Flower lists
a dead SuperNode until its heartbeat lapses) and messages to it come back as
``NODE_UNAVAILABLE`` error replies, as the SuperLink makes them.
"""

import json
import os
from pathlib import Path

import pytest
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from clusterfed import server_app
from clusterfed.client_app import app as client_app
from clusterfed.config import ConfigError, parse_config
from clusterfed.runner.inprocess import InProcessGrid
from clusterfed.server_app import run_server


class ChurnGrid(InProcessGrid):
    def __init__(self, num_nodes: int):
        super().__init__(client_app, num_nodes)
        self.stopped: set[int] = set()  # listed, but messages to it fail
        self.gone: set[int] = set()  # no longer listed

    def get_node_ids(self):
        return [n for n in self.node_ids if n not in self.gone]

    def start_node(self, partition_id: int) -> int:
        """A SuperNode (re)starts: a fresh node id, whatever its data."""
        node = max(self.node_ids) + 1
        self.node_ids.append(node)
        self.contexts[node] = Context(run_id=self._run_id, node_id=node, node_config={"partition-id": partition_id},
                                      state=RecordDict(), run_config={})
        return node

    def push_messages(self, messages):
        """Like a SuperLink, refuse (empty id) a message for a node that is gone."""
        messages = list(messages)
        ids = list(super().push_messages(messages))
        for i, message in enumerate(messages):
            if message.metadata.dst_node_id in self.gone:
                self.pending.pop(ids[i], None)
                ids[i] = ""
        return ids

    def _call(self, message: Message) -> Message | None:
        if message.metadata.dst_node_id in self.stopped | self.gone:
            return Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Node unavailable"), reply_to=message)
        return super()._call(message)


@pytest.fixture
def churn(monkeypatch):
    """Run ``events[round](grid)`` just before that round's discovery."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    plan = {}

    from clusterfed.runner.membership import Membership

    discover = Membership.discover

    def discover_after_events(members, server_round):
        if server_round in plan["events"]:
            plan["events"][server_round](members.link.grid)
        discover(members, server_round)

    monkeypatch.setattr(Membership, "discover", discover_after_events)
    return plan


def rows(out):
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]


def config(tmp_path, **extra):
    values = {"strategy": "fedclust", "num-clients": 4, "min-clients": 3, "rounds": 5, "out-dir": str(tmp_path),
              "partitioner": "label-groups", "label-groups": "0,1;2,3", "batch-size": 32, "cluster-epochs": 2,
              "wait-timeout": 5.0}
    values.update(extra)
    return parse_config(values)


@pytest.mark.end_to_end
def test_late_node_is_placed_absent_node_is_kept_and_served_again(tmp_path, churn):
    grid = ChurnGrid(3)  # partitions 0..2 start, partition 3 joins in round 3
    killed = {}

    def stop_client_1(g):
        killed["node"] = g.node_ids[1]
        g.stopped.add(g.node_ids[1])

    def join_client_3(g):
        g.start_node(3)

    def restart_client_1(g):
        g.gone.add(killed["node"])  # its old id is finally dropped by the SuperLink ...
        g.start_node(1)  # ... and the device comes back under a new one

    churn["events"] = {2: stop_client_1, 3: join_client_3, 5: restart_client_1}
    run_server(grid, config(tmp_path), stream=None, deployment=True)
    records = rows(tmp_path)
    clusters = json.loads((tmp_path / "clusters.json").read_text())
    key_1 = "1"  # without client-key or data-path, a client's key is its partition-id

    assert [r["clients_absent"] for r in records] == [0, 0, 1, 1, 0]
    # absent clients are not messaged and not counted
    assert [r["clients_known"] for r in records] == [3, 3, 3, 3, 4]
    # train and evaluate of rounds 2 and 3 failed; an absent client's node that is still
    # listed is only asked for its profile, and that failing is not a new fault
    assert [r["failures"] for r in records[:4]] == [0, 2, 2, 0]
    assert key_1 not in records[3]["client_accuracy"]
    # the newcomer was placed in its true group's cluster
    assert [(n["client"], n["round"]) for n in clusters["newcomers"]] == [("3", 3)]
    assert clusters["newcomers"][0]["matches_true_group"]
    assert clusters["newcomers"][0]["new_cluster"] is False
    # the returning client keeps its cluster and is evaluated on it again
    groups, assignment = clusters["true_groups"], clusters["assignment"]
    assert {k for k in assignment if assignment[k] == assignment[key_1]} == {k for k in groups if groups[k] == groups[key_1]}
    assert key_1 in records[4]["client_accuracy"]
    assert records[4]["ari"] == 1.0


def test_a_node_that_is_gone_is_counted_at_once_and_marked_absent(tmp_path, churn):
    churn["events"] = {2: lambda g: g.gone.add(g.node_ids[2])}
    run_server(ChurnGrid(3), config(tmp_path, rounds=3), stream=None, deployment=True)
    records = rows(tmp_path)
    assert [r["faults"] for r in records] == [{}, {"unavailable": 2}, {"unavailable": 2}]
    assert [r["clients_absent"] for r in records] == [0, 0, 1]
    assert "2" in json.loads((tmp_path / "clusters.json").read_text())["assignment"]


def test_deployment_starts_with_min_clients_and_accepts_more(tmp_path, churn):
    churn["events"] = {}
    grid = ChurnGrid(3)
    run_server(grid, config(tmp_path, **{"min-clients": 2, "rounds": 1}), stream=None, deployment=True)
    assert rows(tmp_path)[0]["clients_known"] == 3


def test_too_few_nodes_within_wait_timeout_is_a_clear_error(tmp_path, churn):
    grid = ChurnGrid(2)
    with pytest.raises(ConfigError, match="only 2 of the 3 SuperNodes"):
        run_server(grid, config(tmp_path, **{"wait-timeout": 0.2}), stream=None, deployment=True)


def test_simulation_keeps_the_exact_count(tmp_path, churn):
    with pytest.raises(ConfigError, match="num-clients = 4 but the federation has 5"):
        run_server(ChurnGrid(5), config(tmp_path), stream=None, node_wait_seconds=0)


def test_status_file_says_ok_or_failed(tmp_path, churn):
    churn["events"] = {}
    ok, failed = tmp_path / "ok", tmp_path / "failed"
    run_config = {"strategy": "fedavg", "num-clients": 2, "rounds": 1, "out-dir": str(ok), "batch-size": 32,
                  "partitioner": "label-groups", "label-groups": "0-4;5-9"}
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config)
    server_app.main(ChurnGrid(2), context)
    assert json.loads((ok / "status.json").read_text())["status"] == "ok"

    status = json.loads((ok / "status.json").read_text())
    assert status["round"] == 1 and status["pid"] == os.getpid() and status["host"] and status["updated"]

    context.run_config.update({"out-dir": str(failed), "wait-timeout": 0.2, "num-clients": 3})
    with pytest.raises(server_app.RunFailed):
        server_app.main(ChurnGrid(2), context)
    status = json.loads((failed / "status.json").read_text())
    assert status["status"] == "failed" and "SuperNodes" in status["error"]


def test_status_file_says_how_the_run_ended_and_names_absent_and_failing_devices(tmp_path, churn):
    def break_client_2(g):
        g.contexts[g.node_ids[2]].node_config["data-path"] = str(tmp_path / "missing.npz")

    churn["events"] = {2: break_client_2}
    grid = ChurnGrid(3)
    run_config = {"strategy": "fedavg", "num-clients": 3, "rounds": 4, "out-dir": str(tmp_path), "batch-size": 32,
                  "partitioner": "label-groups", "label-groups": "0-4;5-9"}
    server_app.main(grid, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config))
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "ok" and status["ended"] == "completed all 4 rounds"
    assert status["absent"] == [{"client": "2", "node": grid.node_ids[2]}]
    [failing] = status["failing"]
    assert failing["client"] == "2" and failing["node"] == grid.node_ids[2] and failing["failures"] >= 2
    assert "missing.npz" in failing["reason"]


def test_a_start_failure_is_logged_at_error_with_the_sentence_of_status_json(tmp_path, churn, caplog):
    """What ``flwr run --stream`` shows is the ServerApp's log: the reason is in it. The
    failure is an Exception, so Flower's flwr-serverapp logs it, uploads the logs, marks the
    run failed and exits 1 (a SystemExit would bypass its handler)."""
    churn["events"] = {}
    run_config = {"strategy": "fedavg", "num-clients": 4, "min-clients": 4, "wait-timeout": 0.2, "rounds": 1,
                  "out-dir": str(tmp_path), "partitioner": "label-groups", "label-groups": "0-4;5-9"}
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config)
    with caplog.at_level("ERROR"), pytest.raises(server_app.RunFailed) as raised:
        server_app.main(ChurnGrid(3), context)
    assert isinstance(raised.value, Exception)
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "failed" and "only 3 of the 4 SuperNodes" in status["error"]
    assert str(raised.value) == status["error"]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [f"clusterfed: run failed: {status['error']}"]


def test_a_stale_running_status_is_replaced_with_a_note(tmp_path, churn):
    churn["events"] = {}
    import socket
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "status.json").write_text(json.dumps({"status": "running", "pid": int(gone.stdout), "time": "t0",
                                                      "updated": "t1", "host": socket.gethostname()}))
    run_config = {"strategy": "fedavg", "num-clients": 2, "rounds": 1, "out-dir": str(tmp_path), "batch-size": 32,
                  "partitioner": "label-groups", "label-groups": "0-4;5-9"}
    server_app.main(ChurnGrid(2), Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                                          run_config=run_config))
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "ok"
    assert f"pid {int(gone.stdout)}" in status["note"] and "last update t1" in status["note"]
    assert "is no longer running" in status["note"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_zombie_process_is_not_taken_for_a_running_one():
    import signal
    import subprocess
    import sys

    from clusterfed.server_app import _alive

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, left unreaped: a zombie
        os.kill(child.pid, 0)  # which still answers signal 0
        assert not _alive(child.pid)
    finally:
        child.kill()
        child.wait()


def _garbage_node(grid, tmp_path, key="bad-device"):
    """A fourth SuperNode whose data file is garbage."""
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"this is not an npz file\n" * 10)
    node = grid.start_node(3)
    grid.contexts[node].node_config.update({"data-path": str(garbage), "client-key": key})
    del grid.contexts[node].node_config["partition-id"]
    return node


def test_a_device_with_garbage_data_is_named_and_marked_absent_and_the_others_cluster_as_before(tmp_path, churn):
    churn["events"] = {}
    clean = tmp_path / "clean"
    run_server(ChurnGrid(3), config(clean, rounds=4), stream=None, deployment=True)

    def fixed_device_restarts(g):  # the operator fixes the file; the SuperNode restarts on a new node id
        g.gone.add(node)
        g.contexts[g.start_node(3)].node_config["client-key"] = "bad-device"

    churn["events"] = {5: fixed_device_restarts}
    grid = ChurnGrid(3)
    node = _garbage_node(grid, tmp_path)
    run_server(grid, config(tmp_path / "run", rounds=5), stream=None, deployment=True)
    records, reference = rows(tmp_path / "run"), rows(clean)
    for record in records[:2]:  # absent-after = 2: named in each failing round ...
        (failed,) = record["failed"]
        assert failed["client"] == "bad-device" and failed["node"] == node and failed["kind"] == "error"
        assert "garbage.npz" in failed["reason"] and "\n" not in failed["reason"]
        assert failed["reason"].startswith("ValueError: data-path") and "client-key" not in failed["reason"]
    # ... then marked absent: asked for its profile only, which is not a new fault
    assert [r["clients_absent"] for r in records] == [0, 1, 1, 1, 0]
    assert records[2]["absent"] == [{"client": "bad-device", "node": node}]
    assert [r["failures"] for r in records] == [1, 1, 0, 0, 0]
    assert "failed" not in records[3] and "absent" not in records[4]
    # back with good data: placed and evaluated like any newcomer
    assert "bad-device" in records[4]["client_accuracy"] and records[4]["clients_known"] == 4
    # the others: the same clusters, accuracies and traffic as a run without the broken device
    for got, want in zip(records, reference):
        assert got["ari"] == want["ari"] == 1.0 or got["round"] == 1
        assert got["client_accuracy"] == want["client_accuracy"]
        assert got["bytes_up"] == want["bytes_up"]


def test_a_device_whose_training_fails_is_named_and_marked_absent(tmp_path, churn):
    def break_client_2(g):
        g.contexts[g.node_ids[2]].node_config["data-path"] = str(tmp_path / "missing.npz")

    churn["events"] = {2: break_client_2}
    grid = ChurnGrid(3)
    run_server(grid, config(tmp_path, rounds=4), stream=None, deployment=True)
    records = rows(tmp_path)
    assert "failed" not in records[0]
    named = {(f["client"], f["node"], f["kind"]) for f in records[1]["failed"]}
    assert named == {("2", grid.node_ids[2], "error")}
    assert all("missing.npz" in f["reason"] for f in records[1]["failed"])
    assert [r["clients_absent"] for r in records] == [0, 0, 1, 1]
    assert records[3]["absent"] == [{"client": "2", "node": grid.node_ids[2]}]
    assert "2" not in records[3]["client_accuracy"]


def test_two_nodes_with_the_same_client_key_are_both_reported_and_neither_is_served(tmp_path, churn, caplog):
    grid = ChurnGrid(3)
    first = grid.node_ids[1]  # partition 1, key "1"
    second = grid.start_node(3)
    grid.contexts[second].node_config["client-key"] = "1"  # partition 3's device, misconfigured with key "1"
    churn["events"] = {3: lambda g: g.gone.add(second)}  # the misconfigured SuperNode is stopped
    with caplog.at_level("WARNING"):
        run_server(grid, config(tmp_path, rounds=4), stream=None, deployment=True)
    records = rows(tmp_path)
    for record in records[:2]:
        assert record["duplicate_keys"] == [{"client": "1", "nodes": sorted([first, second])}]
        assert "1" not in record["client_accuracy"] and record["clients_known"] == 2
    assert any("client-key '1' is claimed by nodes" in m and str(first) in m and str(second) in m
               for m in caplog.messages)
    for record in records[2:]:  # only the first is left: it takes part again
        assert "duplicate_keys" not in record
        assert "1" in record["client_accuracy"] and record["clients_known"] == 3


def test_error_reasons_are_cut_to_one_named_line():
    from clusterfed.runner.replies import first_line, key_in_reason

    flower = "<class 'ValueError'>:<'[client-key \"pi \\\"3\\\"\"] data-path '/d/x.npz' is bad\nTraceback ...'>"
    assert key_in_reason(flower) == 'pi "3"'
    assert first_line(flower) == "ValueError: data-path '/d/x.npz' is bad"
    assert key_in_reason("Node unavailable") is None and first_line("Node unavailable") == "Node unavailable"
    assert len(first_line("x" * 1000)) == 300


def test_wait_for_nodes_returns_once_enough_are_up_or_the_wait_is_over():
    from clusterfed.runner.transport import wait_for_nodes

    class Joining:  # one more node at every look
        looks = 0

        def get_node_ids(self):
            self.looks += 1
            return list(range(self.looks))

    assert wait_for_nodes(Joining(), 3, wait_seconds=60, poll_every=0) == 3
    assert wait_for_nodes(Joining(), 5, wait_seconds=0, poll_every=0) == 1  # timed out: fewer than needed
