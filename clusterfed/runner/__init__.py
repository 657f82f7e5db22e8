"""The server's transport: the round driver, reply validation, checkpoints, the in-process grid."""

from clusterfed.runner.checkpoint import CheckpointError
from clusterfed.strategies import strategy_class
from clusterfed.strategies.base import ClusteredStrategy


def build_runner(config, recorder=None, *, deployment: bool = False):
    """The Flower ``Strategy`` that runs ``config.strategy``: the configured clustered
    strategy with the app's run options (recording, checkpoints, membership), or Flower's
    own FedAvg for ``flwr-fedavg``. ``deployment``: nodes may join late and go absent."""
    from clusterfed.runner.runner import RunOptions

    cls = strategy_class(config.strategy)
    if not issubclass(cls, ClusteredStrategy):
        return cls(config, recorder)
    strategy = config.build_strategy()
    strategy.run_options = RunOptions(
        recorder=recorder, deployment=deployment, checkpoint=config.checkpoint, resume_from=config.resume_from,
        absent_after=config.absent_after, newcomer_fraction=config.newcomer_fraction,
        newcomer_round=config.newcomer_round, seed=config.seed, run_config=config.to_flower())
    return strategy


__all__ = ["CheckpointError", "build_runner"]
