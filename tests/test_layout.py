"""The layout check: where each part of a run goes and what it needs, before any weight loads; a
layout that cannot fit the visible GPUs is refused with what to move (GPUs faked: the sizes are
arithmetic on configs, nothing is allocated)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vprl.data.records import Example
from vprl.executor.tools.stack import stack_path
from vprl.train.recipe import layout
from vprl.train.recipe.checks import reward_config
from vprl.train.recipe.data import prompt_configs
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.prompt_length import CHARS_PER_TOKEN, longest_prompts, measure
from vprl.train.recipe.rl_config import parse_rl_config

REPO = Path(__file__).resolve().parents[1]


def recipe_prompts(cfg, queries) -> list[str]:
    """The recipe's own prompts for `queries` (GQA's images are not here: the examples are made up)."""
    examples = [Example(f"q{i}", "gqa", "vqa", q, "none.jpg") for i, q in enumerate(queries)]
    return longest_prompts(examples, prompt_configs(cfg.prompt, examples))


def _plan(recipe: str, gpus: list[float], *extra: str, queries=("Is there a red car?",), prompts=None):
    cfg = parse_rl_config(["--config", str(REPO / "configs" / recipe), *extra])
    stack = yaml.safe_load(stack_path(cfg.executor.tool_stack).read_text())
    prompts = recipe_prompts(cfg, queries) if prompts is None else prompts
    return layout.plan_layout(cfg, stack, reward_config(cfg), list(queries), gpus, prompts)


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


def test_item5_a_3000_token_prompt_grows_the_plan():
    """Fault (#34 item 5): the check counted 1,024 prompt tokens whatever the recipe's prompts were.
    The policy's activations grow with the prompt: batch x extra tokens x per-token bytes."""
    short = _plan("grpo_codellama_gqa_correctness.yaml", [80.0], prompts=["x" * int(1000 * CHARS_PER_TOKEN)])
    long = _plan("grpo_codellama_gqa_correctness.yaml", [80.0], prompts=["x" * int(3000 * CHARS_PER_TOKEN)])
    assert (short.prompt.tokens, long.prompt.tokens) == (1000, 3000)
    size, cfg = (
        long.policy_size,
        parse_rl_config(["--config", str(REPO / "configs/grpo_codellama_gqa_correctness.yaml")]),
    )
    per_token = size.hidden * 2 * (size.layers * 2 + 16)  # checkpointed, as the recipe trains
    grown = cfg.training.per_device_train_batch_size * 2000 * per_token / layout.GIB
    assert long.components[0].gib - short.components[0].gib == pytest.approx(grown)
    assert "prompts up to 3000 tokens" in long.render()


def test_item5_the_recipes_own_gqa_prompt_is_measured():
    """The GQA prompt with the ViUniT API and gqa_ices.jsonl is near 10,000 characters: about 3,000
    tokens estimated, not 1,024."""
    plan = _plan("grpo_codellama_gqa_correctness.yaml", [80.0])
    assert plan.prompt.tokens > 2500 and "characters a token" in plan.prompt.how


def test_item5_a_local_tokenizer_counts_the_prompt(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"[UNK]": 0, "red": 1, "car": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    measured = measure(["red car " * 50, "red"], str(tmp_path / "tok"))
    assert measured.tokens == 100 and "tokenizer" in measured.how


def test_item4_rest_with_vllm_on_eight_gpus_is_planned_one_engine_per_rank(monkeypatch):
    """Fault (#34 item 4): ReST's vLLM engine was refused on every GPU but the first, although under
    several processes it starts with vLLM's external launcher, which takes cuda:LOCAL_RANK."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    plan = _plan("rest_codellama_gqa_correctness.yaml", [80.0] * 8, "--tool_service", "auto")
    plan.check()
    assert plan.per_device() == [pytest.approx(plan.per_process)] * 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")  # two ranks per GPU: the second one has no cuda:LOCAL_RANK
    crowded = _plan("rest_codellama_gqa_correctness.yaml", [80.0] * 8, "--tool_service", "auto")
    with pytest.raises(ConfigError, match=r"16 processes need 16 GPUs, and 8 are visible.*rest_generator: hf"):
        crowded.check()


def test_item2_the_layout_refusal_does_not_advise_qlora_with_vllm():
    """The check's "nothing movable" advice named QLoRA, which crashes with use_vllm (#34 item 2)."""
    plan = _plan("grpo_codellama_gqa_correctness.yaml", [30.0], "--tool_service", "auto")
    with pytest.raises(ConfigError, match=r"nothing movable") as err:
        plan.check()
    assert "QLoRA (load_in_4bit) with use_vllm false" in str(err.value)
    off = _plan("grpo_codellama_gqa_correctness.yaml", [12.0], "--tool_service", "auto", "--use_vllm", "false")
    # Without vLLM the peak is transformers generation, which the refusal names as the lever too.
    with pytest.raises(
        ConfigError, match=r"nothing movable; use a larger GPU or QLoRA \(load_in_4bit\)\. The policy's peak"
    ):
        off.check()


def test_item9_colocated_vllm_with_less_kv_cache_than_a_generation_batch_warns():
    from vprl.train.recipe.capacity import kv_cache_warning

    plan = _plan("grpo_codellama_gqa_correctness.yaml", [80.0])
    cfg = parse_rl_config(["--config", str(REPO / "configs/grpo_codellama_gqa_correctness.yaml")])
    message = kv_cache_warning(cfg, plan.policy_size, plan.prompt, 80.0)
    assert message and "preempt" in message and "KV cache" in message
    roomy = parse_rl_config(["--config", str(REPO / "configs/grpo_codellama_gqa_correctness.yaml"), "--vllm_gpu_memory_utilization", "0.6"])  # fmt: skip
    assert kv_cache_warning(roomy, plan.policy_size, plan.prompt, 80.0) is None


def test_item9_served_tool_calls_beyond_the_replicas_batches_warn():
    from vprl.train.recipe.capacity import served_tools_warnings

    args = ["--config", str(REPO / "configs/grpo_codellama_gqa_correctness.yaml"), "--tool_service", "auto"]
    cfg = parse_rl_config([*args, "--executor_slots", "30"])
    stack = yaml.safe_load(stack_path(cfg.executor.tool_stack).read_text())
    (blip2,) = [m for m in served_tools_warnings(cfg, stack) if m.startswith("tool service blip2")]
    assert "30 calls at once against 2 replica(s) x max_batch_size 4" in blip2 and "4 batches" in blip2
    assert served_tools_warnings(parse_rl_config([*args, "--executor_slots", "8"]), stack) == []


def test_a_served_group_of_a_stack_without_tool_sections_is_read_as_deploy_reads_it():
    """The shapes backend configures every tool with no section of its own: a `serve.groups` naming
    them was refused by the capacity check ("not served") though `deploy` placed it."""
    from vprl.executor.serve.deploy import served_settings
    from vprl.train.recipe.capacity import served_tools_warnings

    cfg = parse_rl_config(["--output_dir", "x", "--tool_service", "auto", "--executor_slots", "40"])
    stack = {"backend": "shapes", "serve": {"groups": {"all": ["detect", "verify", "vqa", "caption", "itm", "depth"]}}}
    assert list(served_settings(stack).placements) == ["all"]
    (message,) = served_tools_warnings(cfg, stack)
    assert message.startswith("tool service all: 1 process(es) x 40 executor_slots")


def test_transformers_generation_is_counted_at_the_size_a_gpu_measured():
    """Without vLLM trl generates its whole generation batch (per_device_train_batch_size x
    steps_per_generation sequences) in one `generate`; the check counted training alone. On an H200
    (docs/benchmarks.md, 2026-12-04) 32 sequences of 2,820 + 320 tokens took 52.6 GiB over the weights
    in CodeLlama-7B's shape and 53.3 in CodeGemma-7B's, four times the training step's 12.4: QLoRA
    (refused with vLLM, so always with transformers generation) would pass the check and run out of
    memory at its first generation."""
    measured = {"codellama/CodeLlama-7b-Python-hf": 52.65, "google/codegemma-7b": 53.34}
    for name, gib in measured.items():
        predicted = layout.generation_gib(layout.model_size(name), 32, 2820, 320)
        assert gib <= predicted <= gib * 1.1, (name, predicted)  # never under, at most 10 % over

    recipe, prompts = "grpo_codellama_gqa_correctness.yaml", ["word " * 3000]
    with_vllm = _plan(recipe, [80.0], prompts=prompts)
    qlora = _plan(recipe, [80.0], "--use_vllm", "false", "--load_in_4bit", "true", prompts=prompts)
    policy = {c.name: c for c in qlora.components}["policy (training)"]
    cfg = parse_rl_config(["--config", str(REPO / "configs" / recipe)])
    sequences = cfg.training.per_device_train_batch_size * cfg.training.steps_per_generation
    assert sequences == 32
    weights = layout.model_size(cfg.policy.model_name_or_path).params * layout.BYTES["4bit"] / layout.GIB
    tokens = with_vllm.prompt.tokens
    expected = layout.generation_gib(layout.model_size(cfg.policy.model_name_or_path), 32, tokens, 320)
    assert policy.gib == pytest.approx(weights + expected)
    assert "transformers generation of 32 sequences at once" in policy.note
    trained = {c.name: c for c in with_vllm.components}["policy (training)"]
    assert trained.gib < policy.gib and "generation" not in trained.note  # vLLM's engine is its own component
    with pytest.raises(ConfigError, match=r"generate fewer sequences at once \(per_device_train_batch_size"):
        qlora.check()  # 32 sequences of 3,000-token prompts and the tools do not fit 80 GB
