"""Where people watch training: the self-contained HTML run report (``clusterfed report
OUT_DIR``, refreshed each round of a run), and per-round metrics and cluster assignment to
TensorBoard or MLflow (extras ``clusterfed[tensorboard]``, ``clusterfed[mlflow]``), as
``RunWatcher`` plug-ins of the run recorder."""

from clusterfed.report.html import REPORT_NAME, render, write_report
from clusterfed.report.run_folder import RunFolderError, RunView, read_run
from clusterfed.report.watchers import (
    LOG_TO,
    HtmlReport,
    MLflowLogger,
    RunWatcher,
    TensorBoardLogger,
    WatcherError,
    make_watchers,
    missing_extras,
    parse_log_to,
)
from clusterfed.report.watch import watch

__all__ = ["LOG_TO", "REPORT_NAME", "HtmlReport", "MLflowLogger", "RunFolderError", "RunView", "RunWatcher",
           "TensorBoardLogger", "WatcherError", "make_watchers", "missing_extras", "parse_log_to", "read_run",
           "render", "watch", "write_report"]
