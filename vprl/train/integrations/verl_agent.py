"""Repair episodes on verl: an agent loop (`vprl_repair`) that plays one episode per sample with
verl's own rollout server, runs every program through vprl's scoring session and hands verl the
whole exchange, the feedback out of the loss.

verl calls `run(sampling_params, **row)` once per sample, concurrently, each through
`AgentLoopWorker._run_agent_loop`, which instantiates it with hydra from its entry in
`rollout.agent.agent_loop_config_path` (the file `python -m vprl.train.integrations.verl_data`
writes for a recipe with repair). The class is deliberately not `@register`ed: verl's decorator
would replace that entry, settings and all, with a bare one the moment hydra first imports this
module. A turn is
sampled by `server_manager.generate` from the prompt and everything before it, its program is
submitted to the same scoring window as `for_verl.compute_score` (concurrent samples run in one
sandbox batch), judged by `vprl.train.repair.turns.judged_turn` (the rule trl's episodes use), and a
turn that gets feedback has the feedback block appended, tokenized on its own, with
`response_mask` 0. The sampled ids are never re-tokenized, so the next turn is drawn from exactly
the context verl's actor later scores.

The episode's reward is the final program's less `turn_cost` per extra turn and `repeat_cost` per
repeated program (`episode_reward`), returned as
`reward_score`: verl puts it on the last token (`rm_scores`) and does not score the sample again.
Where the final program was never judged (our own failure), it scores as `for_verl` scores an
unscorable sample. `reward_extra_info` carries per sample the final program's reward components,
`turns`, `first_right`, `final_right` (the repair and break rates are their means).

Settings: the recipe's repair section, written by `verl_data` into the agent loop's entry
(`max_turns`, `turn_cost`, `repeat_cost`, `stop_when`, `check`, `pass_threshold`, `show`, `framing`, `turn_tokens`);
the scoring session's from the trainer config's `reward.custom_reward_function.reward_kwargs`, the
same `settings` file and `batch_wait_s` the reward function reads. verl's `rollout.response_length`
bounds the whole episode: a turn whose block would not leave room for a program ends the episode.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from vprl.rewards.feedback import FeedbackConfig
from vprl.train.integrations.for_verl import sample_of, scoring_window
from vprl.train.prompts import STOP_SEQUENCES, completion_to_program, turn_end_ids
from vprl.train.prompts.conversation import RepairFormat, opener_of
from vprl.train.repair.episode import Episode
from vprl.train.repair.turns import RepairConfig, episode_reward, judged_turn

NAME = "vprl_repair"
# reward_kwargs that configure the scoring window rather than the session
WINDOW_KEYS = ("batch_wait_s", "max_batch", "unscorable_score")


class RepairAgentLoop(AgentLoopBase):
    def __init__(
        self,
        *args: Any,
        max_turns: int = 2,
        turn_cost: float = 0.0,
        repeat_cost: float = 0.0,
        stop_when: str = "ran",
        check: str | None = None,
        pass_threshold: float = 1.0,
        show: Any = ("error", "trace", "unit_tests"),
        framing: str = "plain",
        turn_tokens: int | None = None,
        stop_at_program_end: bool = True,
        **kwargs: Any,
    ):
        kwargs.pop("name", None)  # the registry entry's own key, handed on by hydra
        super().__init__(*args, **kwargs)
        feedback = FeedbackConfig(stop_when=stop_when, check=check, pass_threshold=pass_threshold, show=tuple(show))
        self.repair = RepairConfig(max_turns, turn_cost, feedback, repeat_cost)
        self.format = RepairFormat(self.tokenizer, framing)
        self.turn_end = set(turn_end_ids(self.tokenizer, framing))
        self.response_length = int(self.rollout_config.response_length)
        self.turn_tokens = int(turn_tokens) if turn_tokens else self.response_length
        self.stops = list(STOP_SEQUENCES) if stop_at_program_end else []
        reward = self.config.get("reward", {}).get("custom_reward_function", {}) or {}
        inline = dict(reward.get("reward_kwargs", {}) or {})
        self.window_args = {k: inline.pop(k) for k in WINDOW_KEYS if k in inline}
        self.settings = inline.pop("settings", None)
        self.inline = inline

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        example, _ = sample_of("", kwargs.get("extra_info"), f"verl agent loop {NAME}")
        messages = list(kwargs["raw_prompt"])
        opener = opener_of(str(messages[-1]["content"]))
        window = scoring_window(self.settings, self.inline, **self.window_args)
        prompt_ids = await self.ct_build_initial_tokens(messages)
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        turns = []
        row: dict[str, Any] = {}
        generating = scoring = 0.0
        for k in range(self.repair.max_turns):
            params = dict(sampling_params, max_tokens=min(self.turn_tokens, self.response_length - len(ids)))
            if self.stops:
                params["stop"] = self.stops
            started = time.perf_counter()
            out = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=prompt_ids + ids, sampling_params=params
            )
            generating += time.perf_counter() - started
            sampled = list(out.token_ids)
            ids += sampled
            mask += [1] * len(sampled)
            logprobs += list(out.log_probs) if out.log_probs else [0.0] * len(sampled)
            text = self.tokenizer.decode(sampled, skip_special_tokens=True)
            program = completion_to_program(opener, text)
            started = time.perf_counter()
            scored = await window.submit(example, program)
            scoring += time.perf_counter() - started
            row, check = scored.row, self.repair.feedback.check
            if check is not None and check not in scored.batch.rewards.components:
                raise ValueError(f"{NAME}: check {check!r} is not one of the session's rewards")
            last = k == self.repair.max_turns - 1
            turn = judged_turn(self.repair.feedback, program, scored.batch, scored.index, last, example.query)
            block: list[int] = []
            if turn.feedback is not None:
                ended = bool(sampled) and sampled[-1] in self.turn_end
                block = self.format.block_ids(turn.feedback, opener, ended, text.endswith("\n"))
                if len(ids) + len(block) >= self.response_length:  # no room for a program after it
                    turn, block = replace(turn, feedback=None), []
            turns.append(turn)
            if turn.feedback is None:
                break
            ids += block
            mask += [0] * len(block)
            logprobs += [0.0] * len(block)
        episode = Episode(example.id, tuple(turns))
        reward = episode_reward(episode, self.repair)
        extra = {name: value for name, value in row.items() if name not in ("score",)}
        extra.update(turns=len(turns), first_right=episode.first.right(), final_right=episode.final.right())
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=ids[: self.response_length],
            response_mask=mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if sampling_params.get("logprobs") else None,
            reward_score=float(row["score"] if reward is None else reward),
            num_turns=2 * len(turns),
            metrics=AgentLoopMetrics(generate_sequences=generating, tool_calls=scoring),
            extra_fields={
                "reward_extra_info": extra,
                "turn_scores": [t.total for t in turns],
                "repair_episode": json.dumps(episode.to_json(), default=str),
            },
        )
