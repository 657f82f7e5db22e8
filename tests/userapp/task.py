"""A Flower user's own task, not one of clusterfed's: a small MLP on synthetic sensor
readings; the devices fall into two groups whose label meaning is swapped (a device
calibrated the other way reports class 1 where the rest report class 0)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NUM_GROUPS = 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 16)
        self.out = nn.Linear(16, 2)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def group_of(partition_id: int) -> int:
    return partition_id % NUM_GROUPS


def load_data(partition_id: int, n: int = 96) -> tuple[DataLoader, DataLoader]:
    rng = np.random.default_rng(partition_id)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    if group_of(partition_id) == 1:
        y = 1 - y  # the swapped label meaning
    split = int(0.75 * n)
    data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    train = torch.utils.data.Subset(data, range(split))
    test = torch.utils.data.Subset(data, range(split, n))
    generator = torch.Generator().manual_seed(partition_id)
    return DataLoader(train, batch_size=16, shuffle=True, generator=generator), DataLoader(test, batch_size=64)


def train(net: Net, loader: DataLoader, epochs: int, lr: float) -> float:
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    loss_fn, total, count = nn.CrossEntropyLoss(), 0.0, 0
    net.train()
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(net(x), y)
            loss.backward()
            optimizer.step()
            total, count = total + float(loss.detach()) * len(y), count + len(y)
    return total / count


@torch.no_grad()
def test(net: Net, loader: DataLoader) -> tuple[float, float]:
    net.eval()
    loss_fn, loss, correct, count = nn.CrossEntropyLoss(reduction="sum"), 0.0, 0, 0
    for x, y in loader:
        logits = net(x)
        loss += float(loss_fn(logits, y))
        correct += int((logits.argmax(1) == y).sum())
        count += len(y)
    return loss / count, correct / count
