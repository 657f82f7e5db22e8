"""A warm worker: keeps a device's client code, torch and data loaded between messages.

Flower 1.41's SuperNode runs every message in a fresh ``flwr-clientapp`` process (its
``run_clientapp`` pulls one task, runs it and exits, in subprocess and process isolation
alike). Importing torch alone costs that process 2-3 s on a laptop core, more on a
Raspberry Pi, on every message. A ClientApp made by ``clusterfed.client.client_app`` from a
task's import path (``clusterfed.client_entry.app``: the built-in task) imports only flwr and
numpy and hands the message's content and Context to this long-lived process on the same
device, which imports the task once, answers with ``clusterfed.client.reply`` and sends the
reply content back. Context changes made here (``context.state``) do not travel back.

Transport: ``multiprocessing.connection`` over a Unix socket in a per-user folder (mode
0700), with its HMAC challenge on a random per-user key file (mode 0600), so only this user's
processes can use the worker. One worker per task, node config and code version (the socket
name hashes them), so a new app bundle or another SuperNode on the same machine never talks to
a stale or foreign worker. The worker serves one request at a time (a SuperNode sends one
message at a time) and exits after ``idle_seconds`` without a request.

Run by hand (normally the ClientApp starts it):
``python -m clusterfed.client_worker --socket PATH [--task package.module:name] [--idle-seconds 900]``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import socket as sockets
import sys
import threading
import time
from multiprocessing.connection import Listener
from pathlib import Path

from clusterfed.client.app import reply as task_reply
from clusterfed.client.task import load_task
from clusterfed.client.worker_link import DEFAULT_IDLE_SECONDS, WorkerError, authkey_of, worker_dir


def serve(path: Path, idle_seconds: float, task: str | None = None) -> None:
    """Answer requests until ``idle_seconds`` pass without one."""
    if task:  # import the heavy code before listening: the first request finds it loaded
        try:
            load_task(task)
        except Exception as exc:  # noqa: BLE001 - each request reports it to its ClientApp
            print(f"cannot load the client task {task}: {exc!r}", flush=True)

    authkey = authkey_of(path.parent)
    listener = Listener(str(path), family="AF_UNIX", authkey=authkey)
    # written whole, then renamed: a reader (stop_workers, the spawner) never sees it empty
    partial = path.with_suffix(f".pid.{os.getpid()}.tmp")
    partial.write_text(str(os.getpid()))
    os.replace(partial, path.with_suffix(".pid"))
    last_request = [time.monotonic()]
    busy = threading.Lock()

    def exit_when_idle() -> None:
        while True:
            time.sleep(min(idle_seconds, 5.0))
            with busy:  # never in the middle of a request
                if time.monotonic() - last_request[0] >= idle_seconds:
                    # closing the listener does not wake a blocked accept(): remove the files
                    # (the next message starts a new worker) and leave
                    for leftover in (path, path.with_suffix(".pid")):
                        with contextlib.suppress(FileNotFoundError):
                            leftover.unlink()
                    print(f"idle for {idle_seconds:.0f} s: exiting", flush=True)
                    os._exit(0)

    threading.Thread(target=exit_when_idle, daemon=True).start()
    print(f"clusterfed warm worker {os.getpid()} on {path} (exits after {idle_seconds:.0f} s idle)", flush=True)
    while True:
        try:
            connection = listener.accept()
        except Exception as exc:  # noqa: BLE001 - a failed handshake (wrong key) must not stop the worker
            print(f"refused a connection: {exc!r}", flush=True)
            continue
        with busy, connection:
            last_request[0] = time.monotonic()
            _answer(connection)
            last_request[0] = time.monotonic()


def _answer(connection) -> None:
    try:
        task, message_type, content, context = connection.recv()
    except (EOFError, OSError):
        return
    try:
        reply = ("ok", task_reply(task, message_type, content, context))
    except Exception as exc:  # noqa: BLE001 - reported to the ClientApp, which turns it into an error reply
        reply = ("error", f"{type(exc).__name__}: {exc}")
    with contextlib.suppress(OSError):
        connection.send(reply)


def _worker_of_this_user(pid: int, socket_file: Path) -> str | None:
    """None if ``pid`` is this user's clusterfed warm worker serving ``socket_file``, else
    why not (checked in ``/proc``: the process's owner and command line)."""
    proc = Path("/proc") / str(pid)
    try:
        owner = proc.stat().st_uid
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return "no such process"
    except OSError as error:
        return f"cannot inspect it ({error.strerror or error})"
    if owner != os.getuid():
        return f"it belongs to uid {owner}"
    args = [a.decode(errors="replace") for a in argv if a]
    if "clusterfed.client_worker" not in args or "--socket" not in args:
        return "it is not a clusterfed warm worker"
    served = args[args.index("--socket") + 1] if args.index("--socket") + 1 < len(args) else ""
    if Path(served).resolve() != socket_file.resolve():
        return f"it is the worker of {served}"
    return None


def _unlink(path: Path, removed: list[str]) -> None:
    try:
        path.unlink()
        removed.append(path.name)
    except FileNotFoundError:
        pass


def _socket_answers(path: Path) -> bool:
    with contextlib.closing(sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def stop_workers(directory: Path | None = None, wait_seconds: float = 10.0) -> dict[str, list]:
    """Stop this user's warm workers in ``directory`` (default: ``worker_dir()``) by their pid
    files, each only after checking in ``/proc`` that the pid is this user's clusterfed worker
    of that very socket (SIGTERM, SIGKILL after ``wait_seconds``), and remove the files of
    workers that are gone: a pid file whose pid is dead or another process, a socket nobody
    listens on, a spawn lock nobody holds. Returns ``{"stopped": [pid, ...], "removed":
    [file, ...], "left_alone": [(pid file, why), ...]}``."""
    folder = Path(directory) if directory is not None else worker_dir()
    if not Path("/proc/self/cmdline").exists():
        raise WorkerError("stopping workers needs /proc (Linux) to check which process a pid file names; "
                          "none was stopped")
    report: dict[str, list] = {"stopped": [], "removed": [], "left_alone": []}
    stopping: dict[int, Path] = {}
    for pid_file in sorted(folder.glob("w-*.pid")):
        sock = pid_file.with_suffix(".sock")
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            pid = -1
        why = _worker_of_this_user(pid, sock) if pid > 0 else "no pid in the file"
        if why is None:
            os.kill(pid, signal.SIGTERM)
            stopping[pid] = pid_file
        else:  # the worker that wrote it is gone; whatever has the pid now is left alone
            report["left_alone"].append((pid_file.name, f"pid {pid}: {why}; not signalled"))
            _unlink(pid_file, report["removed"])
    deadline = time.monotonic() + wait_seconds
    while stopping and time.monotonic() < deadline:
        for pid in [p for p in stopping if _worker_of_this_user(p, stopping[p].with_suffix(".sock")) is not None]:
            report["stopped"].append(pid)
            _unlink(stopping.pop(pid), report["removed"])
        time.sleep(0.05)
    for pid, pid_file in stopping.items():  # did not stop on SIGTERM (a long request): end it
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        report["stopped"].append(pid)
        _unlink(pid_file, report["removed"])
    for sock in sorted(folder.glob("w-*.sock")):
        if not sock.with_suffix(".pid").exists() and not _socket_answers(sock):
            _unlink(sock, report["removed"])
    for lock in sorted(folder.glob("w-*.lock")):
        if lock.with_suffix(".sock").exists():
            continue
        with open(lock, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a ClientApp is starting that worker now
            _unlink(lock, report["removed"])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clusterfed.client_worker", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--task", default=None, help="the client task's import path, package.module:name")
    parser.add_argument("--idle-seconds", type=float, default=DEFAULT_IDLE_SECONDS)
    args = parser.parse_args(argv)
    serve(args.socket, args.idle_seconds, args.task)
    return 0


if __name__ == "__main__":
    sys.exit(main())
