"""A vprl recipe's training data and reward settings for verl: `python -m vprl.train.integrations.verl_data
--config configs/X.yaml [--key value ...]`.

It reads the recipe as `vprl/train/rl.py` does (examples, prompts, tool stack, rewards, executor) and
writes into `<output_dir>/verl/`:

- `train.parquet`, verl's layout, one row per example: `data_source` (the dataset), `prompt` (one
  user message: vprl's prompt, ending with the entry point's signature), `ability`, `reward_model`
  (`style: rule`, `ground_truth`: the first answer, or the box as JSON; for verl's logs only) and
  `extra_info` (`split`, `index`, `example`: the `Example` as JSON with its image path made
  absolute, `prompt_tail`: the signature line);
- `vprl_reward.json`: the scoring session's settings (`vprl.train.integrations.session.SessionConfig`)
  that `vprl.train.integrations.for_verl` reads; paths in it are absolute, and with `run_dir` the
  recipe's `output_dir`, the unit tests `python -m vprl.train.prepare_unit_tests` made are found there;
- with repair episodes in the recipe (`repair_max_turns` above 1), `agent_loops.yaml`: the `vprl_repair`
  agent loop (`vprl.train.integrations.verl_agent`) with the recipe's repair settings, which verl
  then uses for every sample, and whose episodes fit `rollout.response_length` as printed;
- `overrides.txt`: the overrides that point verl at them (it prints verl's command line with them).

The files must be readable at the same paths on every node (a shared file system), and so must the
examples' images. For the tools as a service on verl's Ray cluster, give `--tool_service auto`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import yaml

from vprl.data.records import Example
from vprl.executor.tools.stack import PATH_SETTINGS
from vprl.train.integrations.session import SessionConfig
from vprl.train.recipe.checks import validate
from vprl.train.recipe.data import build_prompts
from vprl.train.recipe.parsing import ConfigError, run_command
from vprl.train.recipe.rl_config import parse_rl_config

ABILITY = "visual_programming"
AGENT_NAME = "vprl_repair"  # vprl.train.integrations.verl_agent.NAME, which imports verl
FOLDER = "verl"
# The checkout's verl configs (configs/ is no package), found upwards from here.
VERL_CONFIGS = next(
    (p / "configs" / "verl" for p in Path(__file__).resolve().parents if (p / "configs" / "verl").is_dir()), None
)


def rows(prompted: list[Any], split: str) -> list[dict[str, Any]]:
    """verl's rows for prompted examples (`vprl.train.recipe.data.PromptedExample`)."""
    out = []
    for index, p in enumerate(prompted):
        example = absolute_image(p.example)
        out.append(
            {
                "data_source": example.dataset,
                "prompt": [{"role": "user", "content": p.prompt}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": ground_truth(example)},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "example": json.dumps(example.to_json(), sort_keys=True),
                    "prompt_tail": p.prompt.rstrip().rsplit("\n", 1)[-1],
                },
            }
        )
    return out


def absolute_image(example: Example) -> Example:
    """The example with its image path absolute: verl's reward workers do not run where this did."""
    path = Path(example.image)
    return example if path.is_absolute() else dataclasses.replace(example, image=str(path.resolve()))


def ground_truth(example: Example) -> str:
    if example.task == "grounding" and example.box is not None:
        return json.dumps(list(example.box))
    return example.answers[0] if example.answers else ""


def session_config(checked: Any, run_dir: Path) -> SessionConfig:
    """The recipe's scoring settings with every path absolute."""
    stack = dict(checked.tool_stack)
    if "_source" in stack:  # relative paths inside the stack are resolved against it
        stack["_source"] = str(Path(stack["_source"]).resolve())
    overrides = {
        key: _absolute(value) if key in PATH_SETTINGS else value for key, value in checked.tool_overrides.items()
    }
    return SessionConfig(
        rewards=checked.rewards,
        tool_stack=stack,
        tool_service=checked.tool_service,
        tool_overrides=overrides,
        runner=checked.runner,
        run_dir=str(run_dir.resolve()),
    )


