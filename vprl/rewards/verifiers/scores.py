"""ExoViP's three sub-verifiers on claims, each contrasted with semantic opposites, and their mix.

For a claim c about a region and its contrast claims n_1..n_k (c with an answer word swapped for
its opposite):

    itm      ITM("a photo of " + c.phrase) - mean_j ITM("a photo of " + n_j.phrase)
    caption  sim(caption, "the image describes " + c.statement) - mean_j sim(caption, ... n_j.statement)
    vqa      (V(c) - mean_j V(n_j)) / 2, V = P(yes) - P(no) of the claim's yes/no question(s)

each times the claim's polarity (a "no" answer denies the claim), and the combined score is the
(weighted) average over the verifiers that apply ([E] Alg. 1: avg of e_s - e_n per verifier).
The VQA calls pass `choices=["yes", "no"]`, so the tool returns P(yes) and P(no) over the two
answers (the VQA model's own scores for a model backend; one-hot from the answer, exact, for the
deterministic oracle and shapes backends). A backend that still answers a bare string is read
one-hot from it (+1 yes, -1 no, 0 anything else).
ExoViP's VQA score is P(yes) - P(no) alone; contrasting it too (a yes/no answer's claim against the
claim with a word swapped) cancels a VQA model's bias towards one answer: a model that always says
"no" contributes 0 instead of rewarding every "no".

All tool calls of a batch of programs are collected first and sent at once, so the tool host can
batch and deduplicate them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vprl.data.boxes import Box
from vprl.executor.tools.calls import MAX_TEXTS, ToolCall
from vprl.executor.tools.errors import ToolError, ToolUnavailable
from vprl.rewards.correctness import yes_no
from vprl.rewards.unit_tests.sampler import Embedder
from vprl.rewards.verifiers.claims import Claim
from vprl.rewards.verifiers.opposites import OppositeSampler
from vprl.rewards.verifiers.tools import ToolCaller

VERIFIERS = ("itm", "caption", "vqa")
YES_NO = ("yes", "no")  # the answer choices of the VQA verifier's calls


@dataclass(frozen=True)
class Check:
    """One claim to verify on one region of one image."""

    image: str  # content hash (registered with the tool host)
    box: Box | None  # API convention; None = the whole image
    claim: Claim


@dataclass
class CheckScore:
    scores: dict[str, float] = field(default_factory=dict)  # per verifier that applied
    infra: str | None = None  # a tool failed for reasons of ours: the check must not be scored

    def combined(self, weights: Mapping[str, float]) -> float | None:
        parts = [(weights.get(k, 1.0), v) for k, v in self.scores.items()]
        total = sum(w for w, _ in parts)
        return sum(w * v for w, v in parts) / total if parts and total > 0 else None


def contrasts(claim: Claim, opposites: OppositeSampler) -> list[Claim]:
    """The claim with each slot word swapped for its opposite (one swap per contrast claim)."""
    out, seen = [], {claim.phrase}
    pairs = [(w, opposites.opposite(w)) for w in claim.slots]
    if claim.alternatives and claim.slots:
        # The question names its options ("yellow or orange"): the other options are the opposites.
        pairs = [(claim.slots[0], alt) for alt in claim.alternatives]
    for word, opposite in pairs:
        if opposite is None or opposite == word:
            continue
        swapped = claim.swap(word, opposite)
        if swapped != claim and swapped.phrase not in seen:
            seen.add(swapped.phrase)
            out.append(swapped)
    return out


class ClaimScorer:
    def __init__(
        self,
        caller: ToolCaller,
        opposites: OppositeSampler,
        embed: Embedder,
        verifiers: Sequence[str] = VERIFIERS,
        itm_template: str = "a photo of {text}",
        caption_template: str = "the image describes {text}",
    ) -> None:
        bad = set(verifiers) - set(VERIFIERS)
        if bad or not verifiers:
            raise ValueError(f"verifiers must be a non-empty subset of {VERIFIERS}, got {list(verifiers)}")
        self.caller, self.opposites, self.embed = caller, opposites, embed
        self.verifiers = tuple(verifiers)
        self.itm_template, self.caption_template = itm_template, caption_template

    def score(self, checks: Sequence[Check]) -> list[CheckScore]:
        plans = [(check, [check.claim, *contrasts(check.claim, self.opposites)]) for check in checks]
        calls: dict[str, ToolCall] = {}

        def want(call: ToolCall) -> str:
            key = json.dumps(call.to_json(), sort_keys=True)
            calls.setdefault(key, call)
            return key

        keyed = []
        for check, claims in plans:
            keys: dict[str, Any] = {}
            if len(claims) > 1 and "itm" in self.verifiers:
                texts = [self.itm_template.format(text=c.phrase) for c in claims][:MAX_TEXTS]
                keys["itm"] = want(ToolCall("itm", check.image, check.box, {"texts": texts}))
            if len(claims) > 1 and "caption" in self.verifiers:
                keys["caption"] = want(ToolCall("caption", check.image, check.box, {}))
            if len(claims) > 1 and "vqa" in self.verifiers and check.claim.questions:
                keys["vqa"] = [
                    [
                        want(ToolCall("vqa", check.image, check.box, {"question": q, "choices": list(YES_NO)}))
                        for q in c.questions
                    ]
                    for c in claims
                ]
            keyed.append(keys)
        order = list(calls)
        answers = dict(zip(order, self.caller.call([calls[k] for k in order])))
        return [self._score(claims, keys, answers) for (_, claims), keys in zip(plans, keyed)]

    def _score(self, claims: list[Claim], keys: dict[str, Any], answers: dict[str, Any]) -> CheckScore:
        out = CheckScore()
        needed = [keys.get("itm"), keys.get("caption"), *(k for row in keys.get("vqa", []) for k in row)]
        for key in needed:
            if key is not None and isinstance(answers[key], ToolUnavailable):
                out.infra = str(answers[key])
                return out
        polarity = claims[0].polarity
        if "itm" in keys:
            value = _itm(answers[keys["itm"]], len(claims))
            if value is not None:
                out.scores["itm"] = polarity * value
        if "caption" in keys:
            value = self._caption(answers[keys["caption"]], claims)
            if value is not None:
                out.scores["caption"] = polarity * value
        if "vqa" in keys:
            values = [_vqa_value(c, [answers[k] for k in row]) for c, row in zip(claims, keys["vqa"])]
            rest = [v for v in values[1:] if v is not None]
            if values and values[0] is not None and rest:
                out.scores["vqa"] = polarity * (values[0] - float(np.mean(rest))) / 2.0
        return out

    def _caption(self, caption: Any, claims: list[Claim]) -> float | None:
        if not isinstance(caption, str) or not caption.strip():
            return None
        texts = [caption] + [self.caption_template.format(text=c.statement) for c in claims]
        vectors = np.asarray(self.embed(texts), dtype=np.float64)
        sims = vectors[1:] @ vectors[0]
        return float(sims[0] - sims[1:].mean())


def _itm(result: Any, n: int) -> float | None:
    if isinstance(result, ToolError) or not isinstance(result, list) or len(result) < 2:
        return None
    scores = [float(s) for s in result[:n] if isinstance(s, (int, float))]
    return scores[0] - float(np.mean(scores[1:])) if len(scores) == len(result[:n]) else None


def _vqa_value(claim: Claim, answers: list[Any]) -> float | None:
    """P(yes) - P(no) of the claim's question(s): min over a conjunction, max over alternatives."""
    values = []
    for answer in answers:
        if isinstance(answer, ToolError):
            return None
        value = yes_minus_no(answer)
        if value is None:
            return None
        values.append(value)
    if not values:
        return None
    return max(values) if claim.any_of else min(values)


def yes_minus_no(answer: Any) -> float | None:
    """P(yes) - P(no) of one `vqa(choices=["yes", "no"])` result; None for a malformed one."""
    if isinstance(answer, dict):
        scores = answer.get("scores")
        if not isinstance(scores, dict):
            return None
        try:
            p_yes, p_no = float(scores.get("yes", 0.0)), float(scores.get("no", 0.0))
        except (TypeError, ValueError):
            return None
        return p_yes - p_no if np.isfinite(p_yes) and np.isfinite(p_no) else None
    folded = yes_no(answer)
    return 1.0 if folded == "yes" else -1.0 if folded == "no" else 0.0
