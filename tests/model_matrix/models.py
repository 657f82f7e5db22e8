"""The users' own models: what people train, not clusterfed's. Each takes the input its data
kind gives (``data.KINDS``) and outputs class logits."""

from __future__ import annotations

import torch
from torch import nn

NUM_CLASSES = 4
VECTOR_DIM = 16
IMAGE_SHAPE = (3, 12, 12)
VOCAB = 32
SEQ_LEN = 12


class MLP(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.hidden = nn.Linear(VECTOR_DIM, 32)
        self.out = nn.Linear(32, num_classes)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


class ScaledMLP(MLP):
    """An MLP whose logits are multiplied by a 0-d buffer (a temperature a user keeps in the
    state_dict): the buffer is shape ``()``, not ``(1,)``."""

    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__(num_classes)
        self.register_buffer("scale", torch.tensor(1.0))

    def forward(self, x):
        return super().forward(x) * self.scale


class HalfMLP(MLP):
    """The MLP in float16, inputs cast on the way in (``half_supported()`` says whether this CPU
    trains it)."""

    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__(num_classes)
        self.half()

    def forward(self, x):
        return super().forward(x.to(torch.float16))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


class ResNetBN(nn.Module):
    """A ResNet-style CNN: a conv stem with BatchNorm, one residual block, pooling to 2×2, a
    linear head."""

    def __init__(self, num_classes: int = NUM_CLASSES, channels: int = 6):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(IMAGE_SHAPE[0], channels, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU())
        self.block = ResidualBlock(channels)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(channels * 4, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.block(self.stem(x))), 1))


class GRUClassifier(nn.Module):
    """Token embedding, a one-layer GRU, a linear head on the last hidden state."""

    def __init__(self, num_classes: int = NUM_CLASSES, dim: int = 16, hidden: int = 32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.gru = nn.GRU(dim, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, tokens):
        _, last = self.gru(self.embed(tokens))
        return self.fc(last[-1])


class TinyTransformer(nn.Module):
    """A Transformer encoder: token embedding plus a learned position table, one encoder layer
    (multi-head attention, LayerNorm, feed-forward), a final LayerNorm, mean pooling, a head."""

    def __init__(self, num_classes: int = NUM_CLASSES, dim: int = 16, heads: int = 2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.position = nn.Parameter(torch.zeros(SEQ_LEN, dim))
        self.encoder = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens):
        hidden = self.encoder(self.embed(tokens) + self.position)
        return self.head(self.norm(hidden).mean(dim=1))


# model name -> (class, the data kind it takes)
MODELS: dict[str, tuple[type[nn.Module], str]] = {
    "mlp": (MLP, "vector"),
    "resnet-bn": (ResNetBN, "image"),
    "gru": (GRUClassifier, "tokens"),
    "transformer": (TinyTransformer, "tokens"),
    "scalar-buffer": (ScaledMLP, "vector"),
    "float16": (HalfMLP, "vector"),
}


def build_model(name: str) -> nn.Module:
    return MODELS[name][0]()


def data_kind(name: str) -> str:
    return MODELS[name][1]


def half_supported() -> bool:
    """Whether this CPU's torch runs a float16 forward and backward pass."""
    try:
        model = HalfMLP()
        model(torch.zeros(2, VECTOR_DIM)).float().sum().backward()
    except (RuntimeError, NotImplementedError):
        return False
    return True