def agent_loop_entry(cfg: Any) -> dict[str, Any]:
    """The `vprl_repair` agent loop's registry entry: the recipe's repair settings."""
    feedback = cfg.repair.config().feedback
    return {
        "name": AGENT_NAME,
        "_target_": "vprl.train.integrations.verl_agent.RepairAgentLoop",
        "max_turns": cfg.repair.repair_max_turns,
        "turn_cost": cfg.repair.repair_turn_cost,
        "repeat_cost": cfg.repair.repair_repeat_cost,
        "stop_when": feedback.stop_when,
        "check": feedback.check,
        "pass_threshold": feedback.pass_threshold,
        "show": list(feedback.show),
        "framing": cfg.policy.framing,
        "turn_tokens": cfg.sampling.max_completion_length,
        "stop_at_program_end": cfg.rewards.stop_at_program_end,
    }


def _absolute(value: Any) -> Any:
    if isinstance(value, list):
        return [_absolute(v) for v in value]
    return str(Path(value).resolve()) if isinstance(value, str) else value


def main(argv: list[str] | None = None) -> Path:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    prog, description = "python -m vprl.train.integrations.verl_data", __doc__.split("\n\n")[0]
    cfg = parse_rl_config(argv, prog=prog, description=description)
    checked = validate(cfg, check_layout=False)  # verl places the models, not vprl's layout check
    if checked.reward_scopes is not None:
        raise ConfigError("rewards: rewards scoped to mixture entries are not supported on verl; score every entry")
    if cfg.repair.repair_branches > 1:  # verl's agent loop plays each sample's episode from its own prompt
        raise ConfigError("repair_branches: verl's agent loop plays each episode on its own; use 1 with verl")
    if cfg.repair.repair_kl_turns != "all":  # verl's actor computes its own KL over every response token
        raise ConfigError("repair_kl_turns: verl's actor puts its KL on every response token; use all with verl")
    if cfg.repair.repair_guide_weight:  # verl's actor computes its own loss
        raise ConfigError("repair_guide_weight: verl's actor has no guide term; use 0 with verl")
    if cfg.repair.repair_replay_weight:  # the same
        raise ConfigError("repair_replay_weight: verl's actor has no replay term; use 0 with verl")
    if cfg.repair.repair_first_credit != "episode":  # verl's actor takes one advantage per response
        raise ConfigError("repair_first_credit: verl's actor gives a response one advantage; use episode with verl")
    if cfg.repair.repair_later_credit != "episode":
        raise ConfigError("repair_later_credit: verl's actor gives a response one advantage; use episode with verl")
    if cfg.repair.repair_first_weight != 1.0:
        raise ConfigError("repair_first_weight: verl's actor gives a response one advantage; use 1 with verl")
    run_dir = Path(cfg.training.output_dir)
    out = run_dir / FOLDER
    out.mkdir(parents=True, exist_ok=True)
    from datasets import Dataset

    data = out / "train.parquet"
    split = cfg.data.dataset_split or "train"
    Dataset.from_list(rows(build_prompts(checked.examples, checked.prompts), split)).to_parquet(str(data))
    settings = out / "vprl_reward.json"
    settings.write_text(json.dumps(session_config(checked, run_dir).to_json(), indent=2) + "\n", encoding="utf-8")
    data_path, settings_path = data.resolve(), settings.resolve()
    print(f"verl_data: {len(checked.examples)} examples in {data_path}, reward settings in {settings_path}")
    overrides = (
        f"data.train_files={data_path} data.val_files={data_path} "
        f"reward.custom_reward_function.reward_kwargs.settings={settings_path}"
    )
    if cfg.repair.enabled:
        agents = out / "agent_loops.yaml"
        agents.write_text(yaml.safe_dump([agent_loop_entry(cfg)], sort_keys=False), encoding="utf-8")
        overrides += (
            f" actor_rollout_ref.rollout.agent.agent_loop_config_path={agents.resolve()}"
            f" actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}"
            f" data.max_response_length={cfg.repair.completion_tokens(cfg.sampling.max_completion_length)}"
        )
    (out / "overrides.txt").write_text(overrides + "\n", encoding="utf-8")
    where = f"--config-path {VERL_CONFIGS} " if VERL_CONFIGS is not None else ""
    print(f"verl_data: train with\n  python -m verl.trainer.main_ppo {where}--config-name NAME {overrides}")
    print("(NAME: a verl config of configs/verl/, e.g. viunit_grpo for configs/grpo_codellama_gqa_unit_tests.yaml)")
    return out


if __name__ == "__main__":
    run_command(main)
