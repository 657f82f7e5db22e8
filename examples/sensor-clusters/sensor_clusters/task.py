"""The task: a small 1-D CNN that tells a machine's state from a window of vibration readings.

The data is generated (no download). Every device is a vibration sensor fitted to a machine
and records windows of 32 samples showing one of three patterns: calm, a strong oscillation,
or a fast ripple. The devices sit on three kinds of machine, and what a pattern means depends
on the machine: a strong oscillation is normal on a fan but means "stop now" on a press. So one
model for all devices cannot be right everywhere; one model per kind of machine can.
"""

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CLASSES = ("ok", "service soon", "stop now")
PATTERNS = ("calm", "strong oscillation", "ripple")
# MEANING[machine][pattern] = the class (the state) that pattern means on that kind of machine
MACHINES = ("pump", "fan", "press")
MEANING = ((0, 1, 2),  # pump: calm is ok, a strong oscillation needs service, a ripple means stop
           (2, 0, 1),  # fan: a stalled (calm) fan must stop, it shakes when ok, a ripple needs service
           (1, 2, 0))  # press: it hammers (ripples) when ok, calm needs a look, shaking means stop
WINDOW = 32


class Net(nn.Module):
    """Two 1-D convolutions, a max over time, a linear classifier."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 8, kernel_size=5, padding=2), nn.ReLU(),
            nn.Conv1d(8, 16, kernel_size=5, padding=2), nn.ReLU(),
            nn.AdaptiveMaxPool1d(1), nn.Flatten(),
        )
        self.classifier = nn.Linear(16, len(CLASSES))

    def forward(self, x):  # x: (batch, 1, WINDOW)
        return self.classifier(self.features(x))


def group_of(partition_id: int) -> int:
    """The kind of machine a device sits on (what the clustering should find)."""
    return partition_id % len(MACHINES)


def make_windows(partition_id: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` windows as this device records them, labelled with the state they mean on its machine."""
    rng = np.random.default_rng(partition_id)
    pattern = rng.integers(0, len(PATTERNS), size=n)
    t = np.arange(WINDOW) / WINDOW
    slow = np.sin(2 * np.pi * rng.uniform(1.0, 2.0, size=(n, 1)) * t + rng.uniform(0, 2 * np.pi, size=(n, 1)))
    fast = np.sin(2 * np.pi * rng.uniform(10.0, 12.0, size=(n, 1)) * t)
    signal = np.where(pattern[:, None] == 1, 2.0, 0.5) * slow  # calm or strong oscillation
    signal += np.where(pattern[:, None] == 2, 0.8, 0.0) * fast  # the ripple
    signal += rng.normal(0, 0.1, size=signal.shape)  # sensor noise
    labels = np.array(MEANING[group_of(partition_id)])[pattern]
    return signal[:, None, :].astype(np.float32), labels.astype(np.int64)


def load_data(partition_id: int, batch_size: int = 32) -> tuple[DataLoader, DataLoader]:
    """This device's train and test loaders (240 and 60 windows)."""
    x, y = make_windows(partition_id, 300)
    train = TensorDataset(torch.from_numpy(x[:240]), torch.from_numpy(y[:240]))
    test = TensorDataset(torch.from_numpy(x[240:]), torch.from_numpy(y[240:]))
    shuffle = torch.Generator().manual_seed(partition_id)
    return DataLoader(train, batch_size=batch_size, shuffle=True, generator=shuffle), DataLoader(test, batch_size=64)


def train(net: nn.Module, loader: DataLoader, epochs: int, lr: float) -> float:
    """Plain SGD; returns the mean training loss."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    criterion, total, count = nn.CrossEntropyLoss(), 0.0, 0
    net.train()
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(net(x), y)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(y), count + len(y)
    return total / count


@torch.no_grad()
def test(net: nn.Module, loader: DataLoader) -> tuple[float, float]:
    """Mean loss and accuracy."""
    net.eval()
    criterion, loss, correct, count = nn.CrossEntropyLoss(reduction="sum"), 0.0, 0, 0
    for x, y in loader:
        logits = net(x)
        loss += criterion(logits, y).item()
        correct += (logits.argmax(1) == y).sum().item()
        count += len(y)
    return loss / count, correct / count
