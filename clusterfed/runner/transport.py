"""Push messages to a Flower Grid and collect their replies within a timeout."""

from __future__ import annotations

import os
import time

from flwr.app import Message
from flwr.serverapp import Grid

# Flower's deployed grid polls the SuperLink every 3 s in send_and_receive; its in-memory
# (simulation) grid every 0.1 s (``pull_interval``). Deployed on 127.0.0.1, a reply's mean
# time from its creation on the client to its pick-up here fell from 1.6-2.1 s at a 3 s
# poll to 0.7-1.3 s at 0.5 s (benchmarks/results/deployment.md): about 1 s per phase. One
# pull is one small HTTP request to the SuperLink (+1.7 % SuperLink I/O over a run).
DEPLOYED_POLL_SECONDS = 0.5


def poll_seconds(grid: Grid) -> float:
    """The grid's own interval (in-memory grid), else ``CLUSTERFED_POLL_SECONDS`` from the
    environment of the SuperLink (its ServerApp inherits it), else ``DEPLOYED_POLL_SECONDS``."""
    interval = getattr(grid, "pull_interval", None)
    if interval is not None:
        return float(interval)
    return float(os.environ.get("CLUSTERFED_POLL_SECONDS", DEPLOYED_POLL_SECONDS))


def push_and_collect(grid: Grid, messages: list[Message], timeout: float,
                     lags: list[float] | None = None) -> tuple[list[str], list[Message]]:
    """Send ``messages``; pull replies until all arrived or ``timeout`` seconds passed.
    Returns the message ids (in send order; empty for a message the SuperLink refused to
    store, e.g. for a node that is gone) and the replies that arrived, in send order,
    so that aggregation sums in the same order every run. Late replies are dropped.
    ``lags``, if given, gets each reply's seconds from its creation (on the client) to its
    pick-up here: the delivery and polling delay."""
    wait_at_least = getattr(grid, "wait_at_least", None)  # the in-process grid's clock (see there)
    if wait_at_least is not None:
        wait_at_least(timeout)
    message_ids = list(grid.push_messages(messages))
    # a SuperLink refuses to store a message for a node that is gone (offline or
    # unregistered) and returns an empty id for it: no reply can come, so do not wait for one
    pending, replies = {m for m in message_ids if m}, []
    deadline = time.monotonic() + timeout
    interval = poll_seconds(grid)
    while pending:
        # by position: Flower 1.43 renames the argument (message_ids -> reply_to_message_ids)
        for reply in grid.pull_messages([m for m in message_ids if m in pending]):
            if reply.metadata.reply_to_message_id in pending:
                replies.append(reply)
                if lags is not None and reply.metadata.created_at:
                    lags.append(max(time.time() - reply.metadata.created_at, 0.0))
                pending.discard(reply.metadata.reply_to_message_id)
        # the in-process grid knows when nothing more can arrive (late replies are dropped)
        settled = getattr(grid, "nothing_in_flight", None)
        if not pending or (settled is not None and settled()) or time.monotonic() >= deadline:
            break
        time.sleep(min(interval, max(deadline - time.monotonic(), 0.0)))
    position = {message_id: i for i, message_id in enumerate(message_ids)}
    replies.sort(key=lambda r: position[r.metadata.reply_to_message_id])
    return message_ids, replies


def wait_for_nodes(grid: Grid, needed: int, wait_seconds: float, poll_every: float = 1.0) -> int:
    """Poll ``grid`` until at least ``needed`` nodes are connected or ``wait_seconds`` pass;
    returns how many were connected at the last look (fewer than ``needed``: timed out)."""
    deadline = time.monotonic() + wait_seconds
    while (online := len(list(grid.get_node_ids()))) < needed and time.monotonic() < deadline:
        time.sleep(poll_every)
    return online


def is_simulation(grid: Grid) -> bool:
    """Flower's in-memory grid (``flwr run`` on a simulation federation, ``run_simulation``)
    or our in-process grid: a fixed federation."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    return isinstance(grid, InMemoryGrid) or getattr(grid, "nothing_in_flight", None) is not None
