"""What the keeper asks Flower, through the `flwr` CLI (its Control API client): launch a
run, read a run's status, stop a run. The CLI is Flower's stable interface; each call is a
short process, so a keeper polling every few seconds costs little and survives any
SuperLink restart (nothing is kept open)."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.common.config import parse_config_args

FLWR_TIMEOUT = 120.0  # seconds one `flwr` command may take (a busy SuperLink answers slowly)


class LaunchError(RuntimeError):
    """`flwr run` gave no run id; the message is its last line."""


def app_config(app: str | Path, run_config: str) -> dict[str, Any]:
    """The run config Flower will hand the ServerApp: the app's ``[tool.flwr.app.config]``
    with the ``--run-config`` overrides (parsed by Flower's own parser), flattened."""
    project = tomllib.loads((Path(app) / "pyproject.toml").read_text())
    base = _flatten(project.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))
    return {**base, **parse_config_args([run_config] if run_config else None)}


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def with_resume(run_config: str) -> str:
    """The run config with ``resume-from="auto"`` (a relaunch continues from out-dir's
    checkpoint; the first launch starts fresh when out-dir has none)."""
    if parse_config_args([run_config] if run_config else None).get("resume-from") == "auto":
        return run_config
    return f'{run_config} resume-from="auto"'.strip()


def _last_json(text: str) -> dict[str, Any]:
    """The JSON object a `flwr ... --format json` command printed (after its progress lines)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON in the output")
    return json.loads(text[start:])


def _last_line(done: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {done.returncode}"


@dataclass
class FlwrCli:
    """``flwr run APP CONNECTION --run-config ...``, ``flwr ls``, ``flwr stop`` with the
    connection named in ``$FLWR_HOME/config.toml``."""

    app: str
    connection: str
    run_config: str
    flwr: str = "flwr"
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def _call(self, *args: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([self.flwr, *args], capture_output=True, text=True, timeout=FLWR_TIMEOUT,
                                  env=self.env, cwd=self.app, check=False)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([self.flwr, *args], 124, "", f"no answer within {FLWR_TIMEOUT:g} s")

    def launch(self) -> int:
        done = self._call("run", ".", self.connection, "--format", "json", "--run-config",
                          with_resume(self.run_config))
        try:
            answer = _last_json(done.stdout)
            return int(answer["run-id"])
        except (ValueError, KeyError, TypeError):
            raise LaunchError(_last_line(done)) from None

    def status(self, run_id: int) -> tuple[str, str] | None:
        """(Flower's status of the run, its details), or None when the SuperLink did not answer."""
        done = self._call("ls", self.connection, "--run-id", str(run_id), "--format", "json")
        try:
            runs = _last_json(done.stdout).get("runs") or []
        except ValueError:
            return None
        if not runs:
            return None
        return str(runs[0].get("status", "")), str(runs[0].get("status-details", "") or "")

    def stop(self, run_id: int) -> str:
        """Ask Flower to stop the run (its ServerApp's next heartbeat then ends it); what it said."""
        return _last_line(self._call("stop", str(run_id), self.connection, "--format", "json"))


def connection_home(folder: str | Path, name: str, address: str, root_certificates: str | None) -> Path:
    """A ``$FLWR_HOME`` holding one connection (for a keeper in a container, which has no
    ``~/.flwr`` of an operator): TLS with ``root_certificates``, else insecure."""
    home = Path(folder)
    home.mkdir(parents=True, exist_ok=True)
    security = (f'root-certificates = "{Path(root_certificates).resolve()}"' if root_certificates
                else "insecure = true")
    (home / "config.toml").write_text(f'[superlink.{name}]\naddress = "{address}"\n{security}\n')
    return home
