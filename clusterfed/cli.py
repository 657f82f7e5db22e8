"""``clusterfed run | compare | experiment | partition-report | partition | params | plot | report | worker stop |
keep``."""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from clusterfed.client_worker import WorkerError, stop_workers, worker_dir
from clusterfed.compare import compare, markdown_table
from clusterfed.config import ConfigError, RunConfig, load_config_file, parse_config, parse_overrides
from clusterfed.datasets import DatasetNotFoundError, PartitionError, partition_table, plot_partition
from clusterfed.datasets.export import build_partition, export_partition
from clusterfed.experiments.grids import RunsFailed, run_experiment
from clusterfed.experiments.spec import load_experiment
from clusterfed.keeper.command import add_parser as add_keep_parser
from clusterfed.reference import strategy_help
from clusterfed.report import WatcherError, write_report
from clusterfed.runner import CheckpointError
from clusterfed.simulation import simulate
from clusterfed.strategies import clustered_classes, strategy_class, strategy_names


def parse_list(text: str, kind: type = str) -> list:
    return [kind(part.strip()) for part in text.split(",") if part.strip()]


def resolve_config(config_file: str | None, overrides: list[str], out: str | None = None) -> RunConfig:
    values: dict[str, Any] = {}
    if config_file:
        values.update(load_config_file(config_file))
    values.update(parse_overrides(overrides))
    if out is not None:
        values["out-dir"] = out
    return parse_config(values)


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML file of run-config keys")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one run-config key (repeatable)")


