"""What `tests/vllm_cpu_driver.py` measures of the repair extras on the real engine (#35): the guide's
rows (`repair_guide_weight`) and the later-turns KL (`repair_kl_turns: later`), on batches whose every
token the engine sampled. Measures only: the verdicts are tests/test_vllm_cpu_engine.py's."""

from __future__ import annotations

import contextlib
import zlib
from typing import Any


@contextlib.contextmanager
def _replaced(owner: type, name: str, wrap: Any):
    """`owner.name` replaced by `wrap(original)` while the block runs."""
    original = getattr(owner, name)
    setattr(owner, name, wrap(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def later_turns_right():
    """Every later program scored right and a first program by a hash of its text, as
    tests/test_repair_guide.py does: the test policy's programs are seldom right, and a batch without a
    right final program has nothing to guide with. The episodes' own judgement reads these scores."""
    from vprl.train.rollouts.scorer import ProgramScorer

    turn = {"n": 0}

    def scoring(original):
        def score(self, examples, programs, progress=False):
            scored = original(self, examples, programs, progress)
            later = turn["n"] % 2 == 1  # the loop scores each turn's programs in one call, two turns a batch
            turn["n"] += 1
            right = [float(later or zlib.crc32(p.encode()) % 3 == 0) for p in programs]
            scored.rewards.components["correctness"] = right
            return scored

        return score

    with _replaced(ProgramScorer, "score", scoring):
        yield


class GuideProbe:
    """Per generation batch: how many rows were guided, and how many guide rows are not the row's own
    context (prompt, first program, feedback block as sampled) followed by its source row's last program
    tokens, or whose guiding tokens do not decode to the program the source episode judged right."""

    def __init__(self):
        self.batches: list[dict[str, int]] = []

    def installed(self):
        from vprl.train.repair.guide import RepairGuideMixin

        def measuring(original):
            def measured(trainer, inputs):
                output = original(trainer, inputs)
                if "repair_guide_ids" in output:
                    self.batches.append(self.check(output, trainer))
                return output

            return measured

        return _replaced(RepairGuideMixin, "_generate_and_score_completions", measuring)

    @staticmethod
    def check(output: dict, trainer: Any) -> dict[str, int]:
        from vprl.train.prompts.conversation import opener_of
        from vprl.train.prompts.framing import completion_to_program
        from vprl.train.repair.guide import guide_targets

        episodes = trainer.rollout_func.last_episodes
        tokenizer = trainer.processing_class
        ids, mask = output["repair_guide_ids"], output["repair_guide_mask"]
        layout = []
        for row_ids, row_mask, env in zip(output["completion_ids"], output["completion_mask"], output["tool_mask"]):
            n = int(row_mask.sum())
            layout.append((row_ids[:n].tolist(), env[:n].tolist()))
        counts = {"rows": len(episodes), "guided": 0, "context_mismatch": 0, "program_mismatch": 0, "unguided_mask": 0}
        for row, source in enumerate(guide_targets(episodes)):
            if source is None:
                counts["unguided_mask"] += int(mask[row].sum() > 0)
                continue
            counts["guided"] += 1
            own, env = layout[row]
            second = env.index(0) + env[env.index(0) :].index(1)
            src_ids, src_env = layout[source]
            last = max(i for i, v in enumerate(src_env) if v == 0) + 1
            target = src_ids[last:]
            prompt = output["prompt_ids"][row][output["prompt_mask"][row].bool()].tolist()
            expected = prompt + own[:second] + target
            n = len(expected)
            good = ids[row, :n].tolist() == expected and mask[row].sum() == len(target) and mask[row, n - 1] == 1
            counts["context_mismatch"] += int(not good)
            src_prompt = output["prompt_ids"][source][output["prompt_mask"][source].bool()]
            opener = opener_of(tokenizer.decode(src_prompt, skip_special_tokens=True))
            program = completion_to_program(opener, tokenizer.decode(target, skip_special_tokens=True))
            counts["program_mismatch"] += int(program != episodes[source].final.program)
        return counts


class LaterKLProbe:
    """Per log-probability pass of the loss under `repair_kl_turns: later`: the largest gap between the
    reference and the policy's log-probabilities that the KL term reads, over first-turn program tokens
    and over later program tokens, from the batch the mixin built."""

    def __init__(self):
        self.passes: list[dict[str, float]] = []

    def installed(self):
        from vprl.train.repair.later_kl import LaterTurnsKLMixin

        def measuring(original):
            def measured(trainer, *args, **kwargs):
                batch = trainer._kl_batch  # the mixin's copy of the batch, before the pass consumes it
                out = original(trainer, *args, **kwargs)
                if batch is not None:
                    self.passes.append(self.gaps(batch, out[0]))
                return out

            return measured

        return _replaced(LaterTurnsKLMixin, "_get_per_token_logps_and_entropies", measuring)

    @staticmethod
    def gaps(batch: dict, logps: Any) -> dict[str, float]:
        from vprl.train.repair.later_kl import REF, first_turn_mask

        counted = batch["completion_mask"].bool()
        first = first_turn_mask(batch["tool_mask"]) & counted
        later = ~first_turn_mask(batch["tool_mask"]) & batch["tool_mask"].bool() & counted
        gap = (batch[REF] - logps.detach()).abs()
        return {
            "first_tokens": int(first.sum()),
            "later_tokens": int(later.sum()),
            "first_max": float(gap[first].max()) if first.any() else 0.0,
            "later_max": float(gap[later].max()) if later.any() else 0.0,
        }
