"""The run keeper's decisions (``clusterfed.keeper``), without containers or a SuperLink: a
fake Flower (the Control API's answers, scripted) and a fake clock. The loopback check with a
real SuperLink killed mid-run is ``benchmarks/bench_keeper_loopback.py``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from clusterfed.keeper import (Keeper, LaunchError, Policy, Seen, State, app_config, decide, end_serverapp,
                               launch_failed, launched, read_rounds, with_resume)
from clusterfed.keeper.decide import LAUNCH, STOP

ROOT = Path(__file__).resolve().parents[1]
POLICY = Policy(rounds=5, round_timeout=30.0, wait_timeout=60.0, stall_multiple=4.0, start_timeout=100.0,
                backoff=10.0, backoff_max=40.0, max_retries=3)


def running(now=0.0, last_round=0) -> State:
    """A run Flower is running, launched at ``now``."""
    state = launched(State(last_round=last_round), 7, now)
    state, _ = decide(POLICY, state, Seen(now=now, flower="running", last_round=last_round))
    return state


def test_a_first_decision_launches_and_the_launch_is_starting():
    state, actions = decide(POLICY, State(), Seen(now=0.0))
    assert actions == (LAUNCH,) and state.phase == "starting"
    state = launched(state, 7, 0.0)
    assert (state.phase, state.run_id, state.runs) == ("starting", 7, (7,))
    state, actions = decide(POLICY, state, Seen(now=5.0, flower="pending"))
    assert actions == () and state.phase == "starting"
    state, actions = decide(POLICY, state, Seen(now=6.0, flower="running"))
    assert actions == () and state.phase == "running"


def test_a_run_flower_marked_failed_is_stopped_and_relaunched_after_the_backoff():
    state = running(last_round=2)
    state, actions = decide(POLICY, state, Seen(now=50.0, flower="finished:failed",
                                                details="No heartbeat received from the task", last_round=2,
                                                app_error="stopped: KeyboardInterrupt"))
    assert actions == (STOP,) and state.phase == "resuming" and state.run_id is None
    assert "finished:failed" in state.reason and "No heartbeat" in state.reason and "KeyboardInterrupt" in state.reason
    # nothing before the backoff is over, then one launch
    assert decide(POLICY, state, Seen(now=59.0, last_round=2))[1] == ()
    state, actions = decide(POLICY, state, Seen(now=60.0, last_round=2))
    assert actions == (LAUNCH,)
    state = launched(state, 8, 60.0)
    assert (state.phase, state.runs, state.relaunches) == ("resuming", (7, 8), 1)
    state, _ = decide(POLICY, state, Seen(now=70.0, flower="running", last_round=2))
    assert state.phase == "running" and "resumed as run 8" in state.reason


def test_no_round_for_the_stated_multiple_of_the_timeout_is_a_stall_that_is_stopped_and_relaunched():
    state = running(now=0.0, last_round=0)
    state, _ = decide(POLICY, state, Seen(now=100.0, flower="running", last_round=1))  # round 1 at 100 s
    # the bound after a round is 4 x 30 s; before the first round of a launch wait-timeout more
    assert decide(POLICY, state, Seen(now=220.0, flower="running", last_round=1))[0].phase == "running"
    state, actions = decide(POLICY, state, Seen(now=221.0, flower="running", last_round=1))
    assert actions == (STOP,) and state.phase == "stalled" and state.run_id is None
    assert "no new round for 121 s" in state.reason and "round 2 not recorded" in state.reason
    state, actions = decide(POLICY, state, Seen(now=231.0, last_round=1))
    assert actions == (LAUNCH,)


def test_the_first_round_of_a_launch_also_gets_the_wait_timeout():
    state = running(now=0.0)
    assert decide(POLICY, state, Seen(now=180.0, flower="running"))[0].phase == "running"
    state, actions = decide(POLICY, state, Seen(now=181.0, flower="running"))
    assert actions == (STOP,) and state.phase == "stalled" and "wait-timeout" in state.reason


def test_a_run_flower_never_starts_is_stalled_after_the_start_timeout():
    state = launched(State(), 7, 0.0)
    assert decide(POLICY, state, Seen(now=100.0, flower="starting"))[0].phase == "starting"
    state, actions = decide(POLICY, state, Seen(now=101.0, flower="starting"))
    assert actions == (STOP,) and state.phase == "stalled" and "did not start within 100 s" in state.reason


def test_a_superlink_that_does_not_answer_is_no_failure_until_the_stall_bound():
    state = running(now=0.0, last_round=1)
    state, actions = decide(POLICY, state, Seen(now=30.0, flower=None, last_round=1))
    assert actions == () and state.phase == "running" and state.unreachable_since == 30.0
    state, actions = decide(POLICY, state, Seen(now=500.0, flower=None, last_round=1))
    assert actions == (STOP,) and state.phase == "stalled" and "SuperLink does not answer" in state.reason


def test_backoff_doubles_up_to_its_maximum_and_the_retry_limit_ends_in_failed_with_the_reason():
    state, waits = running(), []
    for attempt in range(POLICY.max_retries):
        now = 1000.0 * (attempt + 1)
        state, actions = decide(POLICY, state, Seen(now=now, flower="finished:failed", details=f"boom {attempt}"))
        assert actions == (STOP,) and state.phase == "resuming"
        waits.append(state.launch_at - now)
        state = launched(state, 10 + attempt, state.launch_at)
    assert waits == [10.0, 20.0, 40.0]
    state, actions = decide(POLICY, state, Seen(now=9000.0, flower="finished:failed", details="boom again"))
    assert actions == (STOP,) and state.phase == "failed"
    assert state.reason.startswith("gave up after 3 relaunches without a new round") and "boom again" in state.reason
    # over: nothing more happens
    assert decide(POLICY, state, Seen(now=99999.0)) == (state, ())


def test_a_new_round_resets_the_retry_count():
    state = running()
    state, _ = decide(POLICY, state, Seen(now=10.0, flower="finished:failed"))
    state = launched(state, 8, 20.0)
    state, _ = decide(POLICY, state, Seen(now=30.0, flower="finished:failed"))
    assert state.retries == 2
    state = launched(state, 9, 50.0)
    state, _ = decide(POLICY, state, Seen(now=60.0, flower="running", last_round=1))
    assert state.retries == 0 and state.last_round == 1


def test_a_failed_launch_is_retried_with_backoff_and_counts_toward_the_limit():
    state = launch_failed(POLICY, State(), 0.0, "Connection to the SuperLink is unavailable")
    assert state.phase == "starting" and state.launch_at == 10.0 and "unavailable" in state.reason
    for _ in range(POLICY.max_retries):
        state = launch_failed(POLICY, state, 0.0, "still down")
    assert state.phase == "failed" and "flwr run failed: still down" in state.reason


def test_finished_only_when_flower_completed_it_with_every_round_recorded():
    state = running(last_round=5)
    state, actions = decide(POLICY, state, Seen(now=10.0, flower="finished:completed", last_round=5))
    assert state.phase == "finished" and actions == () and state.reason == "completed all 5 rounds"
    short, actions = decide(POLICY, running(last_round=3), Seen(now=10.0, flower="finished:completed", last_round=3))
    assert short.phase == "resuming" and actions == (STOP,) and "3 of 5 rounds" in short.reason


def test_run_config_parsing_and_resume_from_auto():
    assert with_resume('rounds=3 out-dir="x"') == 'rounds=3 out-dir="x" resume-from="auto"'
    assert with_resume('resume-from="auto" rounds=3') == 'resume-from="auto" rounds=3'
    config = app_config(ROOT, 'rounds=7 timeout=12.5 out-dir="results/k"')
    assert (config["rounds"], config["timeout"], config["out-dir"]) == (7, 12.5, "results/k")
    assert config["wait-timeout"] == 300.0 and config["fedclust.cluster-epochs"] > 0  # the app's defaults


class FakeFlower:
    """Flower's answers, set by the test; records what the keeper asked."""

    def __init__(self):
        self.next_run_id = 100
        self.statuses: dict[int, tuple[str, str]] = {}
        self.launches: list[int] = []
        self.stops: list[int] = []
        self.unreachable = False

    def launch(self) -> int:
        if self.unreachable:
            raise LaunchError("Connection to the SuperLink is unavailable")
        self.next_run_id += 1
        self.launches.append(self.next_run_id)
        self.statuses[self.next_run_id] = ("pending", "")
        return self.next_run_id

    def status(self, run_id):
        return None if self.unreachable else self.statuses.get(run_id)

    def stop(self, run_id):
        self.stops.append(run_id)
        self.statuses[run_id] = ("finished:stopped", "")
        return "stopped"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _round(out: Path, number: int) -> None:
    with (out / "rounds.jsonl").open("a") as rows:
        rows.write(json.dumps({"round": number, "accuracy": 0.5,
                               "failed": [{"client": "device-3", "node": 9, "kind": "error", "reason": "bad data"}]})
                   + "\n")


