"""A real deployment on 127.0.0.1: a TLS SuperLink, SuperNodes with their own
``client-key`` and ``data-path`` (from ``clusterfed partition``), FedClust via ``flwr run``.

While the run goes on, one SuperNode is killed (the run goes on and counts the failures;
the client is marked absent), a new SuperNode joins (placed as a newcomer in its true
group's cluster), and the killed one is restarted with the same key (served its cluster's
model again). The test starts and stops only its own processes, each in its own process
group, on free ports, with Flower's state in a temporary folder.

Slow by nature (Flower's SuperNodes poll for work every 3 s; each message runs in a
fresh ClientApp process, which hands it to the device's warm worker): about 3 minutes on
two shared cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SEARCH_PATH = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
SUPERLINK = shutil.which("flower-superlink", path=SEARCH_PATH)
SUPERNODE = shutil.which("flower-supernode", path=SEARCH_PATH)
FLWR = shutil.which("flwr", path=SEARCH_PATH)
OPENSSL = shutil.which("openssl")

pytestmark = pytest.mark.skipif(
    not (SUPERLINK and SUPERNODE and FLWR and OPENSSL),
    reason="needs flower-superlink, flower-supernode and flwr (pip install flwr) and openssl on PATH",
)
pytestmark = [pytestmark, pytest.mark.end_to_end]

# generous: CI machines are slow and shared; these bound waiting, they are not asserted on
RUN_SECONDS = 600
NODE_UP_SECONDS = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, seconds: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


class Federation:
    """Our own SuperLink, SuperNodes and `flwr run`, each started in a new session so that
    it and the children it spawns (SuperExec, ClientApps) are stopped by its own id."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.port = free_port()
        self.env = dict(os.environ, PATH=SEARCH_PATH, FLWR_HOME=str(tmp / "flwr"),
                        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                        CLUSTERFED_CACHE_DIR=str(tmp / "cache"), CLUSTERFED_WORKER_DIR=str(tmp / "workers"),
                        PYTHONPATH=str(ROOT))
        self.processes: list[subprocess.Popen] = []
        self.nodes: dict[str, subprocess.Popen] = {}
        self.certs = tmp / "certs"

    def spawn(self, args: list[str], name: str) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("ab")
        process = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp,
                                   start_new_session=True)
        self.processes.append(process)
        return process

    def start_superlink(self, *extra_args: str) -> None:
        subprocess.run(["sh", str(ROOT / "scripts" / "make-certs.sh"), str(self.certs), "127.0.0.1"], check=True,
                       capture_output=True)
        self.spawn([SUPERLINK, "--ssl-ca-certfile", str(self.certs / "ca.crt"),
                    "--ssl-certfile", str(self.certs / "server.pem"), "--ssl-keyfile", str(self.certs / "server.key"),
                    "--host", "127.0.0.1", "--port", str(self.port),
                    "--disable-runtime-dependency-installation", *extra_args], "superlink")
        self.wait_for_superlink()
        (self.tmp / "flwr").mkdir(exist_ok=True)
        (self.tmp / "flwr" / "config.toml").write_text(
            '[superlink]\ndefault = "test"\n\n[superlink.test]\n'
            f'address = "127.0.0.1:{self.port}"\nroot-certificates = "{self.certs / "ca.crt"}"\n')

    def wait_for_superlink(self) -> None:
        def accepting():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                return False

        wait_for(accepting, NODE_UP_SECONDS, "the SuperLink's port")

    def start_node(self, key: str, data: Path, extra_node_config: str = "", extra_args: tuple[str, ...] = ()) -> None:
        node_config = f'client-key="{key}" data-path="{data}" {extra_node_config}'.strip()
        self.nodes[key] = self.spawn(
            [SUPERNODE, "--root-certificates", str(self.certs / "ca.crt"), "--superlink", f"127.0.0.1:{self.port}",
             "--port", str(free_port()), "--node-config", node_config, *extra_args], f"node-{key}")

    def flwr(self, *args: str) -> subprocess.CompletedProcess:
        """A `flwr` CLI command against this federation's connection (named "test")."""
        return subprocess.run([FLWR, *args], env=self.env, cwd=self.tmp, capture_output=True, text=True, timeout=120)


    @staticmethod
    def stop(process: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
        if process.poll() is None:
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)

    def close(self) -> None:
        for process in reversed(self.processes):
            try:
                self.stop(process)
            except ProcessLookupError:
                pass
        # the devices' warm workers run in sessions of their own: stop them by the pids they wrote
        for pid_file in (self.tmp / "workers").glob("*.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass

    def kill_superlink(self, superlink: subprocess.Popen) -> None:
        """SIGKILL the SuperLink and what it launched, as a crash of its host would. Flower
        starts the SuperExec in a session of its own and the SuperExec starts the ServerApp:
        neither is in the SuperLink's process group. They exit once they see their parent
        gone, but a parent only looks gone once it is reaped, and an init that does not reap
        (as in some CI containers) leaves the old ServerApp running; it then reconnects to the
        restarted SuperLink and writes to out-dir beside the resumed run."""
        self.stop(superlink, signal.SIGKILL)
        address = f"127.0.0.1:{self.port}"
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            launched = any(Path(arg).name in ("flower-superexec", "flwr-serverapp") for arg in argv[:2])
            if launched and address in argv:
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def warm_workers(self) -> list[Path]:
        return sorted((self.tmp / "workers").glob("*.pid"))


def rows(out: Path) -> list[dict]:
    path = out / "rounds.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_deployed_fedclust_with_a_killed_a_restarted_and_a_late_supernode(tmp_path):
    from clusterfed.cli import main as cli_main

    parts, out = tmp_path / "parts", tmp_path / "out"
    data = {"num-clients": 4, "partitioner": "label-groups", "label-groups": "0,1;2,3", "dataset": "digits"}
    settings = [f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in data.items()]
    assert cli_main(["partition", "--out", str(parts), *sum((["--set", s] for s in settings), [])]) == 0
    manifest = json.loads((parts / "manifest.json").read_text())
    true_group = {f"dev-{i}": client["true-group"] for i, client in enumerate(manifest["clients"])}
    assert true_group["dev-0"] == true_group["dev-2"] != true_group["dev-1"] == true_group["dev-3"]

    federation = Federation(tmp_path)
    try:
        federation.start_superlink()
        for i in range(3):
            federation.start_node(f"dev-{i}", parts / f"part-{i}.npz")
        run_config = {**data, "strategy": "fedclust", "min-clients": 3, "rounds": 4, "timeout": 60.0,
                      "absent-after": 1, "fedclust.cluster-epochs": 2, "batch-size": 32, "device": "cpu",
                      "checkpoint": False, "out-dir": str(out), "wait-timeout": float(NODE_UP_SECONDS)}
        overrides = " ".join(f"{k}={json.dumps(v)}" if isinstance(v, str) else f"{k}={str(v).lower()}"
                             if isinstance(v, bool) else f"{k}={v}" for k, v in run_config.items())
        run = federation.spawn([FLWR, "run", str(ROOT), "test", "--stream", "--run-config", overrides], "flwr-run")

        # round 1 done with three clients: kill dev-0; a new device dev-3 joins
        wait_for(lambda: len(rows(out)) >= 1 or run.poll() is not None, RUN_SECONDS, "round 1")
        federation.stop(federation.nodes["dev-0"], signal.SIGKILL)
        federation.start_node("dev-3", parts / "part-3.npz")
        # once dev-0 is marked absent, the device comes back with its key and data
        wait_for(lambda: any(r["clients_absent"] for r in rows(out)) or run.poll() is not None, RUN_SECONDS,
                 "dev-0 to be marked absent")
        federation.start_node("dev-0", parts / "part-0.npz")
        run.wait(timeout=RUN_SECONDS)
        # each device's messages were answered by its warm worker (dev-0's survived its SuperNode)
        workers = federation.warm_workers()
    finally:
        federation.close()

    log = (tmp_path / "logs" / "flwr-run.log").read_text(errors="replace")
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "ok", f"{status}\n{log[-3000:]}"
    records = rows(out)
    clusters = json.loads((out / "clusters.json").read_text())
    assert len(records) == 4
    assert records[0]["clients_known"] == 3 and records[0]["ari"] == 1.0
    # the killed node's messages failed and it was marked absent, then came back
    assert sum(r["failures"] for r in records) >= 1
    assert any(r["clients_absent"] == 1 and "dev-0" not in r["client_accuracy"] for r in records)
    assert records[-1]["clients_absent"] == 0 and records[-1]["clients_known"] == 4
    assert "dev-0" in records[-1]["client_accuracy"]
    # the late device was placed as a newcomer in its true group's cluster
    newcomers = {n["client"]: n for n in clusters["newcomers"]}
    assert "dev-3" in newcomers and newcomers["dev-3"]["matches_true_group"]
    # everyone, the restarted device included, is in its true group's cluster
    assignment = clusters["assignment"]
    assert set(assignment) == set(true_group)
    assert assignment["dev-0"] == assignment["dev-2"] != assignment["dev-1"] == assignment["dev-3"]
    assert records[-1]["ari"] == 1.0
    assert len(workers) == 4


def test_a_serverapp_that_cannot_start_says_why_in_the_streamed_output(tmp_path):
    """min-clients = 2 with one SuperNode and a short wait-timeout: `flwr run --stream`
    shows the reason at ERROR, and status.json says failed with the same sentence."""
    parts, out = tmp_path / "parts", tmp_path / "out"
    from clusterfed.cli import main as cli_main

    assert cli_main(["partition", "--out", str(parts), "--set", "num-clients=2", "--set", "dataset=digits"]) == 0
    federation = Federation(tmp_path)
    try:
        federation.start_superlink()
        federation.start_node("dev-0", parts / "part-0.npz")
        overrides = f'num-clients=2 min-clients=2 wait-timeout=3.0 rounds=1 out-dir="{out}"'
        run = federation.spawn([FLWR, "run", str(ROOT), "test", "--stream", "--run-config", overrides], "flwr-run")
        code = run.wait(timeout=RUN_SECONDS)
    finally:
        federation.close()
    log = (tmp_path / "logs" / "flwr-run.log").read_text(errors="replace")
    # `flwr run` itself exits 0 here (code is 0 with Flower 1.41: it does not pass the run's
    # outcome on); the ServerApp's process exits with Flower's code 201, as the log says
    assert code is not None
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and "only" in status["error"] and "SuperNodes" in status["error"], status
    assert f"clusterfed: run failed: {status['error']}" in log, log[-3000:]


def test_a_deployed_run_resumes_after_the_superlink_is_killed(tmp_path):
    """The SuperLink (and with it the ServerApp) is killed after round 2 of 4; restarted on
    the same database, the devices reconnect, and `flwr run` with resume-from="auto" goes
    on from the checkpoint in out-dir to round 4."""
    from clusterfed.cli import main as cli_main

    parts, out, database = tmp_path / "parts", tmp_path / "out", tmp_path / "state.db"
    settings = ["num-clients=2", "dataset=digits", "partitioner=label-groups", 'label-groups="0-4;5-9"']
    assert cli_main(["partition", "--out", str(parts), *sum((["--set", s] for s in settings), [])]) == 0
    federation = Federation(tmp_path)
    overrides = ('strategy="fedavg" num-clients=2 min-clients=2 rounds=4 partitioner="label-groups" '
                 f'label-groups="0-4;5-9" batch-size=32 device="cpu" timeout=60.0 wait-timeout={float(NODE_UP_SECONDS)} '
                 f'resume-from="auto" out-dir="{out}"')
    try:
        federation.start_superlink("--database", str(database))
        superlink_args = federation.processes[-1].args
        for i in range(2):
            federation.start_node(f"dev-{i}", parts / f"part-{i}.npz")
        first = federation.spawn([FLWR, "run", str(ROOT), "test", "--stream", "--run-config", overrides], "flwr-run")
        wait_for(lambda: len(rows(out)) >= 2 or first.poll() is not None, RUN_SECONDS, "round 2")
        assert len(rows(out)) >= 2 and (out / "checkpoint.json").exists()
        federation.kill_superlink(federation.processes[0])  # with its SuperExec and ServerApp
        first.wait(timeout=120)
        done_before = len(rows(out))
        federation.spawn(superlink_args, "superlink-restarted")
        federation.wait_for_superlink()
        second = federation.spawn([FLWR, "run", str(ROOT), "test", "--stream", "--run-config", overrides],
                                  "flwr-run-resumed")
        second.wait(timeout=RUN_SECONDS)
    finally:
        federation.close()
    status = json.loads((out / "status.json").read_text())
    log = (tmp_path / "logs" / "flwr-run-resumed.log").read_text(errors="replace")
    superlink_log = (tmp_path / "logs" / "superlink-restarted.log").read_text(errors="replace")
    assert status["status"] == "ok", f"{status}\n{log[-3000:]}\nrestarted SuperLink:\n{superlink_log[-3000:]}"
    records = rows(out)
    assert [r["round"] for r in records] == [1, 2, 3, 4] and done_before < 4
    assert records[-1]["clients_known"] == 2
    assert "resumed from" in log, log[-3000:]
    # the killed ServerApp never wrote how its run ended: the resumed run's status says so
    assert "never wrote how it ended" in status.get("note", ""), status
