"""A tiny shapes world and a tiny policy that writes *some* valid programs, built offline for the
RL tests. A random policy writes only syntax errors, every reward in a group is equal and GRPO has
nothing to learn from; a few hundred milliseconds of supervised fitting on the world's gold
programs give it a mix of right, wrong and broken programs, so rewards vary within groups.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

WORLD = dict(train=16, val=4, winoground=2, sugarcrepe=1, refcoco=2, seed=5)
RECIPE_BASE = {
    "dataset": "shapes",
    "dataset_tasks": ["train"],
    "prompt_layout": "bare",
    "executor_slots": 2,
    "num_generations": 4,
    "per_device_train_batch_size": 4,
    "max_completion_length": 48,
    "report_to": "none",
    "use_cpu": True,
    "bf16": False,
    "logging_steps": 1,
    "save_steps": 1,
    "seed": 0,
    "lora_r": 8,
    "lora_alpha": 16,
    "disable_tqdm": True,
}


def build_world(root: Path) -> Path:
    from vprl.data.shapes import BuildConfig, build_dataset

    build_dataset(BuildConfig(out=str(root), workers=1, **WORLD))
    return root


def build_policy(
    out: Path,
    world: Path,
    fit_steps: int = 60,
    seed: int = 0,
    tail: str | None = None,
    num_heads: int = 4,
) -> Path:
    """A 2-layer Llama (hidden 64) with `vprl.train.policy.tiny`'s BPE tokenizer trained on the world's
    prompts and gold programs, fitted briefly on them; saved as a model folder. With `tail`, every
    other program is followed by `tail` instead of EOS, as a code LLM writes on past the function
    (the next query), so that the stop sequences have something to cut. `num_heads` 2 gives heads of
    32 dimensions, the smallest vLLM's CPU attention supports (the default 4 gives 16)."""
    import torch

    from vprl.data.shapes import load_gold_programs
    from vprl.data.shapes.tasks import load_shapes_tasks
    from vprl.train.policy.tiny import TinyModelConfig, build_model, train_tokenizer
    from vprl.train.prompts import PromptConfig, PromptTemplate

    examples = load_shapes_tasks(world, ["train"])["train"]
    gold = load_gold_programs(world)["vqa"]
    template = PromptTemplate.from_config(PromptConfig(layout="bare"))
    pairs = []
    for ex in examples:
        prompt = template.build(ex.query)
        body = gold[ex.query].split("\n", 1)[1]  # the body after `def execute_command(image):`
        pairs.append((prompt, "\n" + body))
    fast = train_tokenizer([p + c + (tail or "") for p, c in pairs] * 3, vocab_size=500, context=1024)
    sizes = TinyModelConfig(
        vocab_size=500, hidden_size=64, num_layers=2, num_heads=num_heads, intermediate_size=128, context=1024
    )
    model = build_model(fast, sizes, seed=seed)
    # One padded batch of every (prompt, gold body) pair; the loss covers the body and EOS only.
    seqs = []
    for i, (prompt, body) in enumerate(pairs):
        p = fast(prompt)["input_ids"]
        if tail is not None and i % 2:
            c = fast(body + tail, add_special_tokens=False)["input_ids"]
        else:
            c = fast(body, add_special_tokens=False)["input_ids"] + [fast.eos_token_id]
        seqs.append((p + c, len(p)))
    width = max(len(ids) for ids, _ in seqs)
    x = torch.full((len(seqs), width), fast.pad_token_id)
    labels = torch.full((len(seqs), width), -100)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, (ids, start) in enumerate(seqs):
        x[row, : len(ids)] = torch.tensor(ids)
        labels[row, start : len(ids)] = torch.tensor(ids[start:])
        mask[row, : len(ids)] = 1
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(fit_steps):
        loss = model(input_ids=x, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    fast.save_pretrained(str(out))
    return out


def write_recipe(path: Path, **values) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({**RECIPE_BASE, **values}))
    return path


class FakeVLLMGeneration:
    """Stands in for trl's vLLM backend: scripted completions (right, wrong, broken, trivial) with
    text after the program that the stop sequences must cut."""

    instances: list = []
    BODIES = [
        "\n    return 'yes'\n",
        "\n    return 'no'\n",
        "\n    return 1/0\n",
        "\n    return ImagePatch(image).simple_query('What is it?')\n",
    ]
    TAIL = "\n# Is there a red circle?\ndef execute_command(image) -> str:\n    return 'no'\n"

    def __init__(self, model, accelerator, processing_class, **kwargs):
        self.model, self.tokenizer, self.kwargs, self.calls, self.synced = model, processing_class, kwargs, 0, 0
        self.raw_lengths: list[int] = []
        if (kwargs.get("top_p") or 1.0) < 1.0 or (kwargs.get("top_k") or 0) > 0:
            # vLLM reports log-probs renormalised over what top-p / top-k kept; a scripted token may lie
            # outside it, which a real sampler could never have drawn.
            raise ValueError("FakeVLLMGeneration scripts its completions: use top_p 1.0 and top_k 0")
        FakeVLLMGeneration.instances.append(self)

    def sync_weights(self):
        self.synced += 1

    def generate(self, prompts, images, num_generations, profiler=None):
        self.calls += 1
        completions = []
        for i, _ in enumerate(prompts):
            text = self.BODIES[i % len(self.BODIES)] + self.TAIL
            completions.append(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        self.raw_lengths += [len(c) for c in completions]
        logprobs = [[[lp] for lp in self._logprobs(p, c)] for p, c in zip(prompts, completions, strict=True)]
        return prompts, completions, logprobs, [[[t] for t in c] for c in completions]

    def _logprobs(self, prompt: list[int], completion: list[int]) -> list[float]:
        """What vLLM reports for these tokens with no truncation: the policy's temperature-scaled
        log-probabilities (the scripted completions are forced, not drawn)."""
        import torch

        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([list(prompt) + completion])).logits[0, len(prompt) - 1 : -1]
        logp = (logits.float() / self.kwargs["temperature"]).log_softmax(-1)
        return logp.gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1).tolist()


@contextlib.contextmanager
def offline_wandb(monkeypatch):
    """A test's wandb: offline (no API key), in the run folder, torn down afterwards so the next run
    of the process does not keep this one's settings."""
    import os

    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_PROJECT", "vprl-test")
    try:
        yield
    finally:
        import wandb

        wandb.finish()
        wandb.teardown()  # wandb keeps the first run's settings (WANDB_DIR) for the process otherwise
        os.environ.pop("WANDB_MODE", None)  # set by the entry point (no API key: offline)
        os.environ.pop("WANDB_DIR", None)
