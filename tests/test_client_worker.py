"""The warm worker: a device's messages answered by one long-lived process, exactly as the
in-process ClientApp answers them."""

import os
import signal
import time

import numpy as np
import pytest
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from clusterfed import client_entry, client_worker, protocol
from clusterfed.cli import main as cli_main
from clusterfed.config import parse_config
from clusterfed.server_app import initial_arrays

DATA = {"num-clients": 3, "partitioner": "label-groups", "label-groups": "0,1;2,3", "dataset": "digits"}


@pytest.fixture()
def worker_env(tmp_path, monkeypatch):
    """Workers of this test live in its own folder and are stopped by the pids they wrote."""
    monkeypatch.setenv("CLUSTERFED_WORKER_DIR", str(tmp_path / "w"))
    monkeypatch.setenv("CLUSTERFED_CACHE_DIR", str(tmp_path / "cache"))
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    yield tmp_path / "w"
    for pid_file in (tmp_path / "w").glob("*.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    out = tmp_path_factory.mktemp("parts")
    assert cli_main(["partition", "--out", str(out)] + [a for k, v in DATA.items() for a in ("--set", f"{k}={v}")]) == 0
    return out / "part-1.npz"


def _message(message_type, with_model=True):
    config = parse_config(DATA)
    values = {**protocol.client_spec(config.to_flower()), "server-round": 1, "local-epochs": 1, "lr": 0.05,
              "cluster-id": 0, "upload": "full", "return": "weights"}
    content = RecordDict({protocol.CONFIG: protocol.config_record(values)})
    if with_model:
        content[protocol.ARRAYS] = initial_arrays(config)
    message = Message(content, dst_node_id=7, message_type=message_type)
    message.metadata.__dict__["_message_id"] = "m1"
    return message


def _ask(message, node_config):
    return client_entry.app(message, Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                                             run_config={}))


def _same_content(a: RecordDict, b: RecordDict):
    assert set(a) == set(b)
    for name in a:
        if isinstance(a[name], type(b[name])) and hasattr(a[name], "to_numpy_ndarrays"):
            for x, y in zip(a[name].to_numpy_ndarrays(), b[name].to_numpy_ndarrays(), strict=True):
                np.testing.assert_array_equal(x, y)
        else:
            assert dict(a[name]) == dict(b[name])


@pytest.mark.end_to_end
def test_worker_replies_equal_the_in_process_replies_and_one_process_serves_them(worker_env, part):
    node = {"client-key": "pi-01", "data-path": str(part)}
    replies = {}
    for mode in (False, True):
        config = {**node, "warm-worker": mode}
        replies[mode] = [_ask(_message(protocol.PROFILE_QUERY, with_model=False), config),
                         _ask(_message(MessageType.TRAIN), config), _ask(_message(MessageType.EVALUATE), config)]
    for in_process, worker in zip(replies[False], replies[True], strict=True):
        _same_content(in_process.content, worker.content)
    assert replies[True][1].content[protocol.CLIENT]["client-key"] == "pi-01"
    pids = list(worker_env.glob("*.pid"))
    assert len(pids) == 1  # three messages, one worker
    pid = int(pids[0].read_text())
    assert pid != os.getpid()
    _ask(_message(MessageType.EVALUATE), {**node, "warm-worker": True})
    assert [int(p.read_text()) for p in worker_env.glob("*.pid")] == [pid]


@pytest.mark.end_to_end
def test_an_error_in_the_worker_reaches_the_client_app_with_its_message(worker_env, tmp_path):
    np.savez(tmp_path / "bad.npz", x_train=np.zeros((2, 8, 8), np.uint8), y_train=np.array([0, 12]),
             x_test=np.zeros((1, 8, 8), np.uint8), y_test=np.array([1]))
    with pytest.raises(client_worker.WorkerError, match=r"ValueError: .*bad.npz.*label ids 0\.\.12"):
        _ask(_message(protocol.PROFILE_QUERY, with_model=False),
             {"client-key": "pi-02", "data-path": str(tmp_path / "bad.npz"), "warm-worker": True})


