"""Setting names that were retired when every command took one vocabulary (the RL recipe's: trl's
names where trl has the knob, the recipe's section prefixes elsewhere; docs/configs.md). A retired
name, in a config file or on a command line, fails in one line that names its replacement, rather
than as an unknown key among dozens."""

from __future__ import annotations

# old name -> the name every command now uses for the same setting
RETIRED: dict[str, str] = {
    # the policy
    "policy": "model_name_or_path",
    # the prompt (PromptConfig's fields, with the recipe's prefix)
    "variant": "prompt_variant",
    "layout": "prompt_layout",
    "ice_file": "prompt_ice_file",
    "max_ices": "prompt_max_ices",
    # the executor
    "tools": "tool_stack",
    "set": "tool_overrides",
    "slots": "executor_slots",
    "timeout": "executor_timeout_s",
    "timeout_s": "executor_timeout_s",
    "sandbox": "executor_sandbox",
    "max_rpcs": "executor_max_rpcs",
    # sampling (trl's GRPOConfig names)
    "n_programs": "num_generations",
    "eval_samples": "num_generations",
    "rest_samples_per_query": "num_generations",
    "eval_temperature": "temperature",
    "rest_temperature": "temperature",
    "eval_top_p": "top_p",
    "rest_top_p": "top_p",
    "max_new_tokens": "max_completion_length",
    "eval_max_new_tokens": "max_completion_length",
    "rest_max_new_tokens": "max_completion_length",
    "rest_generation_batch_size": "generation_batch_size",
}


def retired_message(name: str, known: set[str] | frozenset[str] | None = None) -> str | None:
    """`name is now new_name` when `name` (a key or an option, with or without dashes, either
    spelling) was retired and the command knows its replacement; None otherwise."""
    bare = name.lstrip("-").split("=", 1)[0].replace("-", "_")
    new = RETIRED.get(bare)
    if new is None or (known is not None and new not in known):
        return None
    dashes = "--" if name.startswith("--") else ""
    return f"{dashes}{bare} is now {dashes}{new} (one name per setting in every command: docs/configs.md)"
