"""Where each part of an RL run goes and how much GPU memory it needs, known before any weight loads.

Every training process holds the policy under training and, with `vllm_mode: colocate`, its vLLM
engine; the tool host of each process loads its own copy of the stack's models unless they are
served (`tool_service`); the unit-test reward loads its test writer and image generator unless their
cache already holds every test and image. Each process puts all of these on its rank's GPU, by the
rule the loading code itself uses (`vprl/executor/tools/devices.py`: local rank modulo the GPU count, as
accelerate places the policy). The check adds them up on each GPU for every process of the node and
refuses a run that cannot fit, naming the GPU and what to move.

Sizes come from each model's config when it is in the local hub cache (the parameters are counted on
an empty-weight instance: nothing is loaded) or a local folder, else from `configs/layout/model_sizes.yaml`.
The memory of the policy under training is an estimate: its weights, the fp32 logits of a batch's
completions, and activations (with gradient checkpointing, one layer's worth per token and the
checkpoints; without it, about 16 values per hidden unit and layer per token) over the batch's
prompt and completion tokens, the prompt counted at the longest of the recipe's own prompts
(`vprl/train/recipe/prompt_length.py`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vprl.executor.tools.calls import TOOLS
from vprl.executor.tools.devices import device_index, local_processes, vllm_refusal
from vprl.paths import checkout_file
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.prompt_length import PromptLength, measure

SIZES_FILE = "configs/layout/model_sizes.yaml"  # in the source checkout
GIB = 2**30
BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "auto": 2.0, "8bit": 1.1, "4bit": 0.55}
HEADROOM = 0.95  # what of a GPU a layout may plan to use (CUDA context, fragmentation)


@dataclass(frozen=True)
class ModelSize:
    params: float
    hidden: int | None = None
    layers: int | None = None
    vocab: int | None = None
    kv_width: int | None = None  # key/value heads x head size: below `hidden` with grouped-query attention
    intermediate: int | None = None  # the MLP's width


@dataclass(frozen=True)
class Component:
    name: str
    where: str  # "each training GPU" (each process's own), "the tool service", "not loaded", "the CPU"
    gib: float
    note: str = ""
    vllm: bool = False  # an engine vLLM starts in the training process (it picks its own GPU)
    # Started with vLLM's external launcher under several processes: it takes cuda:LOCAL_RANK, the
    # rank's own GPU, so each process needs a GPU of its own.
    follows_rank: bool = False


@dataclass
class Layout:
    components: list[Component]
    gpus: list[float] = field(default_factory=list)  # GiB of each visible GPU
    processes: int = 1  # training processes of this node, all seeing `gpus`
    prompt: PromptLength | None = None  # the recipe's longest prompt, as the policy's estimate counted it
    policy_size: ModelSize | None = None

    @property
    def per_process(self) -> float:
        """What one training process puts on its GPU."""
        return sum(c.gib for c in self.components if c.where == "each training GPU")

    def ranks_on(self) -> list[list[int]]:
        """The local ranks each visible GPU holds."""
        ranks: list[list[int]] = [[] for _ in self.gpus]
        for rank in range(self.processes):
            ranks[device_index(rank, len(self.gpus))].append(rank)
        return ranks

    def per_device(self) -> list[float]:
        """GiB planned on each visible GPU: every process's share on its rank's GPU."""
        return [len(ranks) * self.per_process for ranks in self.ranks_on()]

    @property
    def per_gpu(self) -> float:
        """The fullest GPU's plan."""
        return max(self.per_device(), default=0.0)

    def render(self) -> str:
        lines = ["layout (estimates, before any weight loads):"]
        for c in self.components:
            size = f"{c.gib:6.1f} GiB" if c.gib else "      -   "
            lines.append(f"  {c.name:<30} {size}  {c.where}{f'  ({c.note})' if c.note else ''}")
        if not self.gpus:
            lines.append("  no GPU visible: everything runs on the CPU")
            return "\n".join(lines)
        lines.append(f"  per training GPU: {self.per_gpu:.1f} GiB of {min(self.gpus):.1f} GiB")
        for index, (ranks, gib) in enumerate(zip(self.ranks_on(), self.per_device())):
            if ranks:
                lines.append(f"    cuda:{index}: local rank(s) {', '.join(map(str, ranks))}, {gib:.1f} GiB")
        return "\n".join(lines)

    def check(self) -> None:
        """Refuse a layout that cannot fit a visible GPU, naming the GPU and what to move, and an
        in-process vLLM engine that would not land on its process's GPU."""
        if not self.gpus:
            return
        for c in self.components:
            if c.follows_rank and self.processes > len(self.gpus):
                raise ConfigError(
                    f"layout: {c.name}: under several processes each one's vLLM engine takes cuda:LOCAL_RANK, so "
                    f"{self.processes} processes need {self.processes} GPUs, and {len(self.gpus)} are visible; "
                    f"launch one process per GPU, or {c.note.removeprefix('move: ')}"
                )
        for index, ranks in enumerate(self.ranks_on()):
            for c in self.components:
                problem = (
                    ranks
                    and c.vllm
                    and not c.follows_rank
                    and c.where == "each training GPU"
                    and vllm_refusal(f"cuda:{index}", c.name, c.note.removeprefix("move: "))
                )
                if problem:
                    raise ConfigError(f"layout: local rank {ranks[0]}: {problem}")
        for index, (ranks, gib) in enumerate(zip(self.ranks_on(), self.per_device())):
            if gib <= HEADROOM * self.gpus[index]:
                continue
            movable = [c for c in self.components if c.where == "each training GPU" and c.note.startswith("move:")]
            advice = "; ".join(f"{c.name} ({c.gib:.1f} GiB): {c.note.removeprefix('move: ')}" for c in movable)
            raise ConfigError(
                f"layout: cuda:{index} would need {gib:.1f} GiB for {len(ranks)} training process(es) but has "
                f"{self.gpus[index]:.1f} GiB. Move out: "
                f"{advice or 'nothing movable; ' + self.smaller_policy}{self.generation_advice}\n{self.render()}"
            )

    @property
    def generation_advice(self) -> str:
        policy = next((c for c in self.components if c.name == "policy (training)"), None)
        if policy is None or "transformers generation" not in policy.note:
            return ""
        return (
            ". The policy's peak is transformers generation: generate fewer sequences at once (per_device_train_"
            "batch_size x steps_per_generation), or use vLLM (use_vllm, LoRA in bf16)"
        )

    @property
    def smaller_policy(self) -> str:
        # QLoRA with trl's vLLM generation crashes at the first weight sync (gpu_combinations.py).
        if any(c.name.startswith("policy vLLM (") and "ReST" not in c.name for c in self.components):
            return (
                "use a larger GPU, a smaller vllm_gpu_memory_utilization, or QLoRA (load_in_4bit) with use_vllm false"
            )
        return "use a larger GPU or QLoRA (load_in_4bit)"


