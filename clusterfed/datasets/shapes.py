"""Input shape and class count of each data set, known without loading it.

The server builds the initial model from these, so a server that holds no data (a
deployment) can still start a run.
"""

DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "digits": ((1, 8, 8), 10),
    "synthetic-digits": ((1, 8, 8), 10),
    "mnist": ((1, 28, 28), 10),
    "fmnist": ((1, 28, 28), 10),
    "emnist-letters": ((1, 28, 28), 26),
    "cifar10": ((3, 32, 32), 10),
    "svhn": ((3, 32, 32), 10),
}
