"""Layer selection by rule on state-dict keys: no torch needed (the server's algorithms
use it on dicts of numpy arrays; a torch module works the same and is read more exactly).

A *layer* is a state-dict prefix (``layer1.0.conv1`` of ``layer1.0.conv1.weight``); only its
compared arrays (``parameters.compared_names``: trainable floating-point arrays, buffers
such as BatchNorm running statistics excluded) belong to a selection. A layer's kind comes
from its ``.weight``: 3-, 4- or 5-D = convolution (Conv1d/2d/3d), 2-D = fully connected —
unless its name marks an embedding (``EMBEDDING_NAME``). 1-D weights (BatchNorm, LayerNorm,
GroupNorm) make no layer of either kind; a GRU/LSTM's ``weight_ih_l0`` and an attention
block's ``in_proj_weight`` are not ``.weight`` and so neither conv nor fc, but they count for
``final``. Given a torch module, the kinds come from the module types instead
(``nn.Linear`` = fc, ``nn.Conv*`` = conv, ``nn.Embedding`` neither).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from clusterfed.models.parameters import trainable_names

from .parameters import AUTO, Selector, compared_names

LAYER_RULES = ("final", "smallest-fc", "conv", "fc", "all")
CONV_NDIMS = (3, 4, 5)
# a 2-D ``.weight`` whose layer is named like this is an embedding table, not a linear layer
EMBEDDING_NAME = re.compile(r"emb|^wte$|^wpe$|lookup", re.IGNORECASE)


def _layer_of(key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else key


def weight_unit_of(key: str, keys: Collection[str]) -> str:
    """The layer an array belongs to where a module holds several weights, each with its own
    bias named alike beside ``weight``/``bias`` (a recurrent layer's ``weight_ih_l0`` and
    ``bias_ih_l0``; attention's ``in_proj_weight`` and ``in_proj_bias``): the prefix with the
    rest of that name (``rnn.ih_l0``, ``attn.in_proj``), when ``keys`` hold both; otherwise the
    module (``_layer_of``: weight norm's ``weight_g`` and ``weight_v``, a lone ``bias_k``)."""
    prefix, dot, last = key.rpartition(".")
    words = last.split("_")
    for word, other in (("weight", "bias"), ("bias", "weight")):
        if word in words and len(words) > 1:
            partner = prefix + dot + "_".join(other if w == word else w for w in words)
            if partner not in keys:
                break
            rest = "_".join(w for w in words if w != word)
            return f"{prefix}.{rest}" if prefix else rest
    return _layer_of(key)


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


def _module_kinds(model: Any) -> dict[str, str] | None:
    """Layer prefix -> ``conv`` / ``fc`` / ``other`` from a torch module's submodule types;
    None for a state dict."""
    if not callable(getattr(model, "named_modules", None)):
        return None
    import torch.nn as nn

    kinds = {}
    for prefix, module in model.named_modules():
        if isinstance(module, nn.modules.conv._ConvNd):
            kinds[prefix] = "conv"
        elif isinstance(module, nn.Linear):
            kinds[prefix] = "fc"
        else:
            kinds[prefix] = "other"
    return kinds


def _kind_by_name(layer: str, weight: Any) -> str:
    ndim = _ndim(weight)
    if ndim in CONV_NDIMS:
        return "conv"
    if ndim == 2 and not EMBEDDING_NAME.search(layer.rsplit(".", 1)[-1]):
        return "fc"
    return "other"


def select_layers(model_or_state_dict: Any, rule: str, compare: Selector = AUTO) -> list[str]:
    """State-dict keys of the layers ``rule`` picks, in state-dict order: each picked
    layer's compared arrays (weight and bias; never a buffer).

    Rules: ``final`` (the last layer with a compared array of two or more dimensions: the
    classifier head, not a trailing norm layer), ``smallest-fc`` / ``smallest_fc`` (the
    fully connected layer with the fewest compared parameters), ``conv`` (the last
    convolution), ``fc`` (the first fully connected layer), ``all`` (every compared array);
    otherwise a comma-separated list of layer names (``fc1,conv2``) or exact keys
    (``fc1.weight``). Named rules take precedence over a layer that happens to carry the
    same name. ``compare``: which arrays count (``parameters.compared_names``); given a torch
    module and ``"auto"``, its trainable parameters (a tied weight once).
    """
    state_dict = _as_state_dict(model_or_state_dict)
    keys = list(state_dict.keys())
    kinds = _module_kinds(model_or_state_dict)
    if kinds is not None and (compare is None or compare == AUTO):
        compare = trainable_names(model_or_state_dict)
    compared = set(compared_names(state_dict, compare))
    layers = layer_names(keys)
    keys_by_layer: dict[str, list[str]] = {layer: [] for layer in layers}
    for key in keys:
        if key in compared:
            keys_by_layer[_layer_of(key)].append(key)
    layers = [layer for layer in layers if keys_by_layer[layer]]

    def kind(layer: str) -> str:
        weight = f"{layer}.weight"
        if weight not in compared:
            return "other"
        if kinds is not None and layer in kinds:
            return kinds[layer]
        return _kind_by_name(layer, state_dict[weight])

    kind_of = {layer: kind(layer) for layer in layers}
    normalized = rule.strip().lower().replace("_", "-")
    if normalized in LAYER_RULES:
        return _keys_by_rule(normalized, keys, state_dict, compared, keys_by_layer, kind_of)
    return _keys_by_name(rule, keys, state_dict, compared, keys_by_layer)


def _keys_by_rule(normalized: str, keys: list[str], state_dict: Mapping[str, Any], compared: set[str],
                  keys_by_layer: dict[str, list[str]], kind_of: dict[str, str]) -> list[str]:
    """The keys a named rule (one of ``LAYER_RULES``) picks; ``kind_of`` maps each layer with
    compared arrays to its kind, in state-dict order."""
    layers = list(kind_of)
    conv_layers = [layer for layer in layers if kind_of[layer] == "conv"]
    fc_layers = [layer for layer in layers if kind_of[layer] == "fc"]

    if normalized == "all":
        return [key for key in keys if key in compared]
    if normalized == "final":
        with_matrix = [layer for layer in layers if any(_ndim(state_dict[k]) >= 2 for k in keys_by_layer[layer])]
        if not with_matrix:
            raise ValueError(f"rule 'final': no compared array has two or more dimensions among {', '.join(layers)}")
        return list(keys_by_layer[with_matrix[-1]])
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
    # "fc", the one rule left
    if not fc_layers:
        raise ValueError(f"rule 'fc': no fully connected layer among {', '.join(layers)}")
    return list(keys_by_layer[fc_layers[0]])


def _keys_by_name(rule: str, keys: list[str], state_dict: Mapping[str, Any], compared: set[str],
                  keys_by_layer: dict[str, list[str]]) -> list[str]:
    """The keys a comma-separated list of layer names or exact keys picks."""
    layers = [layer for layer, layer_keys in keys_by_layer.items() if layer_keys]
    wanted: set[str] = set()
    names = [name.strip() for name in rule.split(",") if name.strip()]
    if not names:
        raise ValueError(f"empty layer rule; use one of {', '.join(LAYER_RULES)} or layer names: {', '.join(layers)}")
    unknown, not_compared = [], []
    units: dict[str, list[str]] = {}  # a recurrent layer's weights by the names round lines give them (rnn.ih_l0)
    for key in keys:
        if key in compared:
            units.setdefault(weight_unit_of(key, compared), []).append(key)
    for name in names:
        if name in keys_by_layer and keys_by_layer[name]:
            wanted.update(keys_by_layer[name])
        elif name in units:
            wanted.update(units[name])
        elif name in compared:
            wanted.add(name)
        elif name in state_dict:
            not_compared.append(name)
        else:
            unknown.append(name)
    if not_compared:
        raise ValueError(f"{', '.join(map(repr, not_compared))}: not compared (a buffer, or outside "
                         f"compare-arrays); layers that are: {', '.join(layers)}")
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


def both_ends(items: list[Any], most: int) -> list[Any]:
    """At most ``most`` of ``items`` (layers in state-dict order): all of them, or the first
    ``most // 2`` and the last ``most - most // 2``. A shift of the inputs (rotated images)
    shows first near the input, a shift of the labels near the head."""
    if len(items) <= most:
        return list(items)
    first = most // 2
    return list(items[:first]) + list(items[len(items) - (most - first):])


def matrix_layers(model_or_state_dict: Any, compare: Selector = AUTO) -> dict[str, list[str]]:
    """Layer -> its compared keys, for every layer with a compared array of two or more
    dimensions (convolutions, linear layers, embeddings, recurrent and attention weights), in
    state-dict order: the candidates a layer choice by evidence scores. A module holding
    several weights each with its own bias gives a layer per weight (``weight_unit_of``: a
    recurrent layer's input and hidden weights)."""
    state_dict = _as_state_dict(model_or_state_dict)
    if _module_kinds(model_or_state_dict) is not None and (compare is None or compare == AUTO):
        compare = trainable_names(model_or_state_dict)
    compared = compared_names(state_dict, compare)
    keys_by_layer: dict[str, list[str]] = {}
    for key in compared:
        keys_by_layer.setdefault(weight_unit_of(key, compared), []).append(key)
    return {layer: keys for layer, keys in keys_by_layer.items() if any(_ndim(state_dict[k]) >= 2 for k in keys)}
