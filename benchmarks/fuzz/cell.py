"""A fuzz cell: everything one draw decides, as plain JSON-able values (``draw_cell``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

FAMILIES = ("mlp", "cnn", "resnet", "attention", "recurrent", "multihead")
NORMS = ("batch", "group", "none")  # ResNet-style only
ACTIVATIONS = ("relu", "gelu", "tanh", "silu", "leaky_relu")
HEAD_POSITIONS = ("last", "first", "not_last")  # the head's place among the state_dict's entries
OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "adamw")
# per optimizer, learning rates that train every family within a few rounds of a few local steps
LEARNING_RATES = {"sgd": (0.1, 0.3), "sgd_momentum": (0.02, 0.05), "adam": (2e-3, 5e-3), "adamw": (2e-3, 5e-3)}
DATASETS = ("mnist", "digits")
SHIFTS = ("label_swap", "rotation", "label_skew", "iid")
SHIFT_WEIGHTS = (0.27, 0.27, 0.26, 0.2)  # the IID control in one cell of five
HELD_OUT_START = 1000  # seeds from here on are the held-out range


@dataclass(frozen=True)
class Cell:
    """One drawn cell. ``groups`` is 1 for the IID control (no groups to find)."""

    seed: int
    family: str
    width: int
    depth: int
    activation: str
    dropout: float
    norm: str  # "batch" | "group" | "none" (ResNet-style; "none" elsewhere)
    recurrent: str  # "gru" | "lstm" (recurrent family; "" elsewhere)
    frozen_fraction: float  # the share of the trunk's parameters (from the input on) with requires_grad False
    head_position: str
    extra_heads: int  # auxiliary heads beside the classifier (a multi-head model has at least one)
    optimizer: str
    lr: float
    local_epochs: int
    batch_size: int
    dataset: str
    shift: str
    groups: int
    clients: int
    participation: float  # fraction of clients trained per round (1.0 or 0.5)
    train_examples: int  # per client
    test_examples: int  # per client

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | dict) -> "Cell":
        return cls(**(json.loads(text) if isinstance(text, str) else text))

    def label(self) -> str:
        """A short name: ``#7 cnn/w16d2 mnist rotation 3g×12c``."""
        extra = f"/{self.norm}" if self.family == "resnet" else f"/{self.recurrent}" if self.recurrent else ""
        return (f"#{self.seed} {self.family}{extra}/w{self.width}d{self.depth} {self.dataset} {self.shift} "
                f"{self.groups}g×{self.clients}c{'' if self.participation == 1.0 else ' half'}")


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def draw_cell(seed: int) -> Cell:
    """The cell of ``seed``: every choice from one generator seeded by ``seed`` alone."""
    rng = np.random.default_rng([20261129, int(seed)])
    family = _pick(rng, FAMILIES)
    width = int(_pick(rng, {"mlp": (32, 64, 128), "cnn": (8, 16, 32), "resnet": (8, 16), "attention": (16, 32),
                            "recurrent": (16, 32, 64), "multihead": (32, 64)}[family]))
    depth = int(rng.integers(1, 4))  # hidden layers / conv layers / residual blocks / encoder layers / RNN layers
    optimizer = _pick(rng, OPTIMIZERS)
    shift = SHIFTS[int(rng.choice(len(SHIFTS), p=SHIFT_WEIGHTS))]
    groups = 1 if shift == "iid" else int(rng.integers(2, 6))
    clients = int(rng.integers(6, 41))
    clients = max(clients, 2 * groups)
    return Cell(
        seed=int(seed), family=family, width=width, depth=depth,
        activation=_pick(rng, ACTIVATIONS), dropout=float(_pick(rng, (0.0, 0.0, 0.1, 0.3))),
        norm=_pick(rng, NORMS) if family == "resnet" else "none",
        recurrent=_pick(rng, ("gru", "lstm")) if family == "recurrent" else "",
        frozen_fraction=float(_pick(rng, (0.0, 0.0, 0.25, 0.5))),
        head_position=_pick(rng, HEAD_POSITIONS),
        extra_heads=int(rng.integers(1, 3)) if family == "multihead" else int(_pick(rng, (0, 0, 0, 1))),
        optimizer=optimizer, lr=float(_pick(rng, LEARNING_RATES[optimizer])),
        local_epochs=int(rng.integers(1, 4)), batch_size=int(_pick(rng, (16, 16, 32))),
        dataset=_pick(rng, DATASETS), shift=shift, groups=groups, clients=clients,
        participation=float(_pick(rng, (1.0, 0.5))), train_examples=128, test_examples=64)
