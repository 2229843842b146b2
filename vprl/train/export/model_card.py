"""The model card of an exported adapter (README.md): base, LoRA settings, data, prompt, tool stack,
rewards, hyperparameters, a metric summary of the run and its provenance. vprl/train/export/adapter.py writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HIGHER_IS_BETTER = ("reward", "accuracy", "correct", "score", "iou")
LOWER_IS_BETTER = ("loss",)
# Names with a direction word that are not that quantity: a spread, a share of degenerate groups, a
# length. "frac_reward_zero_std" was once the "best" at 0.625.
NO_DIRECTION = ("std", "zero_std", "zero_variance", "frac_", "share", "length", "num_", "clip", "entropy", "kl")


def eval_results(evaluation: dict[str, Any]) -> list[Any]:
    """`model-index` entries from `vprl.train.evaluation`'s evaluation.json: each dataset's headline metric
    (mean over seeds) for the exported policy (the one named `after_rl`, else the report's last), in
    the `single` mode where it was run (else the first mode)."""
    from huggingface_hub import EvalResult

    matrix = evaluation.get("matrix") or {}
    names = evaluation.get("headline") or {}
    if not matrix:
        return []
    policy = "after_rl" if "after_rl" in matrix else list(matrix)[-1]
    modes = matrix[policy]
    mode = "single" if "single" in modes else next(iter(modes))
    return [
        EvalResult(
            task_type="visual-question-answering",
            dataset_type=dataset,
            dataset_name=dataset,
            metric_type=str(names.get(dataset, "accuracy")),
            metric_name=f"{names.get(dataset, 'accuracy')} ({mode}, {cell.get('seeds', 1)} seed(s))",
            metric_value=float(cell["mean"]),
        )
        for dataset, cell in sorted(modes[mode].items())
        if isinstance(cell.get("mean"), int | float)
    ]


def direction(name: str) -> float | None:
    """+1 where higher is better, -1 where lower is, None where the name does not say."""
    if any(w in name for w in NO_DIRECTION):
        return None
    if any(w in name for w in LOWER_IS_BETTER):
        return -1.0
    if any(w in name for w in HIGHER_IS_BETTER):
        return 1.0
    return None


def metric_summary(metrics: list[dict[str, Any]]) -> list[tuple[str, float, int, float | None, int | None]]:
    """(name, final value, its step, best value, its step) per numeric metric; best only where the
    direction is known from the name (rewards/accuracy up, losses down)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in metrics:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault(key, []).append((int(row["step"]), float(value)))
    out = []
    for name, points in sorted(series.items()):
        final_step, final = points[-1]
        best = best_step = None
        sign = direction(name)
        if sign is not None:
            best_step, best = max(points, key=lambda p: (sign * p[1], p[0]))
        out.append((name, final, final_step, best, best_step))
    return out


def rollout_summary(rows: list[Any]) -> dict[str, Any]:
    """Mean total reward per step (masked rows left out), first/final/best step, share of ok programs."""
    by_step: dict[int, list[float]] = {}
    for row in rows:
        if row.total is not None:
            by_step.setdefault(row.step, []).append(row.total)
    if not by_step:
        return {}
    means = {step: sum(v) / len(v) for step, v in sorted(by_step.items())}
    first, final = min(means), max(means)
    best = max(means, key=lambda s: (means[s], s))
    return {
        "programs": len(rows),
        "steps": len(means),
        "ok_share": sum(r.status == "ok" for r in rows) / len(rows),
        "first": (first, means[first]),
        "final": (final, means[final]),
        "best": (best, means[best]),
    }


def _compact(data: Any, keep: int = 8) -> Any:
    """Long lists (a split's thousands of example ids) cut to their first items and a count."""
    if isinstance(data, dict):
        return {k: _compact(v, keep) for k, v in data.items()}
    if isinstance(data, (list, tuple)) and len(data) > keep:
        return [_compact(v, keep) for v in data[:keep]] + [f"... {len(data) - keep} more ({len(data)} in all)"]
    return data


def _yaml_block(data: Any) -> str:
    text = yaml.safe_dump(_compact(data), sort_keys=False, default_flow_style=False).strip() if data else None
    return f"```yaml\n{text}\n```\n" if text else "(not recorded)\n"


# The licence an adapter inherits from its base (it is a derivative of the base's weights), by the base's
# name; a base not listed is "other", and the card says to check the base's own terms.
BASE_LICENSES = (("codellama", "llama2"), ("llama-3", "llama3"), ("codegemma", "gemma"), ("gemma", "gemma"))


def base_license(base: str, manifest: dict[str, Any]) -> str:
    lowered = base.lower()
    for key, licence in BASE_LICENSES:
        if key in lowered:
            return licence
    if (manifest.get("policy") or {}).get("name", "").startswith("tiny") or "tiny_policy" in lowered:
        return "apache-2.0"  # the CPU miniature's policy is built by this project from nothing
    return "other"


def prompt_format(manifest: dict[str, Any]) -> list[str]:
    """The prompt each task's programs were trained on, rendered for a placeholder question: what a
    user must reproduce to use the adapter (its hash alone says only whether two prompts differ)."""
    from vprl.train.prompts import PromptConfig, PromptTemplate

    lines = []
    for task, data in sorted((manifest.get("prompt") or {}).items()):
        try:
            text = PromptTemplate.from_config(PromptConfig.from_dict(data)).build("<QUESTION>")
        except (OSError, ValueError) as exc:  # an ICE file moved since training: say so, keep the config
            lines += [f"Task `{task}`: the prompt could not be rendered here ({exc}); its settings are above."]
            continue
        lines += [
            f"<details><summary>Task <code>{task}</code>: the prompt, for a question <code>&lt;QUESTION&gt;</code> "
            f"({len(text)} characters)</summary>",
            "",
            "```text",
            text,
            "```",
            "</details>",
            "",
        ]
    return lines


def render_model_card(run, manifest, config, metrics, rollouts, adapter_config, export, evaluation=None):
    """`evaluation`: `vprl.train.evaluation`'s results (report.json), written into the card's metadata as
    `model-index` results and into its text."""
    from huggingface_hub import ModelCard, ModelCardData

    base = export["base_model"]
    algorithm = manifest.get("algorithm") or config.get("algorithm") or "unknown"
    data = ModelCardData(
        base_model=base if not Path(base).exists() else None,
        license=base_license(base, manifest),
        library_name="peft",
        pipeline_tag="text-generation",
        tags=["vprl", "visual-programming", "lora", str(algorithm)],
        model_name=Path(export["out"]).name,
        eval_results=eval_results(evaluation) if evaluation else None,
    )
    lora = {k: adapter_config.get(k) for k in ("r", "lora_alpha", "lora_dropout", "target_modules", "use_dora")}
    lines = [
        f"---\n{data.to_yaml()}\n---",
        f"# {Path(export['out']).name}: a vprl visual-program generator adapter",
        "",
        f"A LoRA adapter for `{base}` that writes Python programs against the vprl image API, trained with "
        f"`{algorithm}` (run `{run.name}`, adapter `{export['adapter_source']}`, seed {manifest.get('seed', '?')}).",
        "The base was loaded "
        + (f"in **{export['quantization']}** (QLoRA) " if export["quantization"] != "none" else "unquantized ")
        + "during training; this adapter loads on the unquantized base.",
        "",
        "## Use",
        "```python",
        "from peft import PeftModel",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f"model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({base!r}), 'PATH_OR_REPO')",
        "tokenizer = AutoTokenizer.from_pretrained('PATH_OR_REPO')",
        "```",
        "",
        "Prompts must be built the way training built them (`vprl.train.prompts`, prompt hash "
        f"`{manifest.get('prompt_hash', '?')}`; below). Licence: `{base_license(base, manifest)}`, the base "
        "model's: the adapter is a derivative of its weights"
        + (" (check the base model's own terms)." if base_license(base, manifest) == "other" else "."),
        "",
        "## Base model and adapter",
        _yaml_block({"base_model": base, "quantization_in_training": export["quantization"], "lora": lora}),
        "## Data and splits",
        _yaml_block(manifest.get("splits") or manifest.get("dataset")),
        "## Prompt",
        _yaml_block({"hash": manifest.get("prompt_hash"), "config": manifest.get("prompt")}),
        *prompt_format(manifest),
        "## Tool stack",
        _yaml_block(manifest.get("tool_stack")),
        "## Rewards",
        _yaml_block(manifest.get("rewards")),
        "## Training hyperparameters",
        _yaml_block(config),
        "## Metrics",
        "",
    ]
    summary = metric_summary(metrics)
    if summary:
        lines += ["| metric | final (step) | best (step) |", "|---|---|---|"]
        for name, final, fstep, best, bstep in summary:
            best_text = f"{best:.4g} ({bstep})" if best is not None else "-"
            lines.append(f"| {name} | {final:.4g} ({fstep}) | {best_text} |")
    else:
        lines.append("No metrics.jsonl in the run.")
    roll = rollout_summary(rollouts)
    if roll:
        lines += [
            "",
            f"Rollouts: {roll['programs']} programs over {roll['steps']} steps, {roll['ok_share']:.1%} executed "
            f"without error. Mean reward: first step {roll['first'][0]} {roll['first'][1]:.4g}, final step "
            f"{roll['final'][0]} {roll['final'][1]:.4g}, best step {roll['best'][0]} {roll['best'][1]:.4g}.",
        ]
    if evaluation:
        lines += ["", "## Evaluation", "", "| dataset | metric | value |", "|---|---|---|"]
        lines += [f"| {r.dataset_name} | {r.metric_name} | {r.metric_value:.4g} |" for r in eval_results(evaluation)]
    provenance = {k: manifest[k] for k in ("git", "git_commit", "packages", "versions", "command") if k in manifest}
    provenance["adapter_sha256"] = export["weights_sha256"]
    lines += ["", "## Provenance", _yaml_block(provenance)]
    return ModelCard("\n".join(lines) + "\n")