def visible_gpus() -> list[float]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_properties(i).total_memory / GIB for i in range(torch.cuda.device_count())]


@functools.lru_cache(maxsize=64)
def model_size(name: str) -> ModelSize:
    """The model's size from its config (local folder or hub cache), else from the sizes table."""
    config = _local_config(name)
    if config is not None:
        import torch
        from accelerate import init_empty_weights
        from transformers import AutoModel, AutoModelForCausalLM

        text = getattr(config, "text_config", config)
        auto = (
            AutoModelForCausalLM
            if "ForCausalLM" in " ".join(getattr(config, "architectures", None) or [])
            else AutoModel
        )
        with init_empty_weights(), torch.device("meta"):
            model = auto.from_config(config)
        params = float(sum(p.numel() for p in model.parameters()))
        hidden, heads = getattr(text, "hidden_size", None), getattr(text, "num_attention_heads", None)
        head_dim = getattr(text, "head_dim", None) or (hidden // heads if hidden and heads else None)
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        return ModelSize(
            params,
            hidden,
            getattr(text, "num_hidden_layers", None),
            getattr(text, "vocab_size", None),
            kv_heads * head_dim if kv_heads and head_dim else None,
            getattr(text, "intermediate_size", None),
        )
    try:
        table = yaml.safe_load(checkout_file(SIZES_FILE).read_text(encoding="utf-8")) or {}
    except FileNotFoundError as exc:
        raise ConfigError(
            f"layout: no size for {name!r}: its config is not in the local hub cache, and {exc}"
        ) from None
    if name not in table:
        raise ConfigError(
            f"layout: no size for {name!r}: its config is not in the local hub cache and {Path(SIZES_FILE).name} "
            "does not list it (add its parameter count there)"
        )
    row = table[name]  # YAML reads 6.74e9 as text: numbers are converted here
    keys = ("hidden", "layers", "vocab", "kv", "intermediate")
    return ModelSize(float(row["params"]), *(int(row[k]) if k in row else None for k in keys))


def _local_config(name: str) -> Any:
    from transformers import AutoConfig

    if not Path(name).is_dir():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            return None
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError):
        return None


