import tomllib
from pathlib import Path

import pytest

from clusterfed.cli import main as cli_main
from clusterfed.config import ConfigError, RunConfig, coerce_value, config_keys, parse_config, parse_overrides

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_key_with_the_schema_default():
    from flwr.common.config import flatten_dict

    from clusterfed.strategies import clustered_classes
    from clusterfed.strategy_config import default_of, own_params

    flower = flatten_dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])
    namespaced = {f"{ns}.{key}": default_of(field) for ns, cls in clustered_classes().items()
                  for key, field in own_params(cls).items()}
    assert set(flower) == set(config_keys()) | set(namespaced)
    assert {**RunConfig().to_flower(), **namespaced} == flower
    assert parse_config(flower) == RunConfig()  # the pyproject's defaults parse, and are the defaults


def test_unknown_key_is_named_with_a_suggestion():
    with pytest.raises(ConfigError) as error:
        parse_config({"num-client": 4})
    message = str(error.value)
    assert "'num-client'" in message and "did you mean 'num-clients'" in message


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("strategy", "fedfoo", "unknown strategy 'fedfoo'; available: fedavg"),
        ("partitioner", "zipf", "label-skew"),
        ("num-clients", 0, "greater than or equal to 1"),
        ("device", "tpu", "'auto', 'cpu' or 'cuda'"),
        ("fedclust.lambda", "big", "'auto'"),
        ("test-fraction", 1.5, "less than 1"),
    ],
)
def test_bad_value_names_key_and_what_is_allowed(key, value, expected):
    with pytest.raises(ConfigError) as error:
        parse_config({key: value})
    assert repr(key) in str(error.value) and expected in str(error.value)


def test_number_or_auto_fields():
    config = parse_config({"strategy": "adacfl", "adacfl.lambda": 1.4, "epsilon": "auto"})
    assert config.strategy_params["lambda"] == 1.4 and config.strategy_params["epsilon"] == "auto"
    strategy = config.build_strategy()
    assert strategy.params.number_or_none(strategy.params.lambda_) == 1.4
    assert strategy.params.number_or_none(strategy.params.epsilon) is None


def test_set_values_are_read_like_toml():
    assert coerce_value("3") == 3 and coerce_value("0.5") == 0.5 and coerce_value("true") is True
    assert coerce_value("fedclust") == "fedclust" and coerce_value('"0,1;2,3"') == "0,1;2,3"
    assert parse_overrides(["label-groups=0,1;2,3"]) == {"label-groups": "0,1;2,3"}
    with pytest.raises(ConfigError):
        parse_overrides(["rounds"])


def test_cli_rejects_bad_config_before_training(tmp_path, capsys):
    code = cli_main(["run", "--engine", "inprocess", "--out", str(tmp_path / "o"), "--set", "rounds=-2"])
    assert code == 2
    assert "'rounds'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_docs_document_every_key():
    reference = (ROOT / "docs" / "configuration.md").read_text()
    missing = [key for key in config_keys() if f"`{key}`" not in reference]
    assert not missing, f"docs/configuration.md lacks config keys: {missing}"
    guide = (ROOT / "docs" / "running.md").read_text()
    missing = [key for key in config_keys() if f"`{key}`" not in guide]
    assert not missing, f"docs/running.md's table of run keys lacks: {missing}"