def _app_status(out: Path, status: str, **extra) -> None:
    (out / "status.json").write_text(json.dumps({"status": status, "pid": 12, "host": "elsewhere", **extra}))


def _status(out: Path) -> dict:
    return json.loads((out / "status.json").read_text())


@pytest.fixture
def keeper(tmp_path):
    flower, clock, ended = FakeFlower(), Clock(), []
    keeper = Keeper(flower, tmp_path, POLICY, clock=clock, wall=lambda: 1.8e9, log=lambda line: None,
                    end_process=lambda app: ended.append(app.get("pid")) or "ended")
    return keeper, flower, clock, ended, tmp_path


def test_the_keeper_resumes_a_run_that_died_and_status_json_tells_the_truth_at_each_step(keeper):
    keeper, flower, clock, ended, out = keeper
    assert keeper.step().phase == "starting" and flower.launches == [101]
    assert _status(out)["status"] == "starting" and _status(out)["run_id"] == 101
    flower.statuses[101] = ("running", "")
    _app_status(out, "running")  # the ServerApp's heartbeat: the keeper leaves it
    clock.now = 10.0
    assert keeper.step().phase == "running" and _status(out) == {"status": "running", "pid": 12, "host": "elsewhere"}
    _round(out, 1)
    _round(out, 2)
    # the SuperLink is killed: Flower marks the run failed once it is back, the ServerApp wrote nothing more
    flower.statuses[101] = ("finished:failed", "No heartbeat received from the task")
    clock.now = 100.0
    assert keeper.step().phase == "resuming"
    assert flower.stops == [] and ended == [12]  # Flower stopped it already; its process is ended
    status = _status(out)
    assert status["status"] == "resuming" and "No heartbeat" in status["reason"]
    assert (status["round"], status["rounds_recorded"], status["duplicate_rounds"]) == (2, 2, [])
    assert status["failing"] == [{"client": "device-3", "node": 9, "kind": "error", "reason": "bad data"}]
    assert status["serverapp"] == {"status": "running", "pid": 12, "host": "elsewhere"}
    assert status["keeper"]["next_launch_in_seconds"] == 10
    clock.now = 110.0
    assert keeper.step().phase == "resuming" and flower.launches == [101, 102]
    assert _status(out)["keeper"]["runs"] == [101, 102]
    # the ServerApp's last word is kept, not replaced by the keeper's own previous status
    assert _status(out)["serverapp"] == {"status": "running", "pid": 12, "host": "elsewhere"}
    flower.statuses[102] = ("running", "")
    _app_status(out, "running")
    for number in (3, 4, 5):
        _round(out, number)
    clock.now = 120.0
    assert keeper.step().phase == "running"
    _app_status(out, "ok", ended="completed all 5 rounds")
    flower.statuses[102] = ("finished:completed", "")
    clock.now = 130.0
    assert keeper.step().phase == "finished"
    status = _status(out)
    assert status["status"] == "finished" and status["ended"] == "completed all 5 rounds"
    assert status["rounds_recorded"] == 5 and status["duplicate_rounds"] == []


