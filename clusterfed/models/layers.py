"""Layer selection by rule on state-dict keys: no torch needed (the server's algorithms
use it on dicts of numpy arrays; a torch module's state dict works the same).

A layer's kind comes from its weight's number of dimensions (4 = conv, 2 = linear).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LAYER_RULES = ("final", "smallest-fc", "conv", "fc", "all")


def _layer_of(key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else key


def layer_names(state_dict_keys: list[str]) -> list[str]:
    """Ordered, unique layer prefixes, e.g. ``["conv1", "conv2", "fc1", "fc2"]``."""
    return list(dict.fromkeys(_layer_of(key) for key in state_dict_keys))


def _as_state_dict(model_or_state_dict: Any) -> Mapping[str, Any]:
    if callable(getattr(model_or_state_dict, "state_dict", None)):  # a torch module
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
