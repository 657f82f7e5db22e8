"""The run keeper: starts a deployed run, watches it through Flower's Control API (the `flwr`
CLI) and out-dir, and relaunches it with ``resume-from="auto"`` when Flower marks it failed or
it stalls, with backoff and a retry limit; status.json says at every moment which of
``starting | running | stalled | resuming | failed | finished`` the run is in, and why.

``clusterfed keep APP CONNECTION --run-config ...`` on a host; the ``keeper`` compose service in
containers. Nothing under ``strategies/`` or ``runner/`` imports it: it speaks to Flower from the
outside, as an operator would."""

from clusterfed.keeper.decide import PHASES, Policy, Seen, State, decide, launch_failed, launched
from clusterfed.keeper.flower import FlwrCli, LaunchError, app_config, connection_home, with_resume
from clusterfed.keeper.loop import Keeper, end_serverapp
from clusterfed.keeper.status import RoundsOnDisk, keeper_status, read_rounds

__all__ = ["PHASES", "FlwrCli", "Keeper", "LaunchError", "Policy", "RoundsOnDisk", "Seen", "State", "app_config",
           "connection_home", "decide", "end_serverapp", "keeper_status", "launch_failed", "launched",
           "read_rounds", "with_resume"]
