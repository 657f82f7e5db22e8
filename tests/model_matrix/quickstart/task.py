"""The quickstart's task: the CIFAR-10 CNN of PyTorch's tutorial, its training and test loops,
and the data hook: ``load_data`` generates CIFAR-shaped (3×32×32, 10 classes) group data
instead of downloading CIFAR-10."""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from model_matrix.data import DictImages, make_examples

NUM_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)
SHIFT_VARIABLE = "MODEL_MATRIX_SHIFT"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, NUM_CLASSES)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """This partition's train and test loaders of ``{"img", "label"}`` batches (the data hook)."""
    shift = os.environ.get(SHIFT_VARIABLE, "concept")
    x, y = make_examples("image", shift, partition_id, 96, num_classes=NUM_CLASSES, image_shape=IMAGE_SHAPE)
    generator = torch.Generator().manual_seed(int(partition_id))
    train = DataLoader(DictImages(x[:64], y[:64]), batch_size=batch_size, shuffle=True, generator=generator)
    return train, DataLoader(DictImages(x[64:], y[64:]), batch_size=batch_size)


def train(net, trainloader, epochs, lr, device):
    """Train with SGD (momentum 0.9); the mean batch loss."""
    net.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(batch["img"].to(device)), batch["label"].to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net, testloader, device):
    """The mean batch loss and the accuracy."""
    net.to(device)
    criterion = nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            outputs = net(batch["img"].to(device))
            labels = batch["label"].to(device)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
