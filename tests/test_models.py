"""Models: output shapes, the papers' layer sizes, seeded init, layer selection."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterfed.models import (
    AUTO_MODEL,
    LAYER_RULES,
    MODELS,
    build_model,
    layer_names,
    num_parameters_bytes,
    resolve_model_name,
    select_layers,
)

# (model, native input shape); lenet5 appears at both of its native sizes.
NATIVE_INPUTS = [
    ("mnist-cnn", (1, 28, 28)),
    ("fmnist-cnn", (1, 28, 28)),
    ("lenet5", (1, 28, 28)),
    ("selection-cnn", (1, 28, 28)),
    ("cifar-cnn", (3, 32, 32)),
    ("lenet5", (3, 32, 32)),
    ("digits-cnn", (1, 8, 8)),
]
NATIVE_SHAPE = {"mnist-cnn": (1, 28, 28), "fmnist-cnn": (1, 28, 28), "lenet5": (1, 28, 28),
                "selection-cnn": (1, 28, 28), "cifar-cnn": (3, 32, 32), "digits-cnn": (1, 8, 8)}


def _keys(*layers: str) -> list[str]:
    return [f"{layer}.{suffix}" for layer in layers for suffix in ("weight", "bias")]


# Expected selection per model and rule, as layer names.
EXPECTED_SELECTION = {
    "mnist-cnn": {"final": ["fc1"], "smallest-fc": ["fc1"], "conv": ["conv2"], "fc": ["fc1"]},
    "fmnist-cnn": {"final": ["fc1"], "smallest-fc": ["fc1"], "conv": ["conv2"], "fc": ["fc1"]},
    "cifar-cnn": {"final": ["fc1"], "smallest-fc": ["fc1"], "conv": ["conv2"], "fc": ["fc1"]},
    "lenet5": {"final": ["fc3"], "smallest-fc": ["fc3"], "conv": ["conv2"], "fc": ["fc1"]},
    "selection-cnn": {"final": ["fc2"], "smallest-fc": ["fc2"], "conv": ["conv2"], "fc": ["fc1"]},
    "digits-cnn": {"final": ["fc2"], "smallest-fc": ["fc2"], "conv": ["conv2"], "fc": ["fc1"]},
}


@pytest.fixture(scope="module")
def native_models():
    return {name: build_model(name, "x", shape, 10) for name, shape in NATIVE_SHAPE.items()}


def test_registry_lists_every_model():
    assert set(MODELS) == set(EXPECTED_SELECTION)
    assert set(AUTO_MODEL.values()) <= set(MODELS)


@pytest.mark.parametrize(("name", "shape"), NATIVE_INPUTS)
def test_output_shape_at_native_input(name, shape):
    model = build_model(name, "x", shape, num_classes=7)
    with torch.no_grad():
        out = model(torch.zeros(2, *shape))
    assert out.shape == (2, 7)


def test_paper_fc_sizes():
    assert build_model("mnist-cnn", "mnist", (1, 28, 28), 10).fc1.in_features == 800
    assert build_model("fmnist-cnn", "fmnist", (1, 28, 28), 10).fc1.in_features == 512
    assert build_model("cifar-cnn", "cifar10", (3, 32, 32), 10).fc1.in_features == 400
    for shape in [(1, 28, 28), (3, 32, 32)]:
        lenet = build_model("lenet5", "x", shape, 10)
        assert (lenet.fc1.in_features, lenet.fc1.out_features) == (400, 120)
        assert (lenet.fc2.in_features, lenet.fc2.out_features) == (120, 84)
        assert (lenet.fc3.in_features, lenet.fc3.out_features) == (84, 10)
    assert build_model("digits-cnn", "digits", (1, 8, 8), 10).fc1.in_features == 128


def test_no_batchnorm_every_entry_is_a_weight_or_bias(native_models):
    for model in native_models.values():
        assert all(key.endswith((".weight", ".bias")) for key in model.state_dict())
        assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


def test_input_too_small_is_a_clear_value_error():
    with pytest.raises(ValueError, match="mnist-cnn cannot take 8x8"):
        build_model("mnist-cnn", "digits", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="square"):
        build_model("cifar-cnn", "cifar10", (3, 32, 28), 10)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("rule", ["final", "smallest-fc", "conv", "fc"])
def test_select_layers_per_model_and_rule(native_models, name, rule):
    model = native_models[name]
    assert select_layers(model, rule) == _keys(*EXPECTED_SELECTION[name][rule])


@pytest.mark.parametrize("name", MODELS)
def test_select_all_and_layer_names(native_models, name):
    state_dict = native_models[name].state_dict()
    assert select_layers(state_dict, "all") == list(state_dict)
    names = layer_names(list(state_dict))
    assert names[:2] == ["conv1", "conv2"]
    assert all(n.startswith("fc") for n in names[2:])


def test_selection_from_numpy_state_dict_and_alias(native_models):
    torch_sd = native_models["lenet5"].state_dict()
    numpy_sd = {k: v.numpy() for k, v in torch_sd.items()}
    for rule in LAYER_RULES:
        assert select_layers(numpy_sd, rule) == select_layers(torch_sd, rule)
    assert select_layers(numpy_sd, "smallest_fc") == _keys("fc3")


def test_explicit_names_and_keys(native_models):
    model = native_models["lenet5"]
    # State-dict order, whatever the order asked for.
    assert select_layers(model, "fc1,conv2") == _keys("conv2", "fc1")
    assert select_layers(model, " fc2 , fc2.weight ") == _keys("fc2")
    assert select_layers(model, "conv1.bias") == ["conv1.bias"]


def test_unknown_layer_lists_available(native_models):
    with pytest.raises(ValueError, match=r"'fc9'.*available layers: conv1, conv2, fc1, fc2, fc3"):
        select_layers(native_models["lenet5"], "fc1,fc9")


def test_num_parameters_bytes(native_models):
    state_dict = native_models["mnist-cnn"].state_dict()
    assert num_parameters_bytes(state_dict, _keys("fc1")) == 4 * (800 * 10 + 10)
    # float64 numpy arrays are still counted as float32 (what goes on the wire).
    as_f64 = {k: v.numpy().astype(np.float64) for k, v in state_dict.items()}
    assert num_parameters_bytes(as_f64, _keys("fc1")) == 4 * (800 * 10 + 10)


def test_same_seed_same_weights_different_seed_different():
    a = build_model("digits-cnn", "digits", (1, 8, 8), 10, seed=3)
    b = build_model("digits-cnn", "digits", (1, 8, 8), 10, seed=3)
    c = build_model("digits-cnn", "digits", (1, 8, 8), 10, seed=4)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key])
    assert not all(torch.equal(v, c.state_dict()[k]) for k, v in a.state_dict().items())


def test_build_model_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model("digits-cnn", "digits", (1, 8, 8), 10, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_auto_resolution():
    for dataset, model in AUTO_MODEL.items():
        assert resolve_model_name("auto", dataset) == model
    assert resolve_model_name("lenet5", "mnist") == "lenet5"
    assert isinstance(build_model("auto", "mnist", (1, 28, 28), 10), type(build_model("mnist-cnn", "x", (1, 28, 28), 10)))
    with pytest.raises(ValueError, match="digits-cnn"):
        resolve_model_name("resnet", "mnist")
    with pytest.raises(ValueError, match="no default"):
        resolve_model_name("auto", "imagenet")
