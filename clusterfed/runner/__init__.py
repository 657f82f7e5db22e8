"""The server's transport: the round driver (``driver``) with membership, link and scoring
beside it, Flower's single-phase hooks, reply validation, checkpoints, the in-process grid."""

from clusterfed.runner.checkpoint import CheckpointError

__all__ = ["CheckpointError"]
