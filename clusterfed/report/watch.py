"""``watch``: the run recorder and the log-to destinations around a library user's own
``strategy.start``."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from clusterfed.report.watchers import RunWatcher, WatcherError, make_watchers, parse_log_to
from clusterfed.core.contract import ClientFailureError


class watch:
    """For a library user's own ServerApp: record the strategy's run in ``out_dir``
    (rounds.jsonl, and at the end summary.json and clusters.json) and send it to the
    ``log_to`` destinations::

        with watch(strategy, "results/my-run", log_to="report,tensorboard"):
            result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=20)

    ``watchers`` adds plug-ins of your own (``RunWatcher`` subclasses)."""

    def __init__(self, strategy: Any, out_dir: str | Path, log_to: str = "report",
                 watchers: list[RunWatcher] | None = None, config: dict[str, Any] | None = None):
        from clusterfed.results import RunRecorder  # scikit-learn
        from clusterfed.runner.driver import RunOptions  # the round driver (scikit-learn, through the recorder)

        name = strategy.name
        params = strategy.params.model_dump(mode="json")
        flat = {"strategy": name, **{f"{name}.{k.replace('_', '-')}": v for k, v in params.items()},
                **(config or {})}
        try:
            chosen = make_watchers(parse_log_to(log_to))
        except ValueError as error:
            raise WatcherError(str(error)) from None
        self.strategy = strategy
        self.started = time.perf_counter()
        self.recorder = RunRecorder(out_dir, flat, stream=None, watchers=chosen + list(watchers or []))
        options = strategy.run_options or RunOptions(seed=strategy.params.seed)
        strategy.run_options = dataclasses.replace(options, recorder=self.recorder)

    def __enter__(self) -> watch:
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        # a run that stopped because no client's training was accepted: that is why it ended so
        failed = str(error) if isinstance(error, ClientFailureError) else None
        driver = getattr(self.strategy, "driver", None)  # the run's, which holds the client table a reason may quote
        clients = driver.members.table() if driver is not None else None
        self.recorder.finish(time.perf_counter() - self.started,
                             self.strategy.final_clusters(training_failed=failed, clients=clients))
