"""How promising a bootstrapped policy is for RL, per question family: greedy accuracy, the mean
accuracy of k samples, pass@k (some sample is right), and the gold program's accuracy with the
same tools (the ceiling). Programs run in the sandboxed executor and are scored by the
correctness reward, as in training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vprl.data.records import Example
from vprl.executor.backends import open_backend
from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.rewards.build import build_rewards
from vprl.rewards.compose import RewardConfig
from vprl.train.prompts import PromptConfig, PromptTemplate, completion_to_program
from vprl.train.rollouts.scorer import ProgramScorer
from vprl.train.sampling.generator import policy_sampling
from vprl.train.sampling.hf import HFGenerator


@dataclass(frozen=True)
class FamilyScore:
    n: int
    greedy: float
    sampled: float  # mean accuracy over all samples
    pass_at_k: float
    gold: float


@dataclass(frozen=True)
class PolicyEval:
    k: int
    families: dict[str, FamilyScore]
    overall: FamilyScore
    repair: dict[str, Any] | None = None  # `repair_pairs.repair_figure`'s, where the policy learned repair

    def to_json(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "overall": asdict(self.overall),
            "families": {f: asdict(s) for f, s in self.families.items()},
            **({"repair": self.repair} if self.repair is not None else {}),
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> PolicyEval:
        families = {f: FamilyScore(**s) for f, s in row["families"].items()}
        return cls(row["k"], families, FamilyScore(**row["overall"]), row.get("repair"))


def tool_backend(tools: str, root: Path):
    """A stack's name or YAML path: `oracle` answers from the world's scene graphs (unless the stack
    names its own), `shapes` from its pixels."""
    return open_backend(tools, worlds=[root])


def open_runner(cfg, root: Path) -> SyncRunner:
    """The sandboxed runner over `cfg.tool_stack`'s tools for the world at `root`."""
    backend = tool_backend(cfg.tool_stack, root)
    return SyncRunner(ToolHost(backend), RunnerConfig(slots=cfg.executor_slots, sandbox=cfg.executor_sandbox))


def bare_prompts(examples: list[Example]) -> list[str]:
    template = PromptTemplate.from_config(PromptConfig(layout="bare", task="vqa"))
    return [template.build(e.query) for e in examples]


def _score(scores: list[float], n: int, k: int) -> tuple[float, float, float, float]:
    """(greedy, sampled mean, pass@k, gold) means over n examples; layout is per example
    [greedy, k samples..., gold]."""
    per = k + 2
    rows = [scores[i * per : (i + 1) * per] for i in range(n)]
    greedy = sum(r[0] for r in rows) / n
    sampled = sum(sum(r[1 : k + 1]) / k for r in rows) / n
    passed = sum(max(r[1 : k + 1]) >= 1.0 for r in rows) / n
    gold = sum(r[-1] for r in rows) / n
    return greedy, sampled, passed, gold


def evaluate_policy(model, tokenizer, examples: list[Example], gold: dict[str, str], root: Path, cfg) -> PolicyEval:
    """Greedy and `cfg.num_generations` sampled programs per example, scored with `cfg.tool_stack`."""
    if not examples:
        raise ValueError("evaluate_policy needs at least one example")
    k = cfg.num_generations
    prompts = bare_prompts(examples)
    generator = HFGenerator(model, tokenizer, batch_size=128, style="plain")
    greedy = generator.generate(prompts, policy_sampling(temperature=0, max_new_tokens=cfg.max_completion_length))
    sampling = policy_sampling(
        temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_completion_length, n=k, seed=cfg.seed
    )
    samples = generator.generate(prompts, sampling)
    jobs: list[tuple[Example, str]] = []
    for e, p, g, s in zip(examples, prompts, greedy, samples, strict=True):
        jobs += [(e, completion_to_program(p, c)) for c in g + s] + [(e, gold[e.query])]
    with open_runner(cfg, root) as runner:
        batch = ProgramScorer(runner, build_rewards(RewardConfig())).score(
            [j[0] for j in jobs], [j[1] for j in jobs], progress=True
        )
    scores = [c if c is not None else 0.0 for c in batch.rewards.components["correctness"]]
    per = k + 2
    families: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        families.setdefault(e.group or "", []).append(i)
    out = {}
    for family, idx in sorted(families.items()):
        fam_scores = [s for i in idx for s in scores[i * per : (i + 1) * per]]
        out[family] = FamilyScore(len(idx), *(round(v, 4) for v in _score(fam_scores, len(idx), k)))
    overall = FamilyScore(len(examples), *(round(v, 4) for v in _score(scores, len(examples), k)))
    return PolicyEval(k, out, overall)


def format_table(result: PolicyEval) -> str:
    head = f"{'family':<22}{'n':>5}{'greedy':>9}{'sampled':>9}{f'pass@{result.k}':>9}{'gold':>8}"
    lines = [head, "-" * len(head)]
    for name, s in [*result.families.items(), ("all", result.overall)]:
        lines.append(
            f"{name:<22}{s.n:>5}{100 * s.greedy:>8.1f}%{100 * s.sampled:>8.1f}%{100 * s.pass_at_k:>8.1f}%"
            f"{100 * s.gold:>7.1f}%"
        )

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    for how, r in (("greedy", result.repair), ("sampled", (result.repair or {}).get("sampled"))):
        if r and r["got_feedback"]:
            lines.append(
                f"repair ({how}, 2 turns): {r['got_feedback']} first programs got feedback, {r['first_wrong']} of "
                f"them wrong: repaired {pct(r['repaired'])}, right ones broken {pct(r['broken'])}; second programs "
                f"passing their unit tests {pct(r['passed'])}, running {pct(r.get('ran'))}, "
                f"unchanged {pct(r.get('unchanged'))}"
                + (
                    ""
                    if r.get("resample_lift") is None
                    else f"; lift over a fresh sample {100 * r['resample_lift']:+.1f} pts"
                )
            )
    return "\n".join(lines)