def test_the_keeper_stops_a_stalled_run_through_flower_before_relaunching(keeper):
    keeper, flower, clock, ended, out = keeper
    keeper.step()
    flower.statuses[101] = ("running", "")
    clock.now = 1.0
    keeper.step()
    clock.now = 1.0 + POLICY.stall_seconds(True) + 1
    assert keeper.step().phase == "stalled" and flower.stops == [101]
    assert _status(out)["status"] == "stalled" and "no new round" in _status(out)["reason"]
    clock.now += POLICY.backoff
    assert keeper.step().phase == "resuming" and flower.launches == [101, 102]


def test_the_keeper_writes_failed_with_the_reason_when_the_superlink_never_comes_back(keeper):
    keeper, flower, clock, ended, out = keeper
    flower.unreachable = True
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        clock.now += max(seconds, keeper.state.launch_at - clock.now)

    assert keeper.run(poll_seconds=5.0, sleep=sleep) == 1
    status = _status(out)
    assert status["status"] == "failed" and "gave up after 3 relaunches" in status["reason"]
    assert "Connection to the SuperLink is unavailable" in status["reason"] and flower.launches == []


def test_a_restarted_keeper_takes_over_the_run_flower_still_runs(keeper):
    keeper, flower, clock, ended, out = keeper
    _round(out, 1)
    (out / "status.json").write_text(json.dumps({"status": "running", "run_id": 55}))
    flower.statuses[55] = ("running", "")
    keeper.adopt()
    assert keeper.state.run_id == 55 and "took over run 55" in keeper.state.reason
    assert keeper.step().phase == "running" and flower.launches == []


