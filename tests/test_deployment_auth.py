"""SuperNode authentication on 127.0.0.1, as docs/deployment.md documents it: a TLS
SuperLink with ``--enable-supernode-auth``; a device whose public key was registered with
``flwr supernode register`` joins and trains; a device with an unregistered key is refused.
Starts and stops only its own processes (``test_deployment.Federation``)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from test_deployment import FLWR, NODE_UP_SECONDS, RUN_SECONDS, Federation, rows, wait_for

SSH_KEYGEN = shutil.which("ssh-keygen")
pytestmark = pytest.mark.skipif(not SSH_KEYGEN, reason="needs ssh-keygen (openssh-client) to make device keys")
pytestmark = [pytestmark, pytest.mark.end_to_end]


def _device_key(folder, name):
    folder.mkdir(exist_ok=True)
    subprocess.run([SSH_KEYGEN, "-t", "ecdsa", "-b", "384", "-N", "", "-q", "-f", str(folder / name)], check=True)
    return folder / name


def test_only_a_registered_supernode_joins_and_trains(tmp_path):
    from clusterfed.cli import main as cli_main

    from test_deployment import ROOT

    parts, out, keys = tmp_path / "parts", tmp_path / "out", tmp_path / "keys"
    assert cli_main(["partition", "--out", str(parts), "--set", "num-clients=2", "--set", "dataset=digits"]) == 0
    registered, stranger = _device_key(keys, "dev-0"), _device_key(keys, "dev-1")
    federation = Federation(tmp_path)
    try:
        federation.start_superlink("--enable-supernode-auth")
        answer = federation.flwr("supernode", "register", str(registered) + ".pub", "test", "--format", "json")
        assert answer.returncode == 0, answer.stdout + answer.stderr
        federation.start_node("dev-0", parts / "part-0.npz", extra_args=("--auth-supernode-private-key", str(registered)))
        federation.start_node("dev-1", parts / "part-1.npz", extra_args=("--auth-supernode-private-key", str(stranger)))

        def online():
            listed = federation.flwr("supernode", "list", "test", "--format", "json")
            return listed.returncode == 0 and '"online"' in listed.stdout.lower() and listed.stdout
        listing = wait_for(online, NODE_UP_SECONDS, "the registered SuperNode to come online")
        config = ('num-clients=2 min-clients=1 rounds=1 strategy="fedavg" device="cpu" checkpoint=false '
                  f'wait-timeout={float(NODE_UP_SECONDS)} timeout=60.0 out-dir="{out}"')
        run = federation.spawn([FLWR, "run", str(ROOT), "test", "--stream", "--run-config", config], "flwr-run")
        run.wait(timeout=RUN_SECONDS)
    finally:
        federation.close()

    assert json.loads((out / "status.json").read_text())["status"] == "ok"
    (record,) = rows(out)
    assert list(record["client_accuracy"]) == ["dev-0"]  # the unregistered device never took part
    nodes = json.loads(listing)["nodes"]
    assert [node["status"] for node in nodes] == ["online"]  # one device registered, one online
    # the registered device got a node id; the stranger's every connection attempt failed
    assert "SuperNode ID" in (tmp_path / "logs" / "node-dev-0.log").read_text(errors="replace")
    stranger_log = (tmp_path / "logs" / "node-dev-1.log").read_text(errors="replace")
    assert "SuperNode ID" not in stranger_log and "Connection attempt failed" in stranger_log, stranger_log[-2000:]
