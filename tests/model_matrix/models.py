"""The users' own models: what people train, not clusterfed's. Each takes the input its data
kind gives (``data.KINDS``) and outputs class logits.

Besides small ones (an MLP, a BatchNorm ResNet, a GRU, a Transformer encoder, a 0-d buffer,
float16), models written the way people outside this repository write them: a
MobileNetV2-style CNN, a frozen "pretrained" backbone under a trainable head, a classifier
whose head is not the last entry of its state_dict, an Embedding + LSTM text model."""

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


class InvertedResidual(nn.Module):
    """MobileNetV2's block: a 1×1 expansion, a depthwise 3×3 conv (``groups`` = channels), a
    linear 1×1 projection, BatchNorm after each, ReLU6 after the first two; the input is added
    back when the stride is 1 and the channels match."""

    def __init__(self, inp: int, out: int, stride: int, expand: int):
        super().__init__()
        hidden = inp * expand
        self.use_residual = stride == 1 and inp == out
        self.conv = nn.Sequential(
            nn.Conv2d(inp, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, out, 1, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2Small(nn.Module):
    """A MobileNetV2 as torchvision lays it out, scaled to 12×12 inputs: ``features`` (a conv
    stem, inverted residual blocks, a 1×1 conv to the last channels, each with BatchNorm and
    ReLU6), global average pooling, ``classifier`` = dropout + linear."""

    def __init__(self, num_classes: int = NUM_CLASSES, last_channels: int = 32, dropout: float = 0.2):
        super().__init__()
        layers = [nn.Sequential(nn.Conv2d(IMAGE_SHAPE[0], 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
                                nn.ReLU6(inplace=True))]
        layers += [InvertedResidual(8, 8, 1, 1), InvertedResidual(8, 12, 2, 4), InvertedResidual(12, 12, 1, 4)]
        layers.append(nn.Sequential(nn.Conv2d(12, last_channels, 1, bias=False), nn.BatchNorm2d(last_channels),
                                    nn.ReLU6(inplace=True)))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last_channels, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


BACKBONE_SEED = 2024  # the "pretrained" weights: the same in every process, whatever the global seed


class FrozenBackbone(nn.Module):
    """A "pretrained" conv backbone (weights fixed by ``BACKBONE_SEED``, no download) with
    ``requires_grad=False``, and a trainable linear head: fine-tuning the head only, as people do
    with a downloaded feature extractor. The state_dict holds the frozen arrays too."""

    def __init__(self, num_classes: int = NUM_CLASSES, channels: int = 16):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(BACKBONE_SEED)
            self.backbone = nn.Sequential(
                nn.Conv2d(IMAGE_SHAPE[0], channels, 3, padding=1), nn.ReLU(),
                nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(3))
        for parameter in self.backbone.parameters():
            parameter.requires_grad = False
        self.head = nn.Linear(channels * 9, num_classes)

    def forward(self, x):
        return self.head(torch.flatten(self.backbone(x), 1))


AUX_LOSS_WEIGHT = 0.1


class AuxDecoderClassifier(nn.Module):
    """A classifier whose head is not the last entry of its state_dict: ``head`` is defined
    before ``aux``, a linear decoder that reconstructs the conv features from the hidden layer
    (a small auxiliary loss, ``AUX_LOSS_WEIGHT`` × MSE, set in ``aux_loss`` by each training
    forward). The last 2-D weight of the state_dict is ``aux.weight``."""

    def __init__(self, num_classes: int = NUM_CLASSES, channels: int = 8, hidden: int = 32):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(IMAGE_SHAPE[0], channels, 3, padding=1), nn.ReLU(),
                                     nn.MaxPool2d(2), nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
                                     nn.AdaptiveAvgPool2d(3))
        self.hidden = nn.Linear(channels * 9, hidden)
        self.head = nn.Linear(hidden, num_classes)
        self.aux = nn.Linear(hidden, channels * 9)

    def forward(self, x):
        features = torch.flatten(self.encoder(x), 1)
        hidden = torch.relu(self.hidden(features))
        if self.training:
            self.aux_loss = AUX_LOSS_WEIGHT * nn.functional.mse_loss(self.aux(hidden), features.detach())
        return self.head(hidden)


def auxiliary_loss(model: nn.Module):
    """The auxiliary loss the model's last training forward set (0 for a model without one)."""
    return getattr(model, "aux_loss", 0.0)


class LSTMClassifier(nn.Module):
    """A text classifier as people write one: token embedding, a bidirectional LSTM (its arrays
    ``weight_ih_l0`` and ``weight_ih_l0_reverse``, ...), dropout, a linear head on both
    directions' last hidden states."""

    def __init__(self, num_classes: int = NUM_CLASSES, dim: int = 16, hidden: int = 24, dropout: float = 0.1):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, dim)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(2 * hidden, num_classes)

    def forward(self, tokens):
        _, (last, _) = self.lstm(self.embedding(tokens))
        return self.fc(self.dropout(torch.cat([last[-2], last[-1]], dim=1)))


# model name -> (class, the data kind it takes)
MODELS: dict[str, tuple[type[nn.Module], str]] = {
    "mlp": (MLP, "vector"),
    "resnet-bn": (ResNetBN, "image"),
    "gru": (GRUClassifier, "tokens"),
    "transformer": (TinyTransformer, "tokens"),
    "scalar-buffer": (ScaledMLP, "vector"),
    "float16": (HalfMLP, "vector"),
    "mobilenet": (MobileNetV2Small, "image"),
    "frozen-backbone": (FrozenBackbone, "image"),
    "head-not-last": (AuxDecoderClassifier, "image"),
    "lstm": (LSTMClassifier, "tokens"),
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
