"""The cell's model, written the way people outside this repository write PyTorch models:
plain ``nn.Module`` classes over image inputs ``(N, 1, S, S)`` with 10 class logits out, not
clusterfed's own CNNs.

Every family is a ``trunk`` (the feature extractor) and a linear ``head``; the cell decides the
order in which they are registered (the head first, last, or followed by a ``neck`` / auxiliary
heads, so that it is not the state_dict's last entry), how many auxiliary heads hang off the
features (trained on side targets of the label: parity, residue mod 3), and which leading share
of the trunk is frozen (``requires_grad = False``, as a fine-tuned "pretrained" backbone)."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn
from torch.nn import functional as F

from fuzz.cell import Cell

NUM_CLASSES = 10
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU, "leaky_relu": nn.LeakyReLU}
AUX_TARGETS = (2, 3)  # auxiliary head k predicts the label mod AUX_TARGETS[k]
AUX_WEIGHT = 0.3  # an auxiliary head's loss weight (a multi-head model's task heads weigh 1)


def side(dataset: str) -> int:
    return 28 if dataset == "mnist" else 8


def act(cell: Cell) -> nn.Module:
    return ACTIVATIONS[cell.activation]()


def mlp_trunk(cell: Cell) -> tuple[nn.Module, int]:
    layers, width_in = [nn.Flatten()], side(cell.dataset) ** 2
    for _ in range(cell.depth):
        layers += [nn.Linear(width_in, cell.width), act(cell)]
        if cell.dropout:
            layers.append(nn.Dropout(cell.dropout))
        width_in = cell.width
    return nn.Sequential(*layers), cell.width


def cnn_trunk(cell: Cell) -> tuple[nn.Module, int]:
    layers, channels, size = [], 1, side(cell.dataset)
    for _ in range(cell.depth):
        layers += [nn.Conv2d(channels, cell.width, 3, padding=1), act(cell)]
        if size >= 8:
            layers.append(nn.MaxPool2d(2))
            size //= 2
        channels = cell.width
    layers += [nn.AdaptiveAvgPool2d(2), nn.Flatten()]
    if cell.dropout:
        layers.append(nn.Dropout(cell.dropout))
    return nn.Sequential(*layers), 4 * cell.width


def norm_layer(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(4, channels)
    return nn.Identity()


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3×3 convs, a norm after each, the input added back."""

    def __init__(self, channels: int, norm: str, activation: type[nn.Module]):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=norm == "none")
        self.bn1 = norm_layer(norm, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=norm == "none")
        self.bn2 = norm_layer(norm, channels)
        self.act = activation()

    def forward(self, x):
        out = self.act(self.bn1(self.conv1(x)))
        return self.act(x + self.bn2(self.conv2(out)))


def resnet_trunk(cell: Cell) -> tuple[nn.Module, int]:
    stride = 2 if cell.dataset == "mnist" else 1
    layers = [nn.Conv2d(1, cell.width, 3, stride=stride, padding=1, bias=cell.norm == "none"),
              norm_layer(cell.norm, cell.width), act(cell)]
    layers += [BasicBlock(cell.width, cell.norm, ACTIVATIONS[cell.activation]) for _ in range(cell.depth)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    if cell.dropout:
        layers.append(nn.Dropout(cell.dropout))
    return nn.Sequential(*layers), cell.width


class PatchTransformer(nn.Module):
    """A tiny vision transformer: non-overlapping patches embedded by a strided conv, a learned
    position table, ``depth`` encoder layers, a final LayerNorm, mean pooling."""

    def __init__(self, cell: Cell):
        super().__init__()
        patch = 4 if cell.dataset == "mnist" else 2
        tokens = (side(cell.dataset) // patch) ** 2
        self.patch_embed = nn.Conv2d(1, cell.width, patch, stride=patch)
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, cell.width))
        activation = "gelu" if cell.activation == "gelu" else "relu"
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(cell.width, 2, dim_feedforward=2 * cell.width, dropout=cell.dropout,
                                       activation=activation, batch_first=True) for _ in range(cell.depth))
        self.norm = nn.LayerNorm(cell.width)

    def forward(self, x):
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        for block in self.blocks:
            tokens = block(tokens)
        return self.norm(tokens).mean(dim=1)


