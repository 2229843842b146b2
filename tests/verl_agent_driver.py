"""Plays repair episodes through verl's own agent loop worker, for tests/test_verl_agent.py, in a
subprocess with verl on PYTHONPATH (verl pins transformers<5.11, so it cannot live in the venv).

    python tests/verl_agent_driver.py CASE.json

CASE.json: {"config_dir", "overrides", "rows" (verl's parquet rows), "n" (samples per row), "seed",
"out" (where the result's JSON goes: verl prints to stdout), "spread" (each program's total replaced
by a number drawn from its text, `spread_total`: a tiny policy's episodes may all score the same, and
a group of equal rewards has no advantage whose gradient could be checked)}.
The overrides name the tiny policy (`actor_rollout_ref.model.path`) and the files `verl_data` wrote.
verl's `AgentLoopWorker` (what each of its agent-loop actors is, without Ray) instantiates the agent
loop from the registry file and runs every sample as verl does; the LLM server is a stand-in that
draws each token from the policy itself (temperature 1) and reports its log-probability, as vLLM
with `calculate_log_probs` does. Then, as verl's actor would: the policy's log-probabilities of the
response tokens over verl's padded batch, GRPO's advantage from `rm_scores`, and verl's PPO loss's
gradient with respect to the logits. Writes one JSON object per sample (see `main`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from transformers import AutoModelForCausalLM
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, compute_policy_loss_vanilla
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.replica import TokenOutput
from verl_side import spread_total

from vprl.train.prompts import STOP_SEQUENCES


class PolicyServer:
    """Stands in for verl's LLM server client: samples from the policy, one token at a time."""

    def __init__(self, model, tokenizer, seed: int):
        self.model, self.tokenizer = model, tokenizer
        self.generator = torch.Generator().manual_seed(seed)
        self.lock = asyncio.Lock()  # one sample at a time keeps the draws reproducible
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        async with self.lock:
            return self._sample(list(prompt_ids), dict(sampling_params))

    @torch.no_grad()
    def _sample(self, context: list[int], params: dict) -> TokenOutput:
        assert params["top_p"] == 1.0 and params.get("top_k", -1) in (-1, 0), params
        self.calls.append({"context": len(context), "max_tokens": params["max_tokens"], "stop": params.get("stop")})
        tokens, logps = [], []
        for _ in range(params["max_tokens"]):
            logits = self.model(torch.tensor([context + tokens])).logits[0, -1].float() / params["temperature"]
            logp = torch.log_softmax(logits, -1)
            token = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
            tokens.append(token)
            logps.append(float(logp[token]))
            if token == self.tokenizer.eos_token_id:
                break
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            if any(s in text for s in params.get("stop") or ()):  # as vLLM: the ids up to the stop
                break
        return TokenOutput(token_ids=tokens, log_probs=logps, stop_reason="completed")


def _spread_scores() -> None:
    from vprl.train.integrations.session import ScoringSession

    original = ScoringSession.ascore

    async def ascore(self, examples, programs):
        scored = await original(self, examples, programs)
        scored.rewards.totals[:] = [spread_total(p) for p in programs]
        return scored

    ScoringSession.ascore = ascore


def _objects(values: list) -> np.ndarray:
    """A one-dimensional object array (np.array would nest lists of messages)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def main(path: str) -> None:
    case = json.loads(Path(path).read_text(encoding="utf-8"))
    if case.get("spread"):
        _spread_scores()
    with initialize_config_dir(config_dir=case["config_dir"], version_base=None):
        config = compose(config_name="viunit_grpo", overrides=case["overrides"])
    model = AutoModelForCausalLM.from_pretrained(config.actor_rollout_ref.model.path).float().eval()
    torch.manual_seed(case["seed"])
    worker_tokenizer = None

    async def play() -> DataProto:
        nonlocal worker_tokenizer
        server = PolicyServer(model, None, case["seed"])
        worker = AgentLoopWorker(config, llm_client=server)
        server.tokenizer = worker_tokenizer = worker.tokenizer
        rows = [row for row in case["rows"] for _ in range(case["n"])]
        batch = DataProto.from_dict(
            non_tensors={
                "raw_prompt": _objects([r["prompt"] for r in rows]),
                "extra_info": _objects([r["extra_info"] for r in rows]),
                "data_source": _objects([r["data_source"] for r in rows]),
                "uid": _objects([str(r["extra_info"]["index"]) for r in rows]),
            }
        )
        out = await worker.generate_sequences(batch)
        out.meta_info["calls"] = server.calls
        return out

    out = asyncio.run(play())
    b = out.batch
    prompt_width = b["prompts"].shape[1]
    advantages, _ = compute_grpo_outcome_advantage(
        b["rm_scores"], b["response_mask"], np.array(out.non_tensor_batch["uid"])
    )
    # verl's actor: one forward over the padded batch, log-probabilities of the response tokens
    position_ids = b["position_ids"]
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=position_ids).logits
    logits = logits[:, prompt_width - 1 : -1].float()
    logits.retain_grad()
    log_prob = torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    loss, _ = compute_policy_loss_vanilla(
        b["rollout_log_probs"], log_prob, advantages, b["response_mask"], loss_agg_mode="token-mean", config=actor
    )
    loss.backward()
    grad = logits.grad.norm(dim=-1)
    tokenizer = worker_tokenizer
    samples = []
    for i in range(len(out)):
        n = int(b["attention_mask"][i, prompt_width:].sum())
        mask = b["response_mask"][i, :n].tolist()
        ids = b["responses"][i, :n].tolist()
        sampled = [k for k in range(n) if mask[k]]
        fed = [k for k in range(n) if not mask[k]]
        samples.append(
            {
                "prompt": tokenizer.decode([t for t in b["prompts"][i].tolist() if t != tokenizer.pad_token_id]),
                "mask": mask,
                "feedback": tokenizer.decode([ids[k] for k in fed]),
                "programs_text": tokenizer.decode([ids[k] for k in sampled]),
                "score_sum": float(b["rm_scores"][i].sum()),
                "score_at": int(b["rm_scores"][i].nonzero().flatten().tolist()[-1])
                if b["rm_scores"][i].any()
                else None,
                "advantages": sorted({round(float(advantages[i, k]), 6) for k in sampled}),
                "max_logp_gap": max(
                    abs(float(log_prob[i, k].detach() - b["rollout_log_probs"][i, k])) for k in sampled
                ),
                "feedback_grad": max((float(grad[i, k]) for k in fed), default=0.0),
                "program_grad": max(float(grad[i, k]) for k in sampled),
                "episode": json.loads(out.non_tensor_batch["repair_episode"][i]),
                "turns": int(out.non_tensor_batch["turns"][i]),
                "num_turns": int(out.non_tensor_batch["__num_turns__"][i]),
            }
        )
    from vprl.train.integrations import for_verl

    for_verl.close()
    result = {"samples": samples, "calls": out.meta_info["calls"], "stops": list(STOP_SEQUENCES)}
    Path(case["out"]).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
