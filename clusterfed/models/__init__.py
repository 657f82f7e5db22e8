"""Model registry, seeded construction and layer selection.

Which arrays are compared (``parameters.py``: trainable floating-point arrays, buffers
excluded) and layer selection (``layers.py``) work on state-dict keys, dtypes and shapes, so
they give the same answer for a state dict of tensors or a dict of numpy arrays (what a
Flower client/server holds); given a module, layer selection reads its module types.
"""

from __future__ import annotations

from typing import Any

from clusterfed.datasets.sources import BUILT_IN

from .layers import LAYER_RULES, layer_names, num_parameters_bytes, select_layers
from .parameters import BUFFER_NAMES, compared_names, trainable_names

MODELS = ("mnist-cnn", "fmnist-cnn", "cifar-cnn", "lenet5", "selection-cnn", "digits-cnn")
# what model = "auto" builds for each built-in data set (its ``default_model``)
AUTO_MODEL = {name: dataset.default_model for name, dataset in BUILT_IN.items()}

__all__ = [
    "AUTO_MODEL",
    "BUFFER_NAMES",
    "LAYER_RULES",
    "MODELS",
    "build_model",
    "compared_names",
    "layer_names",
    "num_parameters_bytes",
    "resolve_model_name",
    "select_layers",
    "trainable_names",
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
) -> Any:
    """Build a model (a ``torch.nn.Module``) with a seeded initialisation.

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
    import torch  # here, so that layer selection and the registry need no torch

    from .cnns import MODEL_CLASSES

    # devices=[]: only the CPU generator is forked; init runs on CPU anyway, and this
    # avoids touching (or warning about) CUDA devices.
    with torch.random.fork_rng(devices=[]):
        # the CPU generator only (init runs on CPU): torch.manual_seed would also seed every
        # accelerator backend, which costs ~1 ms a call and is not undone by fork_rng here
        torch.random.default_generator.manual_seed(seed)
        return MODEL_CLASSES[name](in_channels=in_channels, num_classes=num_classes, image_size=height)
