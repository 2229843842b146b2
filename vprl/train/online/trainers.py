"""trl's GRPO and RLOO trainers with the two things visual programs need on top.

- Stop at the end of the program. A completion is the body of `execute_command`; what the model
  writes after it (the next `# query`, another `def`) is cut at the first stop sequence, tokens
  included, and ends with EOS, so the loss covers only the program and its end. vLLM gets the
  same stops as sampling parameters; transformers' generate cannot take stop strings through trl,
  so its completions are cut here. In a chat frame the turn-end token (CodeGemma's
  `<end_of_turn>`, which no stop string can see) ends a completion too, as its last token.
- vLLM's top-k/top-p log-probabilities on the trainer's footing, from trl's own old-log-probability
  forward (`vprl.train.online.sampler_logprobs`).
- Zero-variance groups: the groups (samples of one prompt) whose scorable rewards are all equal
  carry no learning signal (advantage 0). Their count and share are logged every step from the
  rewards of all processes; with `filter_zero_variance` their advantages are zeroed (RLOO's KL
  penalty included), and for GRPO their tokens also leave the mask and the token count, so for
  token-normalised losses (dapo, bnpo, dr_grpo) the step is as if the groups had not been sampled.
  For per-sequence means (loss_type grpo, RLOO) they contribute zero but still count in the mean.
  trl itself only reports `frac_reward_zero_std`.
- Execution overlaps the log-probability passes. trl's step is: generate, compute the old
  log-probabilities (RLOO always; GRPO with vLLM importance sampling or when generation and
  optimisation steps are misaligned) and the reference ones (beta > 0), then call the reward
  functions, which run the programs. With `overlap_execution`, each process hands its own
  completions to the `TrlRewardAdapter` as soon as `_generate` returns, so the programs run in
  their sandboxes (and the rewards are composed) while the forward passes run; the reward call
  then only waits for what is left. Without a pass in between (GRPO on transformers with beta 0)
  there is nothing to hide behind, and the order is as before.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from peft import PeftModel
from trl import GRPOTrainer, RLOOTrainer

from vprl.rewards.groups import zero_variance_groups
from vprl.rewards.trl_adapter import TrlRewardAdapter
from vprl.train.online.sampler_logprobs import NOT_SAMPLED, KeptMassProbe, SamplerFilters, check_correctable
from vprl.train.online.weight_sync import drift_free_sync, unsupported_reason
from vprl.train.repair.guide import RepairGuideMixin
from vprl.train.repair.later_kl import LaterTurnsKLMixin
from vprl.train.repair.replay import RepairReplayMixin
from vprl.train.repair.rloo import RLOOEpisodesMixin
from vprl.train.repair.turn_advantage import TurnAdvantageMixin

logger = logging.getLogger(__name__)


def stop_cut(
    ids: Sequence[int], tokenizer: Any, stops: Sequence[str], stop_ids: Sequence[int] = ()
) -> tuple[int, bool]:
    """How many leading tokens to keep, and whether a stop ended them: through the first stop token
    (a chat frame's turn end) or the token that completes the first stop sequence, whichever comes
    first (all of them, not stopped, when neither occurs). The flag matters when the stop is the last
    token the length limit allowed: the count alone cannot tell it from a program the limit cut.
    Binary search over prefixes: containment only grows."""
    ids = list(ids)
    at_token = next((i + 1 for i, t in enumerate(ids) if t in stop_ids), None)
    ids = ids[:at_token]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if not any(s in text for s in stops):
        return len(ids), at_token is not None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        prefix = tokenizer.decode(ids[:mid], skip_special_tokens=True)
        if any(s in prefix for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo, True


def stop_length(ids: Sequence[int], tokenizer: Any, stops: Sequence[str], stop_ids: Sequence[int] = ()) -> int:
    """How many leading tokens `stop_cut` keeps."""
    return stop_cut(ids, tokenizer, stops, stop_ids)[0]


def stop_at_turn_end(model: Any, args: Any, turn_end: Sequence[int]) -> None:
    """Make a chat frame's turn-end token end generation on both paths, before trl is built (it
    reads both at construction): an EOS of the model's generation config (transformers' generate
    stops there and trl masks what follows and counts the completion as ended) and a
    `stop_token_ids` entry of vLLM's sampling parameters."""
    if not turn_end:
        return
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    model.generation_config.eos_token_id = [*eos, *(t for t in turn_end if t not in eos)]
    if args.use_vllm:
        kwargs = dict(args.generation_kwargs or {})
        kwargs["stop_token_ids"] = [*kwargs.get("stop_token_ids", []), *turn_end]
        args.generation_kwargs = kwargs


