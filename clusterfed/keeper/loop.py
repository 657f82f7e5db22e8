"""The run keeper's loop: observe the run, ``decide``, act, and keep status.json true."""

from __future__ import annotations

import calendar
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from clusterfed.keeper.decide import LAUNCH, OVER, STOP, Policy, Seen, State, decide, launch_failed, launched
from clusterfed.keeper.flower import FLWR_TIMEOUT, LaunchError
from clusterfed.keeper.status import keeper_status, read_app_status, read_rounds, write_status

ACTIVE = ("pending", "starting", "running")  # Flower's statuses of a run that is not over
SERVERAPP_PROGRAMS = ("flwr-serverapp", "flwr-simulation")
TERM_GRACE_SECONDS = 10.0


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def end_serverapp(app: dict[str, Any], wait: Callable[[float], None] = time.sleep) -> str:
    """End the ServerApp process that wrote ``app`` (its status.json: ``pid``, ``host``) when
    it runs on this host and is one of Flower's app processes: SIGTERM, then SIGKILL. A
    ServerApp elsewhere (another container) ends by itself once Flower stopped its run (its
    next heartbeat is refused). Returns what was done, for the log."""
    pid, host = app.get("pid"), app.get("host")
    if not isinstance(pid, int) or pid == os.getpid():
        return "no ServerApp pid in status.json"
    if host != socket.gethostname():
        return f"the ServerApp (pid {pid}) runs on {host}: Flower's stop ends it"
    argv = _cmdline(pid)
    if not argv or not _running(pid):
        return f"the ServerApp (pid {pid}) is gone"
    if not any(Path(arg).name in SERVERAPP_PROGRAMS for arg in argv[:2]):
        return f"pid {pid} is no longer a ServerApp ({Path(argv[0]).name}): left alone"
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return f"ended the ServerApp (pid {pid})"
        waited = 0.0
        while waited < TERM_GRACE_SECONDS and _running(pid):
            wait(0.5)
            waited += 0.5
        if not _running(pid):
            return f"ended the ServerApp (pid {pid}) with {sig.name}"
    return f"the ServerApp (pid {pid}) did not end after SIGKILL"


class Keeper:
    """Looks after one run of ``flower`` whose out-dir is ``out``: ``flower`` launches, reads the
    status of and stops runs (``launch() -> run id``, ``status(run_id) -> (status, sub-status) |
    None``, ``stop(run_id) -> text``), as ``clusterfed.keeper.flower.FlwrCli`` does with the flwr CLI."""

    def __init__(self, flower: Any, out: Path, policy: Policy, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, log: Callable[[str], None] = print,
                 end_process: Callable[[dict[str, Any]], str] = end_serverapp):
        self.flower, self.out, self.policy = flower, Path(out), policy
        self.clock, self.wall, self.log, self.end_process = clock, wall, log, end_process
        self.state = State()
        self.launch_wall = 0.0  # wall time of the last launch: a ServerApp's status written since is its
        self.poll_seconds = 10.0  # run() sets it

    def adopt(self) -> None:
        """A keeper started again (its container restarted) takes over the run status.json
        names when Flower still runs it, instead of launching a second one."""
        run_id = read_app_status(self.out).get("run_id")
        if not isinstance(run_id, int):
            return
        answer = self.flower.status(run_id)
        if answer is not None and answer[0] in ACTIVE:
            state = launched(State(last_round=read_rounds(self.out).last), run_id, self.clock())
            self.state = replace(state, reason=f"took over run {run_id} ({answer[0]}) from an earlier keeper")
            self.log(f"keeper: {self.state.reason}")

    def step(self) -> State:
        app, rounds = read_app_status(self.out), read_rounds(self.out)
        answer = self.flower.status(self.state.run_id) if self.state.run_id is not None else None
        failed = app.get("status") == "failed"
        error = str(app.get("error", "")) if failed else ""
        if app.get("status") == "running" and _gone_from_this_host(app):  # killed: it wrote nothing more
            failed, error = True, f"its process (pid {app['pid']}) is gone, its last word was running"
        seen = Seen(now=self.clock(), flower=answer[0] if answer else None, details=answer[1] if answer else "",
                    last_round=rounds.last, app_error=error,
                    app_failed=failed and _stamp(app.get("updated")) >= self.launch_wall)
        before = self.state
        state, actions = decide(self.policy, before, seen)
        if STOP in actions and before.run_id is not None:
            state = self._stop(state, before.run_id, seen, app)
        if LAUNCH in actions:
            try:
                self.launch_wall = int(self.wall())  # status.json's stamps have whole seconds
                state = launched(state, self.flower.launch(), self.clock())
            except LaunchError as error:
                state = launch_failed(self.policy, state, self.clock(), str(error))
        self.state = state
        if (state.phase, state.reason) != (before.phase, before.reason):
            self.log(f"keeper: {state.phase}" + (f": {state.reason}" if state.reason else ""))
        # the ServerApp's own heartbeat (running, then ok or failed) is the truth while Flower runs it;
        # a `failed` from before this launch is not. Read again: it may have written while Flower answered
        app = read_app_status(self.out)
        fresh_failure = app.get("status") == "failed" and _stamp(app.get("updated")) >= self.launch_wall
        if state.phase != "running" or not (app.get("status") in ("running", "ok") or fresh_failure):
            write_status(self.out, keeper_status(self.policy, state, seen, app, read_rounds(self.out), self.wall(),
                                                 stale_seconds=self.stale_seconds()))
        return state

    def stale_seconds(self) -> float:
        """The longest between two of the keeper's writes: a poll, then one step's three `flwr`
        calls (status, stop, launch) at their timeout and the old ServerApp's two signals' grace."""
        return self.poll_seconds + 3 * FLWR_TIMEOUT + 2 * TERM_GRACE_SECONDS

    def _stop(self, state: State, run_id: int, seen: Seen, app: dict[str, Any]) -> State:
        if seen.flower in ACTIVE or seen.flower is None:
            self.log(f"keeper: stopping run {run_id}: {self.flower.stop(run_id)}")
        self.log(f"keeper: {self.end_process(app)}")
        return state

    def run(self, poll_seconds: float, sleep: Callable[[float], None] = time.sleep) -> int:
        """Until the run finished (0) or the keeper gave up (1). Between looks at Flower it
        watches status.json every second and looks again at once when the ServerApp wrote it."""
        self.poll_seconds = poll_seconds
        self.adopt()
        while self.step().phase not in OVER:
            seen = _mtime(self.out / "status.json")
            waited = 0.0
            while waited < poll_seconds and _mtime(self.out / "status.json") == seen:
                sleep(min(1.0, poll_seconds - waited))
                waited += 1.0
        return 0 if self.state.phase == "finished" else 1


def _gone_from_this_host(app: dict[str, Any]) -> bool:
    """The ServerApp that wrote ``app`` ran on this host and its process no longer runs."""
    pid = app.get("pid")
    return isinstance(pid, int) and app.get("host") == socket.gethostname() and not _running(pid)


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _stamp(text: object) -> float:
    """status.json's "2026-11-27T18:12:40Z" as seconds since the epoch (0 when unreadable)."""
    try:
        return calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return 0.0