@pytest.mark.parametrize("case", ["garbage", "missing-arrays", "no-file", "empty"])
def test_a_device_with_broken_data_starts_no_worker(worker_env, tmp_path, case):
    path = tmp_path / "part.npz"
    if case == "garbage":
        path.write_bytes(b"not a zip" * 100)
    elif case == "missing-arrays":
        np.savez(path, x_train=np.zeros((2, 8, 8), np.uint8), y_train=np.array([0, 1]))
    elif case == "empty":
        np.savez(path, x_train=np.zeros((0, 8, 8), np.uint8), y_train=np.zeros(0, int),
                 x_test=np.zeros((1, 8, 8), np.uint8), y_test=np.array([1]))
    expected = {"garbage": "not a readable .npz", "missing-arrays": "lacks the arrays", "no-file": "does not exist",
                "empty": "non-zero number of examples"}[case]
    for message in (_message(protocol.PROFILE_QUERY, with_model=False), _message(MessageType.TRAIN)):
        with pytest.raises((ValueError, FileNotFoundError), match=rf'^\[client-key "pi-04"\] .*{expected}'):
            _ask(message, {"client-key": "pi-04", "data-path": str(path), "warm-worker": True})
    # checked in the light process: no worker was started, nothing of one is left
    assert not worker_env.exists() or not [p for p in worker_env.iterdir() if p.suffix in (".pid", ".sock", ".log")]


@pytest.mark.end_to_end
def test_a_killed_worker_is_replaced_and_an_idle_one_exits(worker_env, part):
    node = {"client-key": "pi-03", "data-path": str(part), "warm-worker": True, "warm-worker-idle": 1.0}
    _ask(_message(protocol.PROFILE_QUERY, with_model=False), node)
    (pid_file,) = worker_env.glob("*.pid")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the socket file stays behind
    reply = _ask(_message(protocol.PROFILE_QUERY, with_model=False), node)
    assert reply.content[protocol.CLIENT]["client-key"] == "pi-03"
    deadline = time.monotonic() + 60
    while list(worker_env.glob("*.pid")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list(worker_env.glob("*.pid")) and not list(worker_env.glob("*.sock"))


def test_a_worker_is_used_only_in_one_message_processes_unless_told():
    assert client_entry.uses_warm_worker({}) is False  # pytest is not Flower's flwr-clientapp process
    assert client_entry.uses_warm_worker({"warm-worker": "true"}) is True
    assert client_entry.uses_warm_worker({"warm-worker": False}) is False
    with pytest.raises(ValueError, match="warm-worker='sometimes'"):
        client_entry.uses_warm_worker({"warm-worker": "sometimes"})


def test_the_client_entry_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, clusterfed.client_entry; print(sorted(m for m in ('torch', 'scipy', 'sklearn', 'matplotlib') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_a_shared_worker_folder_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "open"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    monkeypatch.setenv("CLUSTERFED_WORKER_DIR", str(folder))
    with pytest.raises(client_worker.WorkerError, match="must belong to this user and be private"):
        client_worker.worker_dir()


def test_worker_stop_ends_only_this_users_workers_and_removes_stale_files(worker_env, capsys):
    import subprocess
    import sys

    folder = client_worker.worker_dir()
    sock = folder / "w-real.sock"
    worker = subprocess.Popen([sys.executable, "-m", "clusterfed.client_worker", "--socket", str(sock),
                               "--idle-seconds", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 60
        while not sock.with_suffix(".pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert int(sock.with_suffix(".pid").read_text()) == worker.pid
        (folder / "w-fake.pid").write_text(str(bystander.pid))  # an unrelated process of this user
        (folder / "w-fake.sock").write_text("")
        (folder / "w-fake.lock").write_text("")
        (folder / "w-dead.pid").write_text("999999999")
        (folder / "w-joined.pid").write_text(f"{worker.pid} {bystander.pid}")  # what `cat *.pid` joined
        assert cli_main(["worker", "stop", "--wait", "20"]) == 0
        assert worker.wait(timeout=20) is not None  # the worker was ended ...
        assert bystander.poll() is None  # ... the process a fake pid file names was not
        left = sorted(p.name for p in folder.iterdir())
        assert [n for n in left if n.startswith("w-")] == [], left
        out = capsys.readouterr().out
        assert f"stopped warm worker {worker.pid}" in out
        assert f"pid {bystander.pid}: it is not a clusterfed warm worker; not signalled" in out
    finally:
        for process in (worker, bystander):
            process.kill()
            process.wait()


def test_worker_stop_leaves_a_worker_of_another_socket_alone(worker_env):
    import subprocess
    import sys

    folder = client_worker.worker_dir()
    sock = folder / "w-a.sock"
    worker = subprocess.Popen([sys.executable, "-m", "clusterfed.client_worker", "--socket", str(sock),
                               "--idle-seconds", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not sock.with_suffix(".pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        other = tmp = folder / "other"
        other.mkdir()
        (tmp / "w-b.pid").write_text(str(worker.pid))  # a copied pid file: names a worker, not this one's
        report = client_worker.stop_workers(other, wait_seconds=5)
        assert report["stopped"] == [] and worker.poll() is None
        assert "it is the worker of" in report["left_alone"][0][1]
    finally:
        worker.kill()
        worker.wait()