def policy_component(cfg: Any, prompt: PromptLength) -> Component:
    """The policy under training on each GPU: weights, the fp32 logits of its completions, activations
    over its prompt (`prompt`, the longest of the recipe's) and completion tokens."""
    size = model_size(cfg.policy.model_name_or_path)
    t = cfg.training
    quant = "4bit" if cfg.policy.load_in_4bit else "8bit" if cfg.policy.load_in_8bit else None
    weights = (
        size.params * BYTES[quant or (cfg.policy.torch_dtype if cfg.policy.torch_dtype != "auto" else "bfloat16")]
    )
    batch = t.per_device_train_batch_size
    completion = getattr(t, "max_completion_length", None) or getattr(t, "max_length", None) or 512
    if cfg.repair.enabled and cfg.algorithm != "rest":  # a repair episode is one sequence of all its turns
        completion = cfg.repair.completion_tokens(completion)
    tokens = batch * (completion + prompt.tokens)
    logits = batch * completion * (size.vocab or 32000) * 4
    per_token = (size.hidden or 4096) * 2 * ((size.layers or 32) * (2 if t.activation_checkpointing else 16) + 16)
    train = (logits + tokens * per_token) / GIB
    note = f"prompts up to {prompt.tokens} tokens, {prompt.how}"
    peak = train
    # Without vLLM trl generates a whole generation batch (per_device_train_batch_size x
    # steps_per_generation sequences) in one `generate`: its KV cache, not training, is the peak.
    if not getattr(t, "use_vllm", True) and getattr(cfg, "algorithm", "grpo") in ("grpo", "rloo"):
        sequences = batch * (getattr(t, "steps_per_generation", None) or 1)
        generation = generation_gib(size, sequences, prompt.tokens, completion)
        if generation > train:
            note += (
                f"; transformers generation of {sequences} sequences at once, {generation:.1f} GiB (its KV cache), "
                f"is the peak, above training's {train:.1f}"
            )
            peak = generation
    return Component("policy (training)", "each training GPU", weights / GIB + peak, note)


def generation_gib(size: ModelSize, sequences: int, prompt_tokens: int, new_tokens: int) -> float:
    """transformers generating `sequences` at once, beside the weights: the bf16 KV cache of every
    token, and the prefill's widest activation (one layer's MLP over every prompt token: gate, up and
    their product). On an H200 (docs/benchmarks.md, 2026-12-04) 32 sequences of 2,820 + 320 tokens
    took 52.6 GiB over the weights in CodeLlama-7B's shape (this says 54.6) and 53.3 in CodeGemma-7B's
    (55.3)."""
    width = size.kv_width or size.hidden or 4096
    cache = sequences * (prompt_tokens + new_tokens) * 2 * (size.layers or 32) * width * 2
    prefill = sequences * prompt_tokens * (size.intermediate or 4 * (size.hidden or 4096)) * 2 * 3
    return (cache + prefill) / GIB


def tool_components(stack: dict[str, Any], service: str | None) -> list[Component]:
    """The stack's models, once per model and placement (tools sharing a checkpoint share it)."""
    if stack.get("backend") != "hf":
        return [Component(f"tools ({stack.get('backend')})", "the CPU", 0.0)]
    where = "the tool service" if service else "each training GPU"
    seen: dict[tuple[str, str], Component] = {}
    for tool in TOOLS:
        block = stack.get(tool)
        if not isinstance(block, dict) or "model" not in block:
            continue
        quant = block.get("quantization", stack.get("quantization", "none"))
        dtype = block.get("dtype", stack.get("dtype", "float16"))
        key = (block["model"], quant if quant != "none" else dtype)
        if key in seen:
            seen[key] = dataclasses.replace(seen[key], name=f"{seen[key].name}, {tool}")
            continue
        gib = model_size(block["model"]).params * BYTES[key[1]] / GIB
        note = "" if service else "move: serve the tools (tool_service, python -m vprl.executor.serve)"
        vllm = tool == "llm" and block.get("engine") == "vllm"
        seen[key] = Component(f"tool {tool}", where, gib, note, vllm=vllm)
    return list(seen.values())


