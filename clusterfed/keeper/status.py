"""What the keeper reads from out-dir (rounds.jsonl, the ServerApp's status.json) and the
status.json it writes in the ServerApp's place."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterfed.keeper.decide import Policy, Seen, State


@dataclass(frozen=True)
class RoundsOnDisk:
    """rounds.jsonl as the keeper sees it: the round numbers in file order and the last row."""

    rounds: tuple[int, ...] = ()
    last_row: dict[str, Any] = field(default_factory=dict)

    @property
    def last(self) -> int:
        return max(self.rounds, default=0)

    @property
    def duplicates(self) -> list[int]:
        return sorted({r for r in self.rounds if self.rounds.count(r) > 1})


def read_rounds(out: Path) -> RoundsOnDisk:
    """A line being written (no newline yet, or cut by a crash) is not a round."""
    try:
        text = (out / "rounds.jsonl").read_text()
    except OSError:
        return RoundsOnDisk()
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    rows = [row for row in rows if isinstance(row, dict) and isinstance(row.get("round"), int)]
    return RoundsOnDisk(tuple(row["round"] for row in rows), rows[-1] if rows else {})


def read_app_status(out: Path) -> dict[str, Any]:
    try:
        status = json.loads((out / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def _devices(app: dict[str, Any], rounds: RoundsOnDisk) -> dict[str, list]:
    """The devices absent and failing: the ServerApp's own list where it wrote one, else the
    last recorded round's (its ``absent`` and ``failed`` entries, each naming the device and why)."""
    row = rounds.last_row
    absent = app.get("absent") if isinstance(app.get("absent"), list) else row.get("absent", [])
    failing = app.get("failing") if isinstance(app.get("failing"), list) else [
        {key: entry.get(key) for key in ("client", "node", "kind", "reason")} for entry in row.get("failed", [])]
    return {"absent": absent, "failing": failing}


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def keeper_status(policy: Policy, state: State, seen: Seen, app: dict[str, Any], rounds: RoundsOnDisk,
                  wall_time: float, stale_seconds: float | None = None) -> dict[str, Any]:
    """status.json as the keeper writes it: its phase and reason, the round reached, the
    devices absent or failing, Flower's view, and the ServerApp's last word (``serverapp``).
    Unless the run is over, ``stale_after``: ``stale_seconds`` past now, the longest the keeper
    takes to write again; a reader past that time knows nobody keeps the file."""
    stamp = _stamp(wall_time)
    first = state.last_round == state.round_at_launch
    body: dict[str, Any] = {
        "status": state.phase, "reason": state.reason, "time": stamp, "updated": stamp,
        "round": rounds.last, "rounds": policy.rounds, "rounds_recorded": len(set(rounds.rounds)),
        "duplicate_rounds": rounds.duplicates, "run_id": state.runs[-1] if state.runs else None,
        **_devices(app, rounds),
        "keeper": {
            "pid": os.getpid(), "host": socket.gethostname(), "runs": list(state.runs),
            "relaunches": state.relaunches, "retries": state.retries, "max_retries": policy.max_retries,
            "flower": seen.flower if seen.flower is not None else "no answer from the SuperLink",
            "flower_details": seen.details,
            "stall_bound_seconds": policy.stall_seconds(first),
            "seconds_since_progress": (round(seen.now - max(state.progress_at or 0.0, state.launched_at or 0.0))
                                       if state.launched_at is not None else None),
        },
    }
    if stale_seconds is not None and state.phase not in ("failed", "finished"):
        body["stale_after"] = _stamp(wall_time + stale_seconds)
    if state.run_id is None and state.phase not in ("failed", "finished"):
        body["keeper"]["next_launch_in_seconds"] = max(0, round(state.launch_at - seen.now))
    if app and "keeper" not in app:  # the ServerApp's own word, not the keeper's previous one
        body["serverapp"] = {key: app[key] for key in ("status", "error", "ended", "pid", "host", "updated",
                                                       "stale_after", "note")
                             if key in app}
    elif "serverapp" in app:
        body["serverapp"] = app["serverapp"]
    if state.phase == "finished" and "ended" in app:
        body["ended"] = app["ended"]
    return body


def write_status(out: Path, body: dict[str, Any]) -> None:
    """Atomically (beside, then renamed), as the ServerApp writes it."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "status.json.keeper.tmp"
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    tmp.replace(out / "status.json")
