"""The layout check: where each part of a run goes and what it needs, before any weight loads; a
layout that cannot fit the visible GPUs is refused with what to move (GPUs faked: the sizes are
arithmetic on configs, nothing is allocated)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vprl.train.recipe import layout
from vprl.train.recipe.checks import reward_config
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.rl_config import parse_rl_config

REPO = Path(__file__).resolve().parents[1]


def _plan(recipe: str, gpus: list[float], *extra: str, queries=("Is there a red car?",)):
    cfg = parse_rl_config(["--config", str(REPO / "configs" / recipe), *extra])
    stack = yaml.safe_load((REPO / cfg.executor.tool_stack).read_text())
    return layout.plan_layout(cfg, stack, reward_config(cfg), list(queries), gpus)


def test_the_unit_test_recipe_on_one_80_gb_gpu_is_refused_naming_what_to_move():
    plan = _plan("grpo_codellama_gqa_unit_tests.yaml", [80.0])
    names = {c.name: c for c in plan.components}
    assert names["unit-test writer"].gib == pytest.approx(32.0) and names["policy vLLM (colocate)"].gib == 24.0
    assert names["unit-test layout LLM"].gib == pytest.approx(32.0) and names["unit-test image generator"].gib > 2
    assert 12 < names["tool vqa, caption"].gib < 15  # BLIP-2 Flan-T5-XXL in 8-bit, shared by two tools
    with pytest.raises(ConfigError, match=r"unit-test writer .*python -m vprl\.train\.prepare_unit_tests") as err:
        plan.check()
    assert "tool_service" in str(err.value) and "policy (training)" in str(err.value)


def test_served_tools_and_a_prepared_cache_make_it_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "_prepared", lambda settings, cfg, queries: True)
    plan = _plan("grpo_codellama_gqa_unit_tests.yaml", [80.0], "--tool_service", "auto")
    plan.check()
    assert 20 < plan.per_gpu < 80 * layout.HEADROOM
    assert {c.where for c in plan.components if c.name.startswith("tool ")} == {"the tool service"}
    assert "per training GPU" in plan.render()


def test_sizes_come_from_a_local_config_when_there_is_one(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(tmp_path / "m")
    size = layout.model_size(str(tmp_path / "m"))
    assert size.params == sum(p.numel() for p in model.parameters()) and (size.hidden, size.layers) == (64, 2)
    with pytest.raises(ConfigError, match=r"no size for 'nobody/unknown-model'.*model_sizes\.yaml"):
        layout.model_size("nobody/unknown-model")


def test_without_a_gpu_everything_is_on_the_cpu():
    plan = _plan("quickstart.yaml", [])
    plan.check()
    assert "no GPU visible" in plan.render()
