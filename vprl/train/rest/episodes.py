"""ReST over repair episodes: each of a question's `n` samples is an episode (`EpisodeLoop`), written
by the run's text generator in the conversation the policy is trained on, and ReST keeps the
episodes whose *final* program is rewarded. What is trained is that final program after its
context (the prompt, and for a repaired episode the earlier programs and their feedback blocks),
so a repaired episode teaches the repair and never the wrong first program.

The rows and the contexts go through the loop's gather and selection as one-turn samples do
(`vprl.train.rest.select`); a row's total is the episode's reward (`episode_reward`: the final
program's, less the turn cost).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from vprl.data.records import Example
from vprl.executor.program import program_key
from vprl.rewards.feedback import Feedback
from vprl.train.prompts import completion_to_program
from vprl.train.prompts.conversation import body_of, conversation_text, signature_of
from vprl.train.repair.episode import Episode
from vprl.train.repair.turns import EpisodeLoop, RepairConfig, episode_reward
from vprl.train.rollouts.log import RolloutRow
from vprl.train.rollouts.scorer import ProgramScorer
from vprl.train.sampling.generator import Generator, SamplingSettings


def sample_episodes(
    k: int,
    examples: Sequence[Example],
    prompts: Sequence[str],
    first: Sequence[str],
    *,
    scorer: ProgramScorer,
    generator: Generator,
    sampling: SamplingSettings,
    repair: RepairConfig,
    prompt_hash: str,
    policy_name: str,
) -> tuple[list[RolloutRow], list[str | None], list[Episode]]:
    """Episodes from the first programs (one per row: `examples[i]`, its prompt `prompts[i]`); each
    later turn sampled once from the conversation so far. Returns a row per episode (its final
    program, its reward), the SFT context of each final program (None: the prompt itself) and the
    episodes."""
    bodies = [[body_of(p)] for p in first]
    shown: list[list[Feedback]] = [[] for _ in first]
    turn = [0]

    def next_programs(rows: list[int], feedbacks: list[Feedback]) -> list[str | None]:
        turn[0] += 1
        texts = []
        for i, fb in zip(rows, feedbacks, strict=True):
            shown[i].append(fb)
            texts.append(conversation_text(prompts[i], bodies[i], shown[i]))
        seeded = dataclasses.replace(
            sampling, n=1, seed=None if sampling.seed is None else sampling.seed + 1000 * turn[0]
        )
        completions = generator.generate(texts, seeded)
        out = []
        for i, cs in zip(rows, completions, strict=True):
            program = completion_to_program(signature_of(prompts[i]), cs[0])
            bodies[i].append(body_of(program))
            out.append(program)
        return out

    episodes = EpisodeLoop(scorer, repair).run(examples, first, next_programs)
    rows, contexts = [], []
    for i, (example, episode) in enumerate(zip(examples, episodes, strict=True)):
        final = episode.final
        rows.append(
            RolloutRow(
                step=k,
                example_id=example.id,
                prompt_hash=prompt_hash,
                program=final.program,
                status=final.status,
                answer=final.answer,
                components=dict(final.components),
                total=episode_reward(episode, repair),
                query=example.query,
                dataset=example.dataset,
                task=example.task,
                group=example.group or "",
                program_key=program_key(final.program),
                error=final.error,
                policy=policy_name,
                tool_calls=list(final.tool_calls),
            )
        )
        earlier = len(episode.turns) - 1
        contexts.append(conversation_text(prompts[i], bodies[i][:earlier], shown[i][:earlier]) if earlier else None)
    return rows, contexts, episodes
