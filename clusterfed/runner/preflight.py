"""Everything the server can check before it contacts a client, all problems at once.

Syntax and ranges are checked by the config schema; here: the partition is feasible for
the chosen data set (when the server has the data: in simulation, or a deployment whose
server holds it too), the output folder can be written, the model fits the data set, a
checkpoint to resume from is usable. (Keys the chosen strategy does not read are named
when the config is parsed.) A run that passes is turned here, once, into what the runner
takes (``Checked``), which the application hands down as it is.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import ConfigRecord
from flwr.supercore import log

from clusterfed import protocol
from clusterfed.config import ConfigError, RunConfig, config_defaults
from clusterfed.datasets import DatasetNotFoundError, PartitionError
from clusterfed.datasets.export import build_partition
from clusterfed.datasets.iid_shifts import parse_rotations
from clusterfed.datasets.label_skew import parse_label_groups
from clusterfed.datasets.shapes import DATASET_SHAPES
from clusterfed.models import build_model
from clusterfed.report.watchers import missing_extras, parse_log_to
from clusterfed.runner.checkpoint import CheckpointError, check_compatible, checkpoint_path, load_checkpoint

if TYPE_CHECKING:
    from clusterfed.runner.driver import RunOptions


def check_partition(config: RunConfig, flat: dict[str, Any] | None = None) -> str | None:
    """The partitioner's own message if this data set cannot be split as asked (``flat``: the
    config's ``to_flower()``, when the caller made it already)."""
    try:  # syntax first: it needs no data
        if config.partitioner == "label-groups":
            if not config.label_groups.strip():  # the library's "" (default groups) is no run setting
                return "label-groups is empty: give the groups, e.g. label-groups=\"0,1;2,3\""
            parse_label_groups(config.label_groups, DATASET_SHAPES[config.dataset][1])
        if config.partitioner == "rotation":
            parse_rotations(config.rotations)
    except PartitionError as error:
        return str(error)
    try:
        build_partition(config.to_flower() if flat is None else flat)
    except DatasetNotFoundError:
        log(logging.INFO, "the server does not hold %s: the partition is checked by the clients", config.dataset)
    except PartitionError as error:
        return str(error)
    return None