def test_status_on_disk_ignores_a_half_written_line_and_counts_duplicates(tmp_path):
    (tmp_path / "rounds.jsonl").write_text('{"round": 1}\n{"round": 2}\n{"round": 2}\n{"round": 3, "acc')
    rounds = read_rounds(tmp_path)
    assert rounds.rounds == (1, 2, 2) and rounds.last == 2 and rounds.duplicates == [2]


def _spawn(tmp_path: Path, name: str) -> subprocess.Popen:
    program = tmp_path / name
    program.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    program.chmod(0o755)
    return subprocess.Popen([str(program)])


def test_end_serverapp_ends_only_a_flower_app_process_on_this_host(tmp_path):
    app = _spawn(tmp_path, "flwr-serverapp")
    other = _spawn(tmp_path, "something-else")
    try:
        host = socket.gethostname()
        for _ in range(100):  # the interpreter has replaced the exec'd name in /proc only once started
            if "flwr-serverapp" in Path(f"/proc/{app.pid}/cmdline").read_bytes().decode(errors="replace"):
                break
            time.sleep(0.05)
        assert "left alone" in end_serverapp({"pid": other.pid, "host": host})
        assert "runs on elsewhere" in end_serverapp({"pid": app.pid, "host": "elsewhere"})
        assert other.poll() is None and app.poll() is None
        assert "SIGTERM" in end_serverapp({"pid": app.pid, "host": host}, wait=lambda s: app.poll() or time.sleep(s))
        assert app.wait(timeout=10) == -signal.SIGTERM
        assert "gone" in end_serverapp({"pid": app.pid, "host": host})
    finally:
        for process in (app, other):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()


def test_the_keeper_command_is_wired_into_the_cli():
    from clusterfed.cli import build_parser

    args = build_parser().parse_args(["keep", ".", "lab", "--run-config", "rounds=2", "--max-retries", "2"])
    assert args.func.__name__ == "cmd_keep" and args.max_retries == 2 and args.connection == "lab"


def test_the_policy_states_its_bounds():
    assert POLICY.stall_seconds(False) == 120.0 and POLICY.stall_seconds(True) == 180.0
    assert [POLICY.backoff_seconds(n) for n in (1, 2, 3, 4, 5)] == [10.0, 20.0, 40.0, 40.0, 40.0]
    assert replace(POLICY, stall_multiple=2.0).stall_seconds(False) == 60.0


def test_the_audit_flags_a_status_that_says_running_while_no_round_comes():
    from clusterfed.keeper.audit import audit

    def sample(t, status, round_, serverapps=1):
        return {"t": t, "status": status, "round": round_, "serverapps": serverapps}

    truthful = [sample(0, "starting", 0), sample(10, "running", 1), sample(50, "resuming", 1, 0),
                sample(60, "resuming", 1, 2), sample(90, "running", 2), sample(100, "finished", 3)]
    checks = audit(truthful, POLICY, poll=5.0, kill_at=40.0)
    assert checks["running_beyond_the_stall_bound"] == 0 and checks["left_running_after_the_kill"]
    assert checks["most_serverapps_alive_at_once"] == 2
    assert checks["statuses_seen"] == ["starting", "running", "resuming", "finished"]
    frozen = [sample(0, "running", 1), sample(100, "running", 1), sample(200, "running", 1), sample(300, "running", 2)]
    checks = audit(frozen, POLICY, poll=5.0, kill_at=50.0)  # the bound here is 180 + 5 + 2 s
    assert checks["running_beyond_the_stall_bound"] == 1 and not checks["left_running_after_the_kill"]


