"""Model registry, seeded construction and layer selection (ALGORITHMS.md, "Shared machinery").

Layer selection works on state-dict keys only and tells conv from fully connected
layers by the weight's number of dimensions (4 = conv, 2 = linear), so it gives the
same answer for a module, a state dict of tensors, or a dict of numpy arrays (what a
Flower client/server holds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .cnns import MODEL_CLASSES

MODELS = ("mnist-cnn", "fmnist-cnn", "cifar-cnn", "lenet5", "selection-cnn", "digits-cnn")
AUTO_MODEL = {
    "digits": "digits-cnn",
    "mnist": "mnist-cnn",
    "fmnist": "fmnist-cnn",
    "emnist-letters": "mnist-cnn",
    "cifar10": "cifar-cnn",
    "svhn": "cifar-cnn",
}
LAYER_RULES = ("final", "smallest-fc", "conv", "fc", "all")

__all__ = [
    "AUTO_MODEL",
    "LAYER_RULES",
    "MODELS",
    "build_model",
    "layer_names",
    "num_parameters_bytes",
    "resolve_model_name",
    "select_layers",
]


def resolve_model_name(model: str, dataset: str) -> str:
    """Map ``"auto"`` to the dataset's default model; check that the name is known."""
    if model == "auto":
        if dataset not in AUTO_MODEL:
            raise ValueError(
                f"model='auto' has no default for dataset {dataset!r}; "
                f"known datasets: {', '.join(AUTO_MODEL)}; or name a model: {', '.join(MODELS)}"
            )
        return AUTO_MODEL[dataset]
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of: auto, {', '.join(MODELS)}")
    return model


def build_model(
    model: str,
    dataset: str,
    input_shape: tuple[int, int, int],
    num_classes: int,
    seed: int = 0,
) -> nn.Module:
    """Build a model with a seeded initialisation.

    Every client and the server call this with the same seed and get the same θ0,
    which the clustering rounds need (updates are compared from a common start).
    The global RNG state is left untouched (``fork_rng``).
    """
    name = resolve_model_name(model, dataset)
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (channels, height, width), got {tuple(input_shape)}")
    in_channels, height, width = (int(v) for v in input_shape)
    if height != width:
        raise ValueError(f"{name} needs square inputs, got {height}x{width}")
    if in_channels < 1 or height < 1:
        raise ValueError(f"invalid input_shape {tuple(input_shape)}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    # devices=[]: only the CPU generator is forked; init runs on CPU anyway, and this
    # avoids touching (or warning about) CUDA devices.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODEL_CLASSES[name](in_channels=in_channels, num_classes=num_classes, image_size=height)


def _layer_of(key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else key


def layer_names(state_dict_keys: list[str]) -> list[str]:
    """Ordered, unique layer prefixes, e.g. ``["conv1", "conv2", "fc1", "fc2"]``."""
    return list(dict.fromkeys(_layer_of(key) for key in state_dict_keys))


def _as_state_dict(model_or_state_dict: Any) -> Mapping[str, Any]:
    if isinstance(model_or_state_dict, nn.Module):
        return model_or_state_dict.state_dict()
    if isinstance(model_or_state_dict, Mapping):
        return model_or_state_dict
    raise TypeError(
        f"expected an nn.Module or a state dict mapping, got {type(model_or_state_dict).__name__}"
    )


def _ndim(value: Any) -> int:
    return len(tuple(value.shape))


def select_layers(model_or_state_dict: Any, rule: str) -> list[str]:
    """State-dict keys (weight and bias) of the layers ``rule`` picks, in state-dict order.

    Rules: ``final`` (last layer with weights), ``smallest-fc`` / ``smallest_fc``
    (the linear layer with the fewest parameters), ``conv`` (last conv layer),
    ``fc`` (first linear layer), ``all``; otherwise a comma-separated list of layer
    names (``fc1,conv2``) or exact keys (``fc1.weight``). Named rules take precedence
    over a layer that happens to carry the same name.
    """
    state_dict = _as_state_dict(model_or_state_dict)
    keys = list(state_dict.keys())
    layers = layer_names(keys)
    keys_by_layer: dict[str, list[str]] = {layer: [] for layer in layers}
    for key in keys:
        keys_by_layer[_layer_of(key)].append(key)

    # A layer's kind comes from its weight tensor: 4-D conv, 2-D linear.
    weight_ndim = {
        layer: _ndim(state_dict[f"{layer}.weight"]) for layer in layers if f"{layer}.weight" in state_dict
    }
    conv_layers = [layer for layer in layers if weight_ndim.get(layer) == 4]
    fc_layers = [layer for layer in layers if weight_ndim.get(layer) == 2]

    normalized = rule.strip().lower().replace("_", "-")
    if normalized == "all":
        return keys
    if normalized == "final":
        if not weight_ndim:
            raise ValueError("rule 'final': the state dict has no layer with a weight")
        return list(keys_by_layer[list(weight_ndim)[-1]])
    if normalized == "smallest-fc":
        if not fc_layers:
            raise ValueError(f"rule 'smallest-fc': no fully connected layer among {', '.join(layers)}")

        def layer_size(layer: str) -> int:
            return sum(_numel(state_dict[key]) for key in keys_by_layer[layer])

        # min() keeps the first on ties: the earliest of equally small layers.
        return list(keys_by_layer[min(fc_layers, key=layer_size)])
    if normalized == "conv":
        if not conv_layers:
            raise ValueError(f"rule 'conv': no conv layer among {', '.join(layers)}")
        return list(keys_by_layer[conv_layers[-1]])
    if normalized == "fc":
        if not fc_layers:
            raise ValueError(f"rule 'fc': no fully connected layer among {', '.join(layers)}")
        return list(keys_by_layer[fc_layers[0]])

    # Explicit names: layer prefixes or exact keys, comma-separated.
    wanted: set[str] = set()
    names = [name.strip() for name in rule.split(",") if name.strip()]
    if not names:
        raise ValueError(f"empty layer rule; use one of {', '.join(LAYER_RULES)} or layer names: {', '.join(layers)}")
    unknown = []
    for name in names:
        if name in keys_by_layer:
            wanted.update(keys_by_layer[name])
        elif name in state_dict:
            wanted.add(name)
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(
            f"unknown layer(s) {', '.join(map(repr, unknown))}; rules: {', '.join(LAYER_RULES)}; "
            f"available layers: {', '.join(layers)}"
        )
    return [key for key in keys if key in wanted]


def _numel(value: Any) -> int:
    count = 1
    for dim in tuple(value.shape):
        count *= int(dim)
    return count


def num_parameters_bytes(state_dict: Mapping[str, Any], keys: list[str]) -> int:
    """Bytes of the named arrays as float32 (4 bytes per element), whatever their dtype."""
    return sum(4 * _numel(state_dict[key]) for key in keys)
