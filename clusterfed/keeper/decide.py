"""The run keeper's decisions: pure functions of what it saw and when it saw it.

No I/O and no clock here: ``decide`` takes the keeper's state, its policy and one
observation (Flower's status of the run, the rounds on disk, the time) and returns the next
state and what to do. ``clusterfed.keeper.loop`` observes, calls it and does the actions.

The phases are the ``status`` that ``status.json`` shows while the keeper looks after a run:

- ``starting``: the first ``flwr run`` is launched (or about to be); Flower has not run it yet;
- ``running``: Flower runs it and rounds arrive within the stall bound;
- ``stalled``: no round within the bound (or Flower never started the run): the run is
  stopped and relaunched after the backoff;
- ``resuming``: the run died (Flower marked it failed or stopped) or stalled; it is
  relaunched with ``resume-from="auto"`` and continues from out-dir's checkpoint;
- ``failed``: ``max_retries`` relaunches in a row brought no new round (the reason says the last
  failure);
- ``finished``: Flower completed the run and every round is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

PHASES = ("starting", "running", "stalled", "resuming", "failed", "finished")
OVER = ("failed", "finished")

# what the loop is asked to do
LAUNCH = "launch"  # `flwr run` with resume-from="auto"; the loop then calls launched() or launch_failed()
STOP = "stop"  # stop the current run (Flower's Control API) and end its ServerApp process


@dataclass(frozen=True)
class Policy:
    """When a run counts as stalled, and how often it is relaunched."""

    rounds: int  # the rounds the run is asked for
    round_timeout: float  # the run config's `timeout`: seconds one exchange of a round may wait for replies
    wait_timeout: float = 300.0  # the run config's `wait-timeout`: seconds a ServerApp waits for min-clients
    stall_multiple: float = 4.0  # a round may take this many `timeout`s (FedClust's first has four exchanges)
    start_timeout: float = 300.0  # seconds Flower may take to start a launched run
    backoff: float = 10.0  # seconds before the first relaunch; doubled for each further one in a row
    backoff_max: float = 300.0
    max_retries: int = 5  # relaunches in a row without a new round before the keeper gives up

    def stall_seconds(self, first_round: bool) -> float:
        """No new round for this long means stalled; a (re)started run first waits for its
        devices (`wait-timeout`)."""
        return self.stall_multiple * self.round_timeout + (self.wait_timeout if first_round else 0.0)

    def backoff_seconds(self, retries: int) -> float:
        return min(self.backoff * 2 ** max(retries - 1, 0), self.backoff_max)


@dataclass(frozen=True)
class Seen:
    """One observation of the run."""

    now: float  # the keeper's clock, seconds
    flower: str | None = None  # Flower's status of the run (`flwr ls`): pending, starting, running,
    # finished:completed|failed|stopped; None when the SuperLink did not answer
    details: str = ""  # Flower's status details ("No heartbeat received from the task")
    last_round: int = 0  # the highest round in out-dir's rounds.jsonl
    app_error: str = ""  # the `error` the ServerApp wrote in status.json, if it wrote one
    app_failed: bool = False  # the current run's ServerApp wrote `failed`, or its process on this host is gone


@dataclass(frozen=True)
class State:
    phase: str = "starting"
    reason: str = ""
    run_id: int | None = None  # the run launched last; None while a (re)launch is due
    runs: tuple[int, ...] = ()  # every run id launched, in order
    launched_at: float | None = None
    running_since: float | None = None  # when Flower was first seen running the current run
    progress_at: float | None = None  # when last_round last grew
    last_round: int = 0
    round_at_launch: int = 0
    retries: int = 0  # relaunches since the last new round
    relaunches: int = 0  # all relaunches
    launch_at: float = 0.0  # the next launch is not before this
    unreachable_since: float | None = None  # the SuperLink has not answered since


def _give_up_or_retry(policy: Policy, state: State, now: float, phase: str, why: str) -> State:
    """The current run is over without finishing: relaunch after the backoff, or give up."""
    retries = state.retries + 1
    if retries > policy.max_retries:
        return replace(state, phase="failed", run_id=None, retries=retries,
                       reason=f"gave up after {policy.max_retries} relaunches without a new round; last: {why}")
    wait = policy.backoff_seconds(retries)
    return replace(state, phase=phase, run_id=None, retries=retries, launch_at=now + wait, running_since=None,
                   reason=f"{why}; relaunch {retries} of {policy.max_retries} in {wait:g} s (resume-from=\"auto\")")


def _stalled_for(policy: Policy, state: State, now: float) -> str:
    """Why the current run counts as stalled, or "" when it does not."""
    if state.running_since is None:  # Flower has not started it (or the SuperLink does not answer)
        since = state.launched_at if state.launched_at is not None else now
        if now - since > policy.start_timeout:
            return f"run {state.run_id} did not start within {policy.start_timeout:g} s"
        return ""
    first = state.last_round == state.round_at_launch
    since = max(state.running_since, state.progress_at or 0.0)
    bound = policy.stall_seconds(first)
    if now - since > bound:
        what = f"round {state.last_round + 1}" if state.last_round < policy.rounds else "the run's end"
        return (f"no new round for {now - since:.0f} s ({what} not recorded; the bound is "
                f"{policy.stall_multiple:g} x timeout{' + wait-timeout' if first else ''} = {bound:g} s)")
    return ""


def decide(policy: Policy, state: State, seen: Seen) -> tuple[State, tuple[str, ...]]:
    """The next state and the actions, from one observation."""
    if state.phase in OVER:
        return state, ()
    now = seen.now
    if seen.last_round > state.last_round:  # progress: the retry count starts again
        state = replace(state, last_round=seen.last_round, progress_at=now, retries=0)
    if state.run_id is None:
        return state, ((LAUNCH,) if now >= state.launch_at else ())
    flower = seen.flower
    state = replace(state, unreachable_since=None if flower is not None else (state.unreachable_since or now))
    if flower == "finished:completed":
        if state.last_round >= policy.rounds:
            return replace(state, phase="finished", reason=f"completed all {policy.rounds} rounds"), ()
        why = f"Flower completed run {state.run_id} with {state.last_round} of {policy.rounds} rounds recorded"
        return _give_up_or_retry(policy, state, now, "resuming", why), (STOP,)
    if flower is not None and flower.startswith("finished"):
        why = f"Flower marked run {state.run_id} {flower}"
        if seen.details:
            why += f" ({seen.details})"
        if seen.app_error:
            why += f"; the ServerApp said: {seen.app_error}"
        return _give_up_or_retry(policy, state, now, "resuming", why), (STOP,)
    if flower == "running" and state.running_since is None:
        state = replace(state, running_since=now, phase="running",
                        reason="" if state.relaunches == 0 else f"resumed as run {state.run_id}")
    if seen.app_failed and state.running_since is not None:  # dead before Flower says so: no need to wait
        why = f"the ServerApp of run {state.run_id} stopped: {seen.app_error or 'failed'}"
        return _give_up_or_retry(policy, state, now, "resuming", why), (STOP,)
    stalled = _stalled_for(policy, state, now)
    if stalled:
        if flower is None:
            stalled += "; the SuperLink does not answer"
        return _give_up_or_retry(policy, state, now, "stalled", stalled), (STOP,)
    return state, ()


def launched(state: State, run_id: int, now: float) -> State:
    """``flwr run`` answered with a run id."""
    again = bool(state.runs)
    return replace(state, run_id=run_id, runs=(*state.runs, run_id), launched_at=now, running_since=None,
                   round_at_launch=state.last_round, relaunches=state.relaunches + again,
                   phase="resuming" if again else "starting",
                   reason=(f"relaunched as run {run_id} after: {state.reason}" if again
                           else f"launched run {run_id}"))


def launch_failed(policy: Policy, state: State, now: float, error: str) -> State:
    """``flwr run`` did not give a run id (the SuperLink down, say): try again later."""
    phase = "resuming" if state.runs else "starting"
    return _give_up_or_retry(policy, state, now, phase, f"flwr run failed: {error}")
