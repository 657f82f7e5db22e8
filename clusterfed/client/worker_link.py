"""The ClientApp's side of the warm worker (``clusterfed.client_worker``): the per-user
folder and key, the socket named by task, node config and code version, starting the worker
when none answers, and sending it one message's content."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

DEFAULT_IDLE_SECONDS = 900.0
START_SECONDS = 120.0  # a Raspberry Pi may take tens of seconds to import torch


class WorkerError(RuntimeError):
    """The worker could not be reached or its reply function raised (message says which)."""


def worker_dir() -> Path:
    """``$CLUSTERFED_WORKER_DIR``, else ``<tmp>/clusterfed-<uid>`` (short: Unix socket paths
    are limited to ~100 bytes)."""
    configured = os.environ.get("CLUSTERFED_WORKER_DIR")
    path = Path(configured).expanduser() if configured else Path(tempfile.gettempdir()) / f"clusterfed-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = path.stat()
    if status.st_uid != os.getuid() or status.st_mode & 0o077:
        # someone else's folder could hold a socket that impersonates the worker
        raise WorkerError(f"warm worker folder {path} must belong to this user and be private (chmod 700); "
                          "set CLUSTERFED_WORKER_DIR to another folder")
    return path


def authkey_of(directory: Path) -> bytes:
    key_file = directory / "key"
    with contextlib.suppress(FileExistsError):
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(32))
    return key_file.read_bytes()


def _stamps(package: Path) -> list[tuple[str, int]]:
    return sorted((str(path.relative_to(package)), path.stat().st_mtime_ns) for path in package.rglob("*.py"))


def _code_version(task: str) -> str:
    """Where the client code lives and when it last changed: a new app bundle (another folder)
    or an edited checkout gets a new worker. The code is clusterfed's and, for a task from
    another package, that package's (found without importing it)."""
    package = Path(__file__).resolve().parents[1]  # clusterfed/
    version = [str(package), sys.executable, _stamps(package)]
    top = task.partition(":")[0].split(".")[0]
    if top and top != package.name:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            version += [[str(p), _stamps(Path(p))] for p in spec.submodule_search_locations]
        elif spec is not None and spec.origin and Path(spec.origin).is_file():
            version += [spec.origin, Path(spec.origin).stat().st_mtime_ns]
    return json.dumps(version)


def socket_path(task: str, node_config: Mapping[str, Any]) -> Path:
    identity = json.dumps([task, sorted((str(k), str(v)) for k, v in node_config.items())]) + _code_version(task)
    return worker_dir() / f"w-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.sock"


def request(task: str, message_type: str, content: Any, context: Any,
            idle_seconds: float = DEFAULT_IDLE_SECONDS) -> Any:
    """The reply content for one message to ``task`` (its import path), from this node's worker
    for that task (started if not running). ``context``: the message's Flower Context."""
    path = socket_path(task, context.node_config)
    authkey = authkey_of(path.parent)
    connection = _connect(path, authkey)
    if connection is None:
        with _spawn_lock(path):
            connection = _connect(path, authkey) or _spawn_and_connect(path, authkey, idle_seconds, task)
    with connection:
        try:
            connection.send((task, message_type, content, context))
            status, payload = connection.recv()
        except (EOFError, OSError) as exc:  # the worker died mid-request: the next message starts a new one
            raise WorkerError(f"the warm worker stopped during the request ({exc!r}); see {path.with_suffix('.log')}") from exc
    if status == "error":
        raise WorkerError(payload)
    return payload


def _connect(path: Path, authkey: bytes):
    if not path.exists():
        return None
    try:
        return Client(str(path), family="AF_UNIX", authkey=authkey)
    except (ConnectionRefusedError, FileNotFoundError, ConnectionResetError, BrokenPipeError, EOFError):
        return None  # a stale socket of a worker that is gone, or one closing as idle


@contextlib.contextmanager
def _spawn_lock(path: Path):
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _spawn_and_connect(path: Path, authkey: bytes, idle_seconds: float, task: str):
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket left by a killed worker
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the same code this process runs
    log = open(path.with_suffix(".log"), "ab")  # noqa: SIM115 - handed to the child
    # a new session: the worker outlives this one-message process and its process group
    subprocess.Popen([sys.executable, "-m", "clusterfed.client_worker", "--socket", str(path), "--task", task,
                      "--idle-seconds", str(idle_seconds)],
                     env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        connection = _connect(path, authkey)
        if connection is not None:
            return connection
        time.sleep(0.05)
    raise WorkerError(f"the warm worker did not start within {START_SECONDS:.0f} s; see {path.with_suffix('.log')}")