class RowRNN(nn.Module):
    """An image read row by row by a GRU or LSTM; the features: the last layer's last hidden state."""

    def __init__(self, cell: Cell):
        super().__init__()
        rnn = nn.GRU if cell.recurrent == "gru" else nn.LSTM
        layers = min(cell.depth, 2)
        self.rnn = rnn(side(cell.dataset), cell.width, num_layers=layers, batch_first=True,
                       dropout=cell.dropout if layers > 1 else 0.0)

    def forward(self, x):
        _, hidden = self.rnn(x.squeeze(1))
        if isinstance(hidden, tuple):  # LSTM: (h, c)
            hidden = hidden[0]
        return hidden[-1]


def multihead_trunk(cell: Cell) -> tuple[nn.Module, int]:
    """A shared trunk (convs, then a linear layer) for several task heads."""
    convs, features = cnn_trunk(replace(cell, depth=min(cell.depth, 2), width=16, dropout=0.0))
    return nn.Sequential(convs, nn.Linear(features, cell.width), act(cell)), cell.width


def trunk(cell: Cell) -> tuple[nn.Module, int]:
    if cell.family == "mlp":
        return mlp_trunk(cell)
    if cell.family == "cnn":
        return cnn_trunk(cell)
    if cell.family == "resnet":
        return resnet_trunk(cell)
    if cell.family == "attention":
        return PatchTransformer(cell), cell.width
    if cell.family == "recurrent":
        return RowRNN(cell), cell.width
    if cell.family == "multihead":
        return multihead_trunk(cell)
    raise ValueError(f"unknown family {cell.family!r}")


class Net(nn.Module):
    """``trunk`` → (``neck``) → ``head``, with auxiliary heads on the features. The modules are
    registered in the order ``cell.head_position`` says; ``forward`` is the same whatever it."""

    def __init__(self, cell: Cell):
        super().__init__()
        self.cell = cell  # the user's training loop reads its optimizer and epochs here
        features = trunk(cell)[1]
        aux_name = "task_heads" if cell.family == "multihead" else "aux_heads"
        self.aux_name = aux_name
        self.aux_weight = 1.0 if cell.family == "multihead" else AUX_WEIGHT
        make = {
            "trunk": lambda: trunk(cell)[0],
            "head": lambda: nn.Linear(features, NUM_CLASSES),
            aux_name: lambda: nn.ModuleList(nn.Linear(features, AUX_TARGETS[k % len(AUX_TARGETS)])
                                            for k in range(cell.extra_heads)),
            "neck": lambda: nn.Linear(features, features),
        }
        if cell.head_position == "first":
            order = ["head", "trunk", aux_name]
        elif cell.head_position == "not_last":
            order = ["trunk", "head", aux_name] if cell.extra_heads else ["trunk", "head", "neck", aux_name]
        else:
            order = ["trunk", aux_name, "head"]
        for name in order:
            setattr(self, name, make[name]())
        self.has_neck = "neck" in order
        self.head_prefix = "head."
        self._aux_outputs: list[torch.Tensor] = []
        freeze_leading(self.trunk, cell.frozen_fraction)

    def forward(self, x):
        features = self.trunk(x)
        if self.has_neck:
            features = torch.relu(self.neck(features))
        heads = getattr(self, self.aux_name)
        self._aux_outputs = [aux(features) for aux in heads] if self.training else []
        return self.head(features)

    def extra_loss(self, labels: torch.Tensor) -> torch.Tensor | float:
        """The auxiliary heads' loss on their side targets of ``labels`` (0 without them)."""
        total = 0.0
        for k, outputs in enumerate(self._aux_outputs):
            total = total + self.aux_weight * F.cross_entropy(outputs, labels % AUX_TARGETS[k % len(AUX_TARGETS)])
        return total


def freeze_leading(module: nn.Module, fraction: float) -> list[str]:
    """``requires_grad = False`` on the leading parameters of ``module`` (registration order)
    holding at most ``fraction`` of its weights (at least one array when ``fraction`` > 0);
    returns their names."""
    if fraction <= 0:
        return []
    parameters = list(module.named_parameters())
    total, frozen, names = sum(p.numel() for _, p in parameters), 0, []
    for name, parameter in parameters:
        if names and frozen + parameter.numel() > fraction * total:
            break
        parameter.requires_grad = False
        frozen += parameter.numel()
        names.append(name)
    return names


def build_model(cell: Cell) -> nn.Module:
    return Net(cell)