def test_a_serverapp_that_wrote_failed_is_relaunched_without_waiting_for_flower():
    state, actions = decide(POLICY, running(last_round=2), Seen(now=20.0, flower="running", last_round=2,
                                                                 app_error="stopped: SystemExit: 0", app_failed=True))
    assert actions == (STOP,) and state.phase == "resuming" and "stopped: SystemExit: 0" in state.reason
    # before Flower ran the launch, a `failed` in status.json is not this run's
    state, actions = decide(POLICY, launched(State(), 7, 0.0), Seen(now=5.0, flower="pending", app_failed=True))
    assert actions == () and state.phase == "starting"


def test_the_keeper_takes_only_a_failed_written_since_its_launch_as_the_runs(keeper):
    keeper, flower, clock, ended, out = keeper
    _app_status(out, "failed", error="from an earlier run", updated="2020-01-01T00:00:00Z")
    keeper.step()
    flower.statuses[101] = ("running", "")
    clock.now = 10.0
    assert keeper.step().phase == "running" and _status(out)["status"] == "running"  # the old `failed` replaced
    _app_status(out, "failed", error="stopped: SystemExit: 0", updated="2027-01-15T08:00:00Z")  # after wall()
    clock.now = 20.0
    state = keeper.step()
    assert state.phase == "resuming" and flower.stops == [101] and "SystemExit" in _status(out)["reason"]


def test_a_serverapp_killed_on_this_host_is_seen_gone_while_status_json_still_says_running(keeper):
    keeper, flower, clock, ended, out = keeper
    keeper.step()
    flower.statuses[101] = ("running", "")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid runs nothing now
    _app_status(out, "running", pid=gone.pid, host=socket.gethostname(), updated="2027-01-15T08:00:00Z")
    clock.now = 10.0
    state = keeper.step()
    assert state.phase == "resuming" and f"pid {gone.pid}) is gone" in state.reason
    assert _status(out)["status"] == "resuming"


def _stamp(text: str) -> float:
    import calendar
    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))


def test_every_status_the_keeper_writes_says_when_it_is_stale_unless_the_run_is_over(keeper):
    keeper, flower, clock, ended, out = keeper
    keeper.step()
    status = _status(out)
    assert status["status"] == "starting"
    assert _stamp(status["stale_after"]) - _stamp(status["updated"]) == keeper.stale_seconds()
    assert keeper.stale_seconds() > keeper.poll_seconds  # a poll and the slowest step in between
    flower.statuses[101] = ("finished:failed", "No heartbeat received from the task")
    clock.now = 10.0
    keeper.step()
    assert _status(out)["status"] == "resuming" and "stale_after" in _status(out)
    for number in range(1, 6):
        _round(out, number)
    clock.now = 20.0
    keeper.step()  # the relaunch
    flower.statuses[102] = ("finished:completed", "")
    clock.now = 30.0
    assert keeper.step().phase == "finished" and "stale_after" not in _status(out)


def test_the_serverapps_running_says_when_it_is_stale_the_first_round_of_a_launch_waiting_longer(tmp_path):
    from clusterfed.config import parse_config
    from clusterfed.server_app import RunStatus, stale_bounds

    config = parse_config({"timeout": 30.0, "probe-timeout": 90.0, "wait-timeout": 60.0})
    first, later = stale_bounds(config)
    assert later == POLICY.stall_seconds(False)  # the keeper's stall bound with its default multiple
    assert first == 3 * 30.0 + 90.0 + 60.0  # one exchange is the first profile probe, then the wait for devices
    status = RunStatus(tmp_path)
    status.bounds = (first, later)
    status.start()
    body = json.loads((tmp_path / "status.json").read_text())
    assert _stamp(body["stale_after"]) - _stamp(body["updated"]) == first
    status.heartbeat({"round": 1})
    body = json.loads((tmp_path / "status.json").read_text())
    assert body["status"] == "running" and _stamp(body["stale_after"]) - _stamp(body["updated"]) == later
    status.write("ok")
    assert "stale_after" not in json.loads((tmp_path / "status.json").read_text())
