"""Did status.json tell the truth? Checks over samples of it taken while a run was broken on
purpose (benchmarks/bench_keeper_loopback.py, the container soak). A sample is a dict with
``t`` (seconds), ``status`` (status.json's), ``round`` (the last in rounds.jsonl) and
``serverapps`` (live ServerApp processes of the federation)."""

from __future__ import annotations

from typing import Any

from clusterfed.keeper.decide import Policy


def audit(samples: list[dict[str, Any]], policy: Policy, poll: float, kill_at: float) -> dict[str, Any]:
    """``running`` never shown longer than the stall bound (plus a poll and a little slack) after
    the last new round; after ``kill_at`` (the first crash) the status left ``running`` before
    the next round came; the most ServerApps alive at once; the statuses in the order seen."""
    bound = policy.stall_seconds(True) + poll + 2.0
    last_round_at, last_round, lies = samples[0]["t"] if samples else 0.0, 0, 0
    for sample in samples:
        if sample["round"] > last_round:
            last_round, last_round_at = sample["round"], sample["t"]
        if sample["status"] == "running" and sample["t"] - last_round_at > bound:
            lies += 1
    after = [s for s in samples if s["t"] >= kill_at]
    next_round = next((s for s in after if s["round"] > after[0]["round"]), None) if after else None
    left = next((s for s in after if s["status"] in ("stalled", "resuming")), None)
    return {
        "running_beyond_the_stall_bound": lies,
        "left_running_after_the_kill": left is not None and (next_round is None or left["t"] <= next_round["t"]),
        "first_status_after_the_kill_that_is_not_running": left,
        "most_serverapps_alive_at_once": max((s["serverapps"] for s in samples), default=0),
        "statuses_seen": list(dict.fromkeys(s["status"] for s in samples)),
    }