def unit_test_components(settings: dict[str, Any], gpu_gib: float, prepared: bool) -> list[Component]:
    """The test writer and the image generator of a unit-test reward."""
    out = []
    writer = settings.get("writer_settings") or {}
    generator = settings.get("generator_settings") or {}
    where = "not loaded" if prepared else "each training GPU"
    note = (
        "its cache holds every test" if prepared else "move: python -m vprl.train.prepare_unit_tests --config <recipe>"
    )
    if settings.get("writer") == "llm" and writer.get("model"):
        if writer.get("backend") == "server":
            out.append(Component("unit-test writer", "its own server", 0.0, writer.get("base_url", "")))
        else:
            out.append(_llm_component("unit-test writer", writer, where, gpu_gib, prepared, note))
    if str(settings.get("generator", "")).startswith("diffusers") and generator.get("model"):
        gib = model_size(generator["model"]).params * 2 / GIB
        out.append(Component("unit-test image generator", where, gib if not prepared else 0.0, note))
        planner = generator.get("layout") or {}
        if planner.get("model"):
            out.append(_llm_component("unit-test layout LLM", planner, where, gpu_gib, prepared, note))
    return out


def _llm_component(
    name: str, settings: dict[str, Any], where: str, gpu_gib: float, prepared: bool, note: str
) -> Component:
    vllm = settings.get("backend") == "vllm"
    return Component(name, where, 0.0 if prepared else _llm_gib(settings, gpu_gib), note, vllm=vllm and not prepared)


def _llm_gib(settings: dict[str, Any], gpu_gib: float) -> float:
    """A text model's memory: the share of the GPU a vLLM engine reserves, or its weights."""
    if settings.get("backend") == "vllm":
        return float(settings.get("gpu_memory_utilization", 0.5)) * gpu_gib
    return model_size(settings["model"]).params * BYTES[settings.get("quantization", "bfloat16")] / GIB


def plan_layout(
    cfg: Any, stack: dict[str, Any], rewards: Any, queries: list[str], gpus: list[float], prompts: list[str]
) -> Layout:
    """The layout of a checked recipe on `gpus` (GiB each; empty: no GPU); `prompts` are the recipe's
    own (unframed), measured only where there is a GPU to plan."""
    if not gpus:
        return Layout([Component("everything", "the CPU", 0.0)], [])
    processes = local_processes()
    t = cfg.training
    prompt = measure(prompts, cfg.policy.model_name_or_path)
    components = [policy_component(cfg, prompt)]
    if getattr(t, "use_vllm", False):
        if t.vllm_mode == "colocate":
            components.append(
                Component("policy vLLM (colocate)", "each training GPU", t.vllm_gpu_memory_utilization * min(gpus))
            )
        else:
            components.append(Component("policy vLLM (trl vllm-serve)", "its own GPUs", 0.0))
    if cfg.algorithm == "rest" and cfg.rest.rest_generator == "vllm":
        share = float((cfg.rest.rest_vllm_kwargs or {}).get("gpu_memory_utilization", 0.9))  # vLLM's default
        note = "move: rest_generator: hf (transformers sampling, slower)"
        engine = Component("policy vLLM (ReST sampling)", "each training GPU", share * min(gpus), note, True, True)
        components.append(engine)
    components += tool_components(stack, cfg.executor.tool_service)
    for spec in rewards.rewards:
        if spec.name == "unit_tests":
            components += unit_test_components(spec.settings, min(gpus), _prepared(spec.settings, cfg, queries))
    return Layout(components, gpus, processes, prompt, model_size(cfg.policy.model_name_or_path))


def _prepared(settings: dict[str, Any], cfg: Any, queries: list[str]) -> bool:
    """Whether the reward's cache already holds the tests and images of every training question."""
    from vprl.rewards.unit_tests.reward import unit_tests_reward

    if not queries:
        return False
    reward = unit_tests_reward(**settings, runner=object(), run_dir=cfg.training.output_dir)
    return reward.missing(queries) == 0