def cmd_run(args: argparse.Namespace) -> int:
    config = resolve_config(args.config, args.overrides, args.out)
    simulate(config, engine=args.engine)
    print(f"results in {Path(config.out_dir).resolve()}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Every strategy × seed on the same partition; comparison.csv, comparison.md, figures."""
    values: dict[str, Any] = {}
    if args.config:
        values.update(load_config_file(args.config))
    values.update(parse_overrides(args.overrides))
    out = Path(args.out or values.get("out-dir") or "results/compare")
    try:
        seeds = parse_list(args.seeds, int)
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    rows = compare(values, parse_list(args.strategies), seeds, out, engine=args.engine, workers=args.workers)
    print(markdown_table(rows))
    print(f"results in {out.resolve()}")
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    """Every grid of an experiment file; per grid folder comparison.csv/.md, figures, manifest.json."""
    try:
        seeds = parse_list(args.seeds, int) if args.seeds else None
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    experiment = load_experiment(args.file, out=Path(args.out) if args.out else None,
                                 data_dir=Path(args.data_dir) if args.data_dir else None, rounds=args.rounds,
                                 seeds=seeds, only=parse_list(args.only) if args.only else None)
    run_experiment(experiment, workers=args.workers, engine=args.engine, command=["clusterfed", *args.argv])
    print(f"results in {experiment.out.resolve()}")
    return 0


def cmd_partition_report(args: argparse.Namespace) -> int:
    config = resolve_config(args.config, args.overrides)
    source, partition = build_partition(config.to_flower())
    print(partition_table(partition, source.y, source.num_classes))
    png = Path(args.png)
    png.parent.mkdir(parents=True, exist_ok=True)
    plot_partition(partition, source.y, source.num_classes, png)
    print(f"figure: {png.resolve()}")
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    """Write one .npz per client and a manifest, to copy onto devices."""
    config = resolve_config(args.config, args.overrides)
    manifest = export_partition(config.to_flower(), args.out)
    for client in manifest["clients"]:
        print(f"{client['file']}: group {client['true-group']}, "
              f"{client['train-samples']} train / {client['test-samples']} test")
    print(f"manifest: {(Path(args.out) / 'manifest.json').resolve()}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from clusterfed.plots import plot_run

    for path in plot_run(args.dir):
        print(path)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """A self-contained HTML report of a run's output folder (a finished or a running run)."""
    print(write_report(args.dir, args.out).resolve())
    return 0


def cmd_params(args: argparse.Namespace) -> int:
    """Each strategy's parameters, defaults and meanings, from its schema."""
    names = [args.strategy] if args.strategy else list(clustered_classes())
    try:
        for name in names:
            strategy_class(name)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    print("\n\n".join(strategy_help(name) for name in names))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    try:
        folder = Path(args.dir).expanduser() if args.dir else worker_dir()
        report = stop_workers(folder, wait_seconds=args.wait)
    except WorkerError as error:
        print(f"clusterfed: {error}", file=sys.stderr)
        return 1
    for pid in report["stopped"]:
        print(f"stopped warm worker {pid}")
    for name, why in report["left_alone"]:
        print(f"{name}: {why}")
    if report["removed"]:
        print(f"removed from {folder}: {' '.join(report['removed'])}")
    if not report["stopped"]:
        print(f"no warm worker of this user was running in {folder}")
    return 0


def _strategies_epilog() -> str:
    """The --help epilog: the strategies and how their parameters are set (from the registry)."""
    return (f"strategies: {', '.join(strategy_names())}, or package.module:Class. A strategy's parameters "
            "are set as --set <strategy>.<param>=value (clusterfed params NAME lists them).")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clusterfed", description="Clustered federated learning on Flower.",
                                     epilog=_strategies_epilog())
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one simulation and write results", epilog=_strategies_epilog())
    run.add_argument("--out", help="results folder (overrides out-dir)")
    run.add_argument("--engine", choices=("flower", "inprocess"), default="flower",
                     help="flower = Flower's simulation engine (Ray); inprocess = same apps, no Ray (fast, sequential)")
    _add_config_args(run)
    run.set_defaults(func=cmd_run)
    compare = sub.add_parser("compare", help="run several strategies on the same setting")
    compare.add_argument("--strategies", default="fedavg,oracle", help="comma-separated strategy names")
    compare.add_argument("--seeds", default="0", help="comma-separated seeds (partition, init, sampling)")
    compare.add_argument("--out", help="results folder; one sub-folder per strategy and seed")
    compare.add_argument("--engine", choices=("flower", "inprocess"), default="inprocess")
    compare.add_argument("--workers", type=int, default=1,
                         help="runs at a time, each in its own process (in-process engine only)")
    _add_config_args(compare)
    compare.set_defaults(func=cmd_compare)
    experiment = sub.add_parser(
        "experiment", help="run an experiment file (settings × strategies × seeds; benchmarks/experiments/*.toml)")
    experiment.add_argument("file", help="experiment file (TOML)")
    experiment.add_argument("--out", help="results folder (default: the file's `out`)")
    experiment.add_argument("--workers", type=int, default=1,
                            help="runs at a time, each in its own process (in-process engine only)")
    experiment.add_argument("--engine", choices=("flower", "inprocess"), default="inprocess")
    experiment.add_argument("--data-dir", help="folder holding MNIST/raw etc. (replaces the settings' data-dir)")
    experiment.add_argument("--only", help="comma-separated grid folders to run (default: all)")
    experiment.add_argument("--rounds", type=int, help="replace every grid's rounds (e.g. a 2-round smoke run)")
    experiment.add_argument("--seeds", help="replace every grid's seeds, comma-separated")
    experiment.set_defaults(func=cmd_experiment)
    report = sub.add_parser("partition-report", help="show what a partition setting gives each client")
    report.add_argument("--png", default="partition.png", help="where to write the figure")
    _add_config_args(report)
    report.set_defaults(func=cmd_partition_report)
    partition = sub.add_parser("partition", help="write each client's data to DIR/part-<i>.npz for devices")
    partition.add_argument("--out", required=True, metavar="DIR", help="folder for part-<i>.npz and manifest.json")
    _add_config_args(partition)
    partition.set_defaults(func=cmd_partition)
    params = sub.add_parser("params", help="list a strategy's parameters, defaults and meanings")
    params.add_argument("strategy", nargs="?", help="a strategy name or package.module:Class (default: all)")
    params.set_defaults(func=cmd_params)
    worker = sub.add_parser("worker", help="manage this user's warm workers on a device")
    worker.add_argument("action", choices=("stop",),
                        help="stop: end this user's warm workers (checked in /proc) and remove stale files")
    worker.add_argument("--dir", help="the workers' folder (default: $CLUSTERFED_WORKER_DIR or /tmp/clusterfed-<uid>)")
    worker.add_argument("--wait", type=float, default=10.0, help="seconds to wait after SIGTERM before SIGKILL")
    worker.set_defaults(func=cmd_worker)
    plot = sub.add_parser("plot", help="redraw the figures of a results folder")
    plot.add_argument("dir")
    plot.set_defaults(func=cmd_plot)
    report_html = sub.add_parser("report", help="write a run's HTML report (figures, tables, cluster assignment)")
    report_html.add_argument("dir", metavar="OUT_DIR", help="a run's out-dir (holding rounds.jsonl)")
    report_html.add_argument("--out", help="where to write the report (default: OUT_DIR/report.html)")
    report_html.set_defaults(func=cmd_report)
    add_keep_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)

    try:
        return args.func(args)
    except RunsFailed as error:
        print(f"clusterfed: {error}", file=sys.stderr)
        return 1
    except (ConfigError, CheckpointError, DatasetNotFoundError, PartitionError, FileNotFoundError,
            tomllib.TOMLDecodeError, WatcherError) as error:
        print(f"clusterfed: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    sys.exit(main())
