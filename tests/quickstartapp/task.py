"""A Flower user's task written the way Flower's quickstart-pytorch writes one: a small net,
SGD with momentum 0.9, ``local-epochs`` from the run config. Generated 10-class data whose
clients fall into three groups, each with its own permutation of the labels (concept
shift): the groups are told apart only by what the final layer learns."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from userapp.task import test  # noqa: F401  (the same evaluation loop: loss and accuracy)

NUM_GROUPS = 3
NUM_CLASSES = 10
FEATURES = 64


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 32)
        self.fc2 = nn.Linear(32, NUM_CLASSES)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def group_of(partition_id: int) -> int:
    return partition_id % NUM_GROUPS


def load_data(partition_id: int, batch_size: int, n: int = 48) -> tuple[DataLoader, DataLoader]:
    """This partition's train and test loaders: class prototypes shared by every client,
    labels permuted by the client's group."""
    prototypes = np.random.default_rng(1234).standard_normal((NUM_CLASSES, FEATURES)).astype(np.float32)
    permutation = np.random.default_rng(100 + group_of(partition_id)).permutation(NUM_CLASSES)
    rng = np.random.default_rng(partition_id)
    classes = rng.integers(0, NUM_CLASSES, size=n)
    x = prototypes[classes] + 2.0 * rng.standard_normal((n, FEATURES)).astype(np.float32)
    y = permutation[classes]
    data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64)))
    split = int(0.75 * n)
    train = torch.utils.data.Subset(data, range(split))
    test = torch.utils.data.Subset(data, range(split, n))
    generator = torch.Generator().manual_seed(partition_id)
    return DataLoader(train, batch_size=batch_size, shuffle=True, generator=generator), DataLoader(test, batch_size=64)


def train(net: Net, loader: DataLoader, epochs: int, lr: float) -> float:
    """quickstart-pytorch's loop: SGD with momentum 0.9, mean loss of the batches."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    loss_fn, total, batches = nn.CrossEntropyLoss(), 0.0, 0
    net.train()
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(net(x), y)
            loss.backward()
            optimizer.step()
            total, batches = total + float(loss.detach()), batches + 1
    return total / batches