class ProgramTrainerMixin:
    """Mixed in front of GRPOTrainer / RLOOTrainer; configure with `setup_program_training`."""

    stop_sequences: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()  # a chat frame's turn end (`stop_at_turn_end`)
    filter_zero_variance: bool = False
    filter_by_mask: bool = True  # also drop filtered rows' tokens from the mask (GRPO; not RLOO)
    reward_adapter: TrlRewardAdapter | None = None
    overlap_execution: bool = False
    completions_at: int  # where `_generate` returns the completions (trl's tuples differ per trainer)
    _last_rewards_per_func: torch.Tensor | None = None
    _sampler_filters: SamplerFilters = SamplerFilters()
    _batch_inputs: list[dict[str, Any]] | None = None
    _kept_mass_due: bool = False  # the next log-probability pass is trl's old one, under the correction
    _untruncation: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def setup_program_training(
        self,
        stop_sequences: Sequence[str],
        filter_zero_variance: bool,
        reward_adapter: TrlRewardAdapter | None = None,
        overlap_execution: bool = True,
        stop_token_ids: Sequence[int] = (),
    ) -> None:
        """`reward_adapter`: the adapter whose reward functions the trainer was given; with
        `overlap_execution` its scoring starts right after generation instead of at the reward call.
        `stop_token_ids`: tokens that end a completion as its last token (a chat frame's turn end)."""
        self.stop_sequences = tuple(stop_sequences)
        self.stop_token_ids = tuple(stop_token_ids)
        self.filter_zero_variance = filter_zero_variance
        self.reward_adapter = reward_adapter
        self.overlap_execution = overlap_execution and reward_adapter is not None
        self._sampler_filters = SamplerFilters.of(self)
        if self._corrects_vllm_sampling:
            check_correctable(self)
        # trl merges the LoRA into the bf16 base and unmerges it at every weight sync, which drifts the
        # base (docs/distributed.md); the merged weights are computed out of place instead.
        generation = getattr(self, "vllm_generation", None)  # only set with use_vllm
        if generation is not None and not drift_free_sync(generation):
            logger.info("vLLM weight sync keeps trl's in-place merge: %s", unsupported_reason(generation))

    def _generate(self, prompts):
        out = super()._generate(prompts)
        inputs = self._batch_inputs
        loop = getattr(self, "async_loop", None)  # trl starts it when a reward function is async
        if not self.overlap_execution or inputs is None or loop is None:
            return out
        completions = out[self.completions_at]
        if not isinstance(completions, list) or len(completions) != len(inputs):
            raise RuntimeError(
                f"{type(self).__name__}: expected the completions at position {self.completions_at} of what "
                "trl's `_generate` returns; this trl version returns something else there"
            )
        column = self.reward_adapter.id_column
        if all(column in x for x in inputs):  # without it the reward call raises the clear error
            self.reward_adapter.prefetch(prompts, completions, [x[column] for x in inputs], loop)
        return out

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        out = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        ids, logprobs = out if isinstance(out, tuple) else (out, None)
        if not self.stop_sequences and not self.stop_token_ids:
            return (ids, logprobs) if isinstance(out, tuple) else ids
        # A generator that ran past the turn end (a vLLM server given no stop ids) is cut there too:
        # nothing after it reaches the loss.
        cuts = [stop_cut(seq, self._tokenizer, self.stop_sequences, self.stop_token_ids) for seq in ids]
        cut = [list(seq[:k]) for seq, (k, _) in zip(ids, cuts, strict=True)]
        if logprobs is not None:
            logprobs = [list(lp[:k]) for lp, (k, _) in zip(logprobs, cuts, strict=True)]
        # A program that ended at a stop sequence ended: it gets the EOS the stop rule stands for, so
        # trl does not count it as clipped and the policy learns to end there (the EOS is trained like
        # the program's other tokens, on both generation paths). The sampler never drew it, so it has
        # no sampling log-probability: NOT_SAMPLED keeps it out of vLLM's importance-sampling weight,
        # which a 0 would have scaled by p(EOS | program), ~3e-4 for a code model. A stop completed by
        # the last token the limit allowed gets it too, one past the limit: without it trl would count
        # the program clipped and, with mask_truncated_completions, leave it out of the loss.
        eos = self._tokenizer.eos_token_id
        for i, seq in enumerate(cut):
            ended = cuts[i][1] or len(ids[i]) < self.max_completion_length
            if eos is not None and ended and (not seq or (seq[-1] != eos and seq[-1] not in self.stop_token_ids)):
                seq.append(eos)
                if logprobs is not None:
                    logprobs[i].append(NOT_SAMPLED)
        return (cut, logprobs) if isinstance(out, tuple) else cut

    @property
    def _corrects_vllm_sampling(self) -> bool:
        return bool(getattr(self, "use_vllm", False) and getattr(self, "vllm_importance_sampling_correction", False))

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # gathered over processes: whole groups
        return rewards_per_func

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if not self._kept_mass_due:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        # trl's old-log-probability pass, which it then compares with vLLM's log-probabilities. vLLM's
        # are renormalised over what top-k/top-p/min-p kept and the trainer's are not: the log of the
        # kept mass, taken from this same forward, is subtracted from the old log-probabilities trl
        # forms the ratio with (old - mass - vllm = old - (vllm + mass)), and given back to the true
        # old log-probabilities once trl is done (`_untruncate`).
        self._kept_mass_due = False
        with KeptMassProbe(
            _causal_lm(self.accelerator.unwrap_model(model)), self._sampler_filters, logits_to_keep
        ) as probe:
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        mass = probe.mass().to(logps.device, logps.dtype)
        shifted = logps - mass
        self._untruncation = (shifted, logps, mass)
        return shifted, entropies, aux

    def _untruncate(self, output: dict[str, Any]) -> None:
        """The true old log-probabilities back in what trl hands the loss, and vLLM's sampling
        log-probabilities put on the trainer's footing (trl's off-policy mask compares them with the
        trainer's)."""
        untruncation, self._untruncation = self._untruncation, None
        if untruncation is None:
            raise RuntimeError(
                f"{type(self).__name__}: trl computed no old log-probabilities under the vLLM importance-sampling "
                "correction; this trl version no longer does what the top-k/top-p correction hooks into"
            )
        shifted, old, mass = untruncation
        if output.get("old_per_token_logps") is not shifted:
            raise RuntimeError(
                f"{type(self).__name__}: trl's output does not hold the old log-probabilities its first log-probability "
                "pass returned; this trl version computes them elsewhere"
            )
        output["old_per_token_logps"] = old
        output["sampling_per_token_logps"] = output["sampling_per_token_logps"] + mass

    def _generate_and_score_completions(self, inputs):
        self._batch_inputs = inputs  # this process's rows; `_generate` only sees the prompts
        correcting = self._corrects_vllm_sampling and self._sampler_filters.truncates
        self._kept_mass_due, self._untruncation = correcting, None
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._batch_inputs, self._kept_mass_due = None, False
        if correcting:
            self._untruncate(output)
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        zero = zero_variance_rows(self._last_rewards_per_func, self.reward_weights, group)
        self._metrics[mode]["zero_variance/groups"].append(float(zero.sum().item()))
        self._metrics[mode]["zero_variance/share"].append(float(zero.float().mean().item()))
        if self.filter_zero_variance and mode == "train":
            rows = zero.repeat_interleave(group)
            n = output["advantages"].size(0)
            start = self.accelerator.process_index * n
            local = rows[start : start + n].to(output["advantages"].device)
            # A zero advantage takes the row out of the policy-gradient term exactly, whatever the
            # loss; RLOO's KL penalty sits inside its rewards, so this removes that too.
            output["advantages"] = output["advantages"] * (~local).to(output["advantages"].dtype)
            if self.filter_by_mask:
                self._drop_from_token_count(output, local)
            self._metrics[mode]["zero_variance/filtered_share"].append(float(local.float().mean().item()))
        return output

    def _drop_from_token_count(self, output: dict[str, Any], rows: torch.Tensor) -> None:
        """GRPO's token-normalised losses: the filtered rows' tokens leave the mask and the count, so
        the step is as if they had not been sampled. (RLOO keeps its mask: its loss compares summed
        sequence log-probabilities with old ones computed under the full mask, and a zeroed mask
        would turn the ratio into exp(-old), which overflows for long completions.)"""
        mask = output["completion_mask"]
        output["completion_mask"] = mask * (~rows).unsqueeze(1).to(mask.dtype)
        if "num_items_in_batch" in output:
            counted = output["completion_mask"]
            if output.get("tool_mask") is not None:
                counted = counted * output["tool_mask"]
            output["num_items_in_batch"] = self.accelerator.gather(counted.sum()).sum()


def _causal_lm(model: Any) -> Any:
    """The causal LM trl patched its fused LM head onto (under a PEFT wrapper when there is one)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def zero_variance_rows(rewards_per_func: torch.Tensor, weights: torch.Tensor, group: int) -> torch.Tensor:
    """Bool per group (`vprl.rewards.groups.is_zero_variance` of its weighted totals); a row where every
    reward function returned None is masked and does not count."""
    weights = weights.to(rewards_per_func.device)
    totals = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    totals[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return torch.tensor(zero_variance_groups(totals.tolist(), group), dtype=torch.bool)


class ProgramGRPOTrainer(
    TurnAdvantageMixin, LaterTurnsKLMixin, ProgramTrainerMixin, RepairGuideMixin, RepairReplayMixin, GRPOTrainer
):
    filter_by_mask = True
    completions_at = 3  # (prompt_ids, completion_ids, tool_mask, completions, logprobs, ...)


class ProgramRLOOTrainer(RLOOEpisodesMixin, ProgramTrainerMixin, RLOOTrainer):
    filter_by_mask = False
    completions_at = 2  # (prompt_ids, completion_ids, completions)


TRAINERS = {"grpo": ProgramGRPOTrainer, "rloo": ProgramRLOOTrainer}
