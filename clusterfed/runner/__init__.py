"""The server's transport: the round runner, reply validation, checkpoints, the in-process grid."""

from clusterfed.runner.checkpoint import CheckpointError


def build_runner(config, recorder=None, *, deployment: bool = False):
    """The Flower ``Strategy`` that runs ``config.strategy``: our runner driving the
    strategy's algorithm, or Flower's own FedAvg for ``flwr-fedavg``. ``deployment``: nodes
    may join late and go absent (see ``ClusteredRunner``)."""
    from clusterfed.strategies import FLOWER_STRATEGIES, strategy_class

    cls = strategy_class(config.strategy)
    if config.strategy in FLOWER_STRATEGIES:
        return cls(config, recorder)
    from clusterfed.runner.runner import ClusteredRunner

    return ClusteredRunner(config, cls(config), recorder, deployment=deployment)


__all__ = ["CheckpointError", "build_runner"]
