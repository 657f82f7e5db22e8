"""The task: the mixture of linear regressions of the IFCA paper (Ghosh, Chung, Yin,
Ramchandran, "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020, Sec. 6.1).

There are k groups of clients, each with its own true weight vector theta_j (entries R * Bernoulli(0.5),
as in the paper's code). A client of group j holds n points x ~ N(0, I_d) with
y = <x, theta_j> + noise. The model is linear (no bias), the loss the mean squared error.
The paper uses d = 1000, 100 clients, n = 100; the defaults here are smaller so the example
runs in seconds (set them in pyproject.toml's [tool.flwr.app.config]).
"""

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def group_of(partition_id: int, num_partitions: int, k: int) -> int:
    """The group of a client: consecutive blocks of clients, as in the paper's code."""
    return partition_id * k // num_partitions


def true_weights(k: int, d: int, r: float, seed: int = 0) -> np.ndarray:
    """theta_1..theta_k, one row each: entries R * Bernoulli(0.5)."""
    return r * np.random.default_rng(seed).binomial(1, 0.5, size=(k, d)).astype(np.float32)


def load_data(partition_id: int, num_partitions: int, k: int, d: int, n: int, r: float, noise: float,
              batch_size: int) -> tuple[DataLoader, DataLoader]:
    """This client's train loader (n points) and test loader (n more from the same model)."""
    theta = true_weights(k, d, r)[group_of(partition_id, num_partitions, k)]
    rng = np.random.default_rng(1000 + partition_id)
    x = rng.normal(size=(2 * n, d)).astype(np.float32)
    y = (x @ theta + rng.normal(0, noise, size=2 * n)).astype(np.float32)[:, None]
    train = TensorDataset(torch.from_numpy(x[:n]), torch.from_numpy(y[:n]))
    test = TensorDataset(torch.from_numpy(x[n:]), torch.from_numpy(y[n:]))
    shuffle = torch.Generator().manual_seed(partition_id)
    return DataLoader(train, batch_size=batch_size, shuffle=True, generator=shuffle), DataLoader(test, batch_size=n)


def linear_model(d: int) -> nn.Module:
    return nn.Linear(d, 1, bias=False)


@torch.no_grad()
def mse(model: nn.Module, loader: DataLoader) -> float:
    """Mean squared error over a loader."""
    model.eval()
    errors = [((model(x) - y) ** 2).sum().item() for x, y in loader]
    return sum(errors) / len(loader.dataset)
