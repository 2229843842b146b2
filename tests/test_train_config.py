from dataclasses import dataclass

import pytest

from train.recipe.parsing import ConfigError, parse_config


@dataclass
class Script:
    dataset: str = "shapes"
    max_steps: int = 3


@dataclass
class Extra:
    learning_rate: float = 2e-4


def test_yaml_and_cli_overrides(tmp_path):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("dataset: gqa\nmax_steps: 7\n")
    script, extra = parse_config((Script, Extra), ["--config", str(cfg), "--learning_rate", "0.1"])
    assert (script.dataset, script.max_steps, extra.learning_rate) == ("gqa", 7, 0.1)


def test_unknown_yaml_key_lists_valid_keys(tmp_path):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("max_step: 4\n")
    with pytest.raises(
        ConfigError, match=r"did you mean max_steps\?[\s\S]*valid keys: dataset, learning_rate, max_steps"
    ):
        parse_config((Script, Extra), ["--config", str(cfg)])


def test_unknown_cli_key_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"'learning_rat': did you mean learning_rate"):
        parse_config((Script, Extra), ["--learning_rat", "1"])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        parse_config((Script,), ["--config", str(tmp_path / "nope.yaml")])
