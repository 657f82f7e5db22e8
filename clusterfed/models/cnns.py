"""The papers' CNNs as plain ``torch.nn.Module`` s.

Every model takes ``in_channels``, ``num_classes`` and ``image_size`` (square inputs);
the flattened size in front of the first fully connected layer is computed from the
input shape, so the papers' sizes come out at their native input (e.g. mnist-cnn:
50*4*4 = 800 at 28x28) and the model still builds on other sizes where the
convolutions fit.

No BatchNorm anywhere: its running statistics are buffers that FedAvg would have to
average (or not) separately, and layer-wise clustering would have to skip them. Plain
conv/linear layers keep every state-dict entry a trainable weight or bias.

Attribute names (``conv1, conv2, fc1, fc2, fc3``, fc numbered in order) are the
state-dict prefixes that layer selection works with.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def conv_output_size(size: int, kernel_size: int, padding: int = 0) -> int:
    """Spatial size after a stride-1 convolution."""
    return size + 2 * padding - kernel_size + 1


def pool_output_size(size: int, kernel_size: int = 2) -> int:
    """Spatial size after a max-pool with stride == kernel size (floor)."""
    return size // kernel_size


def _check_size(model_name: str, image_size: int, size: int, where: str) -> int:
    # Fail at construction with a readable message instead of a shape error at the
    # first forward pass.
    if size < 1:
        raise ValueError(
            f"{model_name} cannot take {image_size}x{image_size} inputs: the feature map "
            f"shrinks to {size}x{size} {where}"
        )
    return size


class TwoConvOneFC(nn.Module):
    """conv k5, pool, conv k5, pool, one fc layer: the shape of the FedClust papers'
    MNIST, FMNIST and CIFAR CNNs, which differ only in their channel counts."""

    model_name = "two-conv-one-fc"
    channels: tuple[int, int] = (20, 50)

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        super().__init__()
        name, (c1, c2) = self.model_name, self.channels
        size = _check_size(name, image_size, conv_output_size(image_size, 5), "after conv1")
        size = _check_size(name, image_size, pool_output_size(size), "after pool1")
        size = _check_size(name, image_size, conv_output_size(size, 5), "after conv2")
        size = _check_size(name, image_size, pool_output_size(size), "after pool2")
        self.conv1 = nn.Conv2d(in_channels, c1, kernel_size=5)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=5)
        self.fc1 = nn.Linear(c2 * size * size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc1(torch.flatten(x, 1))


class MnistCNN(TwoConvOneFC):
    """FedClust's MNIST CNN: conv 1->20 k5, pool, conv 20->50 k5, pool, fc 800->10."""

    model_name, channels = "mnist-cnn", (20, 50)

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        super().__init__(in_channels, num_classes, image_size)


class FmnistCNN(TwoConvOneFC):
    """FMNIST CNN: conv ->16 k5, pool, conv 16->32 k5, pool, fc 512->10."""

    model_name, channels = "fmnist-cnn", (16, 32)

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        super().__init__(in_channels, num_classes, image_size)


class CifarCNN(TwoConvOneFC):
    """CIFAR CNN: conv 3->6 k5, pool, conv 6->16 k5, pool, fc 400->10."""

    model_name, channels = "cifar-cnn", (6, 16)

    def __init__(self, in_channels: int = 3, num_classes: int = 10, image_size: int = 32):
        super().__init__(in_channels, num_classes, image_size)


class LeNet5(nn.Module):
    """LeNet-5: conv ->6 k5, pool, conv 6->16 k5, pool, fc 400->120->84->classes.

    Inputs smaller than 32x32 get padding=2 on conv1, as in the classic LeNet on
    MNIST, so 28x28 inputs also flatten to 16*5*5 = 400.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        super().__init__()
        conv1_padding = 2 if image_size < 32 else 0
        size = _check_size("lenet5", image_size, conv_output_size(image_size, 5, conv1_padding), "after conv1")
        size = _check_size("lenet5", image_size, pool_output_size(size), "after pool1")
        size = _check_size("lenet5", image_size, conv_output_size(size, 5), "after conv2")
        size = _check_size("lenet5", image_size, pool_output_size(size), "after pool2")
        self.conv1 = nn.Conv2d(in_channels, 6, kernel_size=5, padding=conv1_padding)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.fc1 = nn.Linear(16 * size * size, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class SelectionCNN(nn.Module):
    """The client-selection paper's CNN: conv3x3 32, conv3x3 64, pool, fc 128, fc classes."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        super().__init__()
        size = _check_size("selection-cnn", image_size, conv_output_size(image_size, 3), "after conv1")
        size = _check_size("selection-cnn", image_size, conv_output_size(size, 3), "after conv2")
        size = _check_size("selection-cnn", image_size, pool_output_size(size), "after pool")
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=3)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.fc1 = nn.Linear(64 * size * size, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


class DigitsCNN(nn.Module):
    """Small CNN for 8x8 digits (fast on CPU): conv 16 k3, pool, conv 32 k3, pool, fc 128->64->classes."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 8):
        super().__init__()
        size = _check_size("digits-cnn", image_size, pool_output_size(conv_output_size(image_size, 3, 1)), "after pool1")
        size = _check_size("digits-cnn", image_size, pool_output_size(conv_output_size(size, 3, 1)), "after pool2")
        self.conv1 = nn.Conv2d(in_channels, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * size * size, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "mnist-cnn": MnistCNN,
    "fmnist-cnn": FmnistCNN,
    "cifar-cnn": CifarCNN,
    "lenet5": LeNet5,
    "selection-cnn": SelectionCNN,
    "digits-cnn": DigitsCNN,
}
