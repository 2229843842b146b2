"""A program whose stop sequence is completed by the last token the length limit allows has ended:
it gets the EOS the stop rule stands for (one past the limit), trl counts it as ended and, with
`mask_truncated_completions`, trains on it; only a program the limit cut is clipped and masked.
Before, the stop-cut program at the limit kept no EOS and trl masked it as truncated (seen as a
clipped ratio of 2/8 where the real vLLM engine ended one program at the limit)."""

from __future__ import annotations

import json

import pytest
from rl_tiny import build_policy, build_world, write_recipe
from transformers import AutoTokenizer

from vprl.train.online.trainers import stop_cut
from vprl.train.prompts import STOP_SEQUENCES

STOPPED = "\n    return 'no'\n# Is there a red circle?"
UNFINISHED = "\n    return 'no' if 'a' in 'b' else 'yes' if 'c' in 'd' else 'no' if 'e' in 'f' else 'yes'"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("stop_at_limit")
    world = build_world(root / "world")
    policy = build_policy(root / "policy", world, fit_steps=20)
    tok = AutoTokenizer.from_pretrained(policy)
    stopped = tok(STOPPED, add_special_tokens=False)["input_ids"]
    limit, ended = stop_cut(stopped, tok, STOP_SEQUENCES)
    assert ended and limit < len(stopped)
    unfinished = tok(UNFINISHED, add_special_tokens=False)["input_ids"][:limit]
    assert len(unfinished) == limit and stop_cut(unfinished, tok, STOP_SEQUENCES) == (limit, False)
    return world, policy, tok, stopped[:limit], unfinished


def test_a_stop_completed_at_the_length_limit_ends_the_program_and_is_trained(tmp_path, assets, monkeypatch):
    import trl.trainer.grpo_trainer as grpo_trainer

    import vprl.train.online.run as online_run
    from vprl.train.rl import main

    world, policy, tok, stopped, unfinished = assets
    limit = len(stopped)
    received = []

    def sampled(self, prompt_ids, *args, **kwargs):  # the sampler: every other program stops at the limit
        return [list(stopped if i % 2 == 0 else unfinished) for i in range(len(prompt_ids))], None

    monkeypatch.setattr(grpo_trainer.GRPOTrainer, "_generate_single_turn", sampled)
    build = online_run.build_trainer

    def build_and_watch(*args, **kwargs):
        trainer, recorder = build(*args, **kwargs)
        scored = trainer._generate_and_score_completions
        trainer._generate_and_score_completions = lambda inputs: received.append(scored(inputs)) or received[-1]
        return trainer, recorder

    monkeypatch.setattr(online_run, "build_trainer", build_and_watch)
    out = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack="shapes",
        output_dir=str(out),
        max_steps=1,
        max_completion_length=limit,
        mask_truncated_completions=True,
    )
    main(["--config", str(recipe)])

    (batch,) = received
    ids, mask = batch["completion_ids"], batch["completion_mask"]
    assert ids.size(0) == 4 and ids.size(1) == limit + 1
    for row in range(ids.size(0)):
        if row % 2 == 0:  # stopped at the limit: the program, then the EOS, all of it in the loss
            assert ids[row].tolist() == [*stopped, tok.eos_token_id]
            assert mask[row].tolist() == [1] * (limit + 1)
        else:  # cut by the limit: no EOS, masked out as truncated
            assert ids[row, :limit].tolist() == unfinished
            assert mask[row].sum().item() == 0
    (step,) = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in m]
    assert step["completions/clipped_ratio"] == 0.5
    assert step["completions/max_length"] == limit + 1
