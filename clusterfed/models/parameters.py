"""Which of a model's arrays are *compared*: their updates enter distances, split criteria,
layer rules and stability scores. Everything else (buffers: BatchNorm running statistics,
counters, masks, scalars) is only aggregated per cluster (``core/exchange.py``).

Torch-free: the server holds state dicts of numpy arrays. ``trainable_names`` is the one
torch helper, for a user who wants the exact set of a module's trainable parameters.

The default (``"auto"``) compares an array when it is floating-point, has at least one
dimension, and the last component of its name is not a known buffer name
(``BUFFER_NAMES``). A state dict does not say which entries are parameters, so the
default goes by dtype and name; a selector (a regular expression, a list of exact names,
or a predicate ``(name, array) -> bool``) overrides it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import numpy as np

AUTO = "auto"

# Last name components that torch registers as buffers in common models, floating ones
# included (integer and bool buffers are excluded by dtype anyway):
BUFFER_NAMES = frozenset({
    # BatchNorm{1,2,3}d, SyncBatchNorm, InstanceNorm with track_running_stats, LazyBatchNorm
    "running_mean", "running_var", "num_batches_tracked",
    # torch.nn.utils.spectral_norm (old API): the power-iteration vector u; its v is
    # named like weight_norm's trainable weight_v, so it is left to the dtype rule
    "weight_u",
    # torch.nn.utils.parametrizations.spectral_norm: parametrizations.weight.0._u / ._v
    "_u", "_v",
    # fixed position encodings: the PyTorch tutorials' PositionalEncoding.pe, rotary
    # embeddings' inverse frequencies (e.g. Hugging Face Llama, GPT-NeoX)
    "pe", "inv_freq",
    # quantization observers and fake-quant modules
    "min_val", "max_val", "zero_point", "fake_quant_enabled", "observer_enabled",
})

Selector = Union[str, Sequence[str], Callable[[str, Any], bool], None]


def is_floating(value: Any) -> bool:
    """Whether an array (numpy or torch) holds floating-point numbers."""
    check = getattr(value, "is_floating_point", None)
    if callable(check):  # a torch tensor (bfloat16 included, which numpy lacks)
        return bool(check())
    return bool(np.issubdtype(np.asarray(value).dtype, np.floating))


def is_buffer_name(name: str) -> bool:
    """Whether the last component of a state-dict name is a known buffer (``BUFFER_NAMES``)."""
    return name.rsplit(".", 1)[-1] in BUFFER_NAMES


def compared_by_default(name: str, value: Any) -> bool:
    """The default rule: floating-point, at least one dimension, not a known buffer name."""
    return is_floating(value) and len(tuple(value.shape)) > 0 and not is_buffer_name(name)


def compared_names(arrays: Mapping[str, Any], select: Selector = AUTO) -> list[str]:
    """The names of ``arrays`` whose updates are compared, in the mapping's order.

    ``select``: ``"auto"`` / None (the default rule, ``compared_by_default``); a regular
    expression (``re.search`` on the name, among the floating-point arrays); a list of exact
    names (each must be a floating-point array of ``arrays``); or a predicate
    ``(name, array) -> bool`` given every array, which decides alone. ValueError when the
    selection is empty or names an unknown or non-floating array.
    """
    names = list(arrays)
    if select is None or (isinstance(select, str) and select.strip().lower() == AUTO):
        chosen = [n for n in names if compared_by_default(n, arrays[n])]
        how = "the default rule (trainable floating-point arrays, buffers excluded)"
    elif callable(select):
        chosen = [n for n in names if select(n, arrays[n])]
        how = f"the predicate {getattr(select, '__name__', select)!r}"
    elif isinstance(select, str):
        try:
            pattern = re.compile(select)
        except re.error as error:
            raise ValueError(f"compare-arrays {select!r} is not a regular expression: {error}") from None
        chosen = [n for n in names if pattern.search(n) and is_floating(arrays[n])]
        how = f"the name filter {select!r}"
    else:
        wanted = [str(n) for n in select]
        unknown = [n for n in wanted if n not in arrays]
        if unknown:
            raise ValueError(f"compare-arrays names arrays the model does not have: {unknown}; it has {names}")
        integral = [n for n in wanted if not is_floating(arrays[n])]
        if integral:
            raise ValueError(f"compare-arrays names arrays that are not floating-point: {integral} "
                             f"(counters and masks are aggregated, never compared)")
        keep = set(wanted)
        chosen = [n for n in names if n in keep]
        how = "the list of names given"
    if not chosen:
        raise ValueError(f"no array of the model is compared under {how}; its arrays: "
                         + ", ".join(f"{n} {describe(arrays[n])}" for n in names))
    return chosen


def describe(value: Any) -> str:
    """``float32(3, 4)``: an array's dtype and shape, for messages."""
    return f"{str(value.dtype).replace('torch.', '')}{tuple(value.shape)}"


def trainable_names(model: Any) -> list[str]:
    """State-dict names of a torch module's trainable parameters (``requires_grad``), in
    registration order; a tied weight appears once, under its first name. Pass it as a
    strategy's ``compare_arrays`` to compare exactly these."""
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


# An array counts as unchanged when no client moved any of its entries by more than this
# fraction of its largest start value (at least 1): float32 keeps ~7 significant digits, so
# an array sent back as it came (a frozen layer, requires_grad=False) differs by 0, and
# anything below this is rounding, not training.
SILENT_UPDATE_FLOOR = 1e-7


def silent_names(updates: Sequence[Mapping[str, Any]], names: Sequence[str], start: Mapping[str, Any] | None = None,
                 floor: float = SILENT_UPDATE_FLOOR) -> list[str]:
    """The ``names`` whose update is (numerically) zero in every one of ``updates``: arrays
    no client changed, such as a frozen backbone's, which carry no signal about the clients
    and must never decide a distance, a split or a layer choice. ``updates``: one mapping
    per client of name -> update (new weights minus the start's); ``start``: the start
    model, which scales the floor (``SILENT_UPDATE_FLOOR``). Empty when ``updates`` is."""
    if not updates:
        return []
    silent = []
    for name in names:
        scale = 1.0 if start is None else max(1.0, float(np.max(np.abs(np.asarray(start[name], np.float64)), initial=0.0)))
        bound = floor * scale
        if all(float(np.max(np.abs(np.asarray(update[name], np.float64)), initial=0.0)) <= bound for update in updates):
            silent.append(name)
    return silent