def check_out_dir(out_dir: str) -> str | None:
    path = Path(out_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as error:
        return f"out-dir {out_dir!r} cannot be written: {error.strerror or error}"
    return None


def check_model(config: RunConfig):
    """The initial model's arrays, or the reason this model does not fit the data set."""
    from clusterfed.training import state_to_numpy

    shape, num_classes = DATASET_SHAPES[config.dataset]
    try:
        model = build_model(config.model, config.dataset, shape, num_classes, config.seed)
    except ValueError as error:
        return None, f"model {config.model!r} does not fit data set {config.dataset!r}: {error}"
    return protocol.to_array_record(state_to_numpy(model)), None


RESUME_AUTO = "auto"


def resolve_resume(config: RunConfig, *, announce: bool = True) -> RunConfig:
    """``resume-from = "auto"``: resume from out-dir's checkpoint if it has one, else start
    fresh (saying which). Any other value is returned as it is."""
    if config.resume_from != RESUME_AUTO:
        return config
    found = checkpoint_path(config.out_dir).is_file()
    if announce:
        if found:
            log(logging.INFO, "resume-from=auto: resuming from the checkpoint in %s", config.out_dir)
        else:
            log(logging.INFO, "resume-from=auto: no checkpoint in %s, starting fresh", config.out_dir)
    return config.model_copy(update={"resume_from": config.out_dir if found else ""})


@dataclass
class Checked:
    """A run as ``preflight`` found it usable, turned once into what the runner takes: the
    config (``resume-from`` resolved), the initial model's arrays, the driver's ``options``
    (``RunOptions``: checkpoints, the checkpoint to resume from, loaded and checked once,
    membership, simulated newcomers, the seed and the flat run config; the application adds
    its recorder and whether the grid is a deployment's) and the configs every client gets with
    its messages (``train_config``, ``evaluate_config``: the task's data/model spec, local
    epochs and lr). The application hands these down as they are; nothing reads the config
    for the runner again."""

    config: RunConfig
    initial: Any
    options: RunOptions
    train_config: dict[str, Any] = field(default_factory=dict)
    evaluate_config: dict[str, Any] = field(default_factory=dict)

    @property
    def checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint to resume from (loaded and checked here), or None."""
        return self.options.resume_state

    @property
    def flat(self) -> dict[str, Any]:
        """The run config as Flower holds it (``RunConfig.to_flower``), made once here."""
        return self.options.run_config

    def start_args(self) -> dict[str, Any]:
        """What a strategy's ``start`` (or its driver's) takes besides the grid and the initial
        model: the rounds, the round timeout, and the train and evaluate configs."""
        return {"num_rounds": self.config.rounds, "timeout": self.config.timeout,
                "train_config": ConfigRecord(dict(self.train_config)),
                "evaluate_config": ConfigRecord(dict(self.evaluate_config))}


def preflight(config: RunConfig, *, announce: bool = False, partition_checked: bool = False) -> Checked:
    """Check the run; raise one ConfigError listing every problem. ``resume-from = "auto"`` is
    resolved here (said in the log when ``announce``) and the checkpoint loaded once.
    ``partition_checked``: the caller checked this data set's partition already (for a run
    with the same data keys and seed), so it is not split again. Returns the run in the
    runner's terms (``Checked``)."""
    config = resolve_resume(config, announce=announce)
    flat = config.to_flower()
    problems = []
    # this module's own checks first, then those handed to lower layers (a flat config)
    if (problem := check_out_dir(config.out_dir)) is not None:
        problems.append(problem)
    if (problem := missing_extras(parse_log_to(config.log_to))) is not None:
        problems.append(problem)
    initial, problem = check_model(config)
    if problem is not None:
        problems.append(problem)
    if not partition_checked and (problem := check_partition(config, flat)) is not None:
        problems.insert(0, f"partition: {problem}")
    checkpoint = None
    if config.resume_from and initial is not None:
        shapes = {k: (list(v.shape), str(v.dtype)) for k, v in protocol.from_array_record(initial).items()}
        try:
            checkpoint = load_checkpoint(config.resume_from)
            check_compatible(checkpoint, flat, shapes, defaults=config_defaults(config.strategy))
        except CheckpointError as error:
            problems.append(str(error))
    if problems:
        raise ConfigError("; ".join(problems) if len(problems) == 1 else
                          f"{len(problems)} problems: " + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))
    from clusterfed.runner.driver import RunOptions  # the driver loads scikit-learn (the run recorder)

    # the one place run-config keys become the driver's options
    options = RunOptions(checkpoint=config.checkpoint, resume_from=config.resume_from, resume_state=checkpoint,
                         absent_after=config.absent_after, probe_timeout=config.probe_timeout,
                         newcomer_fraction=config.newcomer_fraction, newcomer_round=config.newcomer_round,
                         seed=config.seed, run_config=flat)
    # the built-in task's configs: the data/model spec every client rebuilds its partition and
    # model from (simulation via the Python API gives clients an empty run config, so the spec
    # travels in the messages), plus local epochs and lr
    spec = protocol.client_spec(flat)
    return Checked(config, initial, options, train_config={**spec, "local-epochs": config.local_epochs, "lr": config.lr},
                   evaluate_config=dict(spec))


def partition_keys(config: RunConfig) -> tuple:
    """What a run's partition (and data) depend on: every run key but the strategy, its
    parameters and the out-dir."""
    return tuple(sorted((k, v) for k, v in config.to_flower().items()
                        if k not in ("strategy", "out-dir") and "." not in k))


def preflight_runs(configs: list[RunConfig]) -> list[Checked]:
    """``preflight`` of each run, in order, each partition split once (runs differing only in
    strategy and out-dir share it); raise one ConfigError listing every run's problems."""
    checked, problems, split = [], [], set()
    for config in configs:
        keys = partition_keys(config)
        try:
            checked.append(preflight(config, partition_checked=keys in split))
        except ConfigError as error:
            problems.append(str(error))
        split.add(keys)
    if problems:
        raise ConfigError("; ".join(dict.fromkeys(problems)))
    return checked
