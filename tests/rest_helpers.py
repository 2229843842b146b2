"""Helpers shared by the ReST and vLLM-generation tests.

- a tiny random causal LM with a LoRA adapter, built offline by `vprl.train.policy.tiny`: its byte-level
  BPE trained here on program text (prompts and programs take few tokens) and a 2-layer Llama with
  random weights (it writes noise, not programs);
- a small shapes world with three training questions and their gold programs;
- `PoolGenerator`, a test double that returns the bodies of real programs, so the loop has
  something to keep (a random policy never writes a rewarded program).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CODE_CORPUS = [
    "def execute_command(image) -> str:\n    image_patch = ImagePatch(image)\n",
    "    return image_patch.simple_query('What color is the circle?')\n",
    "    objects = image_patch.find('circle')\n    return bool_to_yesno(len(objects) > 0)\n",
    "    return str(len(image_patch.find('blue hexagons')))\n",
    "# What color is the circle above the small orange hexagon?\n",
    "    candidates = [p for p in image_patch.find('square') if p.vertical_center > anchor.vertical_center]\n",
]


def build_tokenizer(out_dir: str | Path, corpus: list[str] | None = None, chat_template: str | None = None) -> Any:
    """`vprl.train.policy.tiny`'s BPE tokenizer trained on `corpus` and a few program lines; saved to `out_dir`."""
    from vprl.train.policy.tiny import train_tokenizer

    fast = train_tokenizer((corpus or []) + CODE_CORPUS * 4, vocab_size=600, context=4096)
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(str(out_dir))
    return fast


def build_policy(
    out_dir: str | Path,
    corpus: list[str] | None = None,
    seed: int = 0,
    hidden: int = 64,
    heads: int = 4,
    lora: bool = True,
) -> tuple[Any, Any]:
    """(peft-wrapped tiny Llama, tokenizer); the base checkpoint is saved under `out_dir`."""
    from peft import LoraConfig, get_peft_model

    from vprl.train.policy.tiny import TinyModelConfig, build_model

    out_dir = Path(out_dir)
    tok = build_tokenizer(out_dir, corpus)
    sizes = TinyModelConfig(
        vocab_size=600, hidden_size=hidden, num_layers=2, num_heads=heads, intermediate_size=2 * hidden, context=1024
    )
    model = build_model(tok, sizes, seed=seed)
    model.save_pretrained(str(out_dir))
    if not lora:
        return model, tok
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config), tok


SIGNATURE = "def execute_command(image) -> str:"
WRONG = "\n    return 'no such answer'"
WRONG_2 = "\n    return 'zzz'"
CRASH = "\n    return 1/0"


def prompt_for(query: str) -> str:
    """A short prompt (query comment + signature) instead of the full API listing, to keep the tiny
    model's sequences small; the loop treats it like any other prompt text."""
    return f"# {query}\n{SIGNATURE}"


def build_world(root: str | Path) -> tuple[Path, list[Any], list[str]]:
    """(world root, three training examples, their gold programs)."""
    from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
    from vprl.data.shapes.tasks import load_shapes_tasks

    root = Path(root)
    build_dataset(BuildConfig(out=str(root), train=10, val=2, winoground=1, sugarcrepe=1, refcoco=1, seed=3))
    examples = load_shapes_tasks(root, ["train"])["train"][:3]
    gold = load_gold_programs(root)["vqa"]
    return root, examples, [gold[e.query] for e in examples]


@contextmanager
def oracle_scorer(root: Path) -> Iterator[Any]:
    """A `ProgramScorer` over the sandboxed runner, the oracle tools and the correctness reward."""
    from vprl.executor.host import ToolHost
    from vprl.executor.runner import RunnerConfig, SyncRunner
    from vprl.executor.tools.stack import build_backend
    from vprl.rewards.compose import RewardComposer, RewardConfig
    from vprl.train.rollouts.scorer import ProgramScorer

    backend = build_backend({"backend": "oracle", "scene_graphs": str(root / "gqa" / "train_sceneGraphs.json")})
    with SyncRunner(ToolHost(backend), RunnerConfig(slots=2)) as runner:
        yield ProgramScorer(runner, RewardComposer(RewardConfig()))


def world_corpus(world) -> list[str]:
    return [prompt_for(e.query) for e in world[1]] + list(world[2])


def pools_for(world) -> dict[str, list[str]]:
    """Completions per prompt. q0: gold, a reformatted copy of gold (same AST, so deduplicated), a
    wrong answer, a crash; q1: gold among wrong answers; q2: wrong answers only (all rewards equal:
    a zero-variance group)."""
    from vprl.train.rest.sft import program_body

    _, examples, gold = world
    bodies = [program_body(g) for g in gold]
    return {
        prompt_for(examples[0].query): [bodies[0], bodies[0].replace(" = ", "  =  "), WRONG, CRASH],
        prompt_for(examples[1].query): [WRONG, bodies[1], WRONG_2, WRONG],
        prompt_for(examples[2].query): [WRONG, WRONG_2, WRONG, WRONG_2],
    }


def lora_sum(model) -> float:
    return float(sum(p.detach().abs().sum() for n, p in model.named_parameters() if "lora_" in n))


class PoolGenerator:
    """Test double for a `Generator`: fixed completions per prompt (bodies of real programs). It
    records its calls and the policy's LoRA weights at each call (what a real sampler would use)."""

    def __init__(self, pools: dict[str, list[str]], model=None):
        self.pools, self.model, self.calls, self.lora_sums = pools, model, [], []

    def generate(self, prompts, sampling):
        self.calls.append((list(prompts), sampling.n, sampling.seed))
        if self.model is not None:
            self.lora_sums.append(lora_sum(self.model))
        return [[self.pools[p][j % len(self.pools[p])] for j in range(sampling.n)] for p in prompts]


def sft_args(out_dir, **changes):
    """The recipe's SFT arguments (`SFTArgs`, the ViUniT defaults) as a test's ReST loop takes them."""
    from vprl.train.recipe.trainer_args import SFTArgs

    return SFTArgs(output_dir=str(out_dir), report_to="none", disable_tqdm=True, **changes)
