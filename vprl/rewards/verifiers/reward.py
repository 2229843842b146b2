"""The `verifier` reward: ExoViP's verification score of a program's answer, label-free.

    reward = score(final answer)                                        intermediate_weight = 0
    reward = (1 - w) * score(final) + w * mean(score(intermediate))     otherwise

The final answer becomes a claim about the image (`claims.py`): a text answer through the question,
a box (grounding) as "the region shows <expression>". Intermediate results come from the program's
tool-call trace (`ExecutionResult.tool_calls`): a `verify` call's verdict, a `vqa` call's answer on
its region, a `detect` call's boxes; each is verified the same way on its region (ExoViP verifies
every module's output). Values lie in [-1, 1] for VQA and are differences of similarities for ITM
and captions (uncalibrated across backends, as ExoViP notes; weight them per verifier).

`None` (nothing to say) when no verifier applies to the answer (a list, no answer, a question no
template covers with no opposite to contrast) and when a tool failed for reasons of ours
(`ToolUnavailable`): infra failures are masked, never scored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from vprl.data.boxes import box_from_top_left
from vprl.data.records import Example
from vprl.executor.results import ExecutionResult, ToolCallRecord
from vprl.rewards.answer_normalization import answer_to_text
from vprl.rewards.correctness import parse_box
from vprl.rewards.protocol import RewardFn
from vprl.rewards.verifiers.claims import build_claim, text_claim
from vprl.rewards.verifiers.embedders import build_embedder
from vprl.rewards.verifiers.opposites import OppositeConfig, OppositeSampler
from vprl.rewards.verifiers.scores import VERIFIERS, Check, CheckScore, ClaimScorer
from vprl.rewards.verifiers.tools import ToolCaller

TRACE_TOOLS = ("verify", "vqa", "detect")


@dataclass(frozen=True)
class VerifierConfig:
    verifiers: tuple[str, ...] = VERIFIERS
    weights: dict[str, float] = field(default_factory=dict)  # per verifier in the average (default 1)
    itm_template: str = "a photo of {text}"  # ExoViP's ITM template
    caption_template: str = "the image describes {text}"  # ExoViP: "the image describe" + sentence
    embedder: str = "hashing"  # caption similarity (ExoViP: Sentence-BERT); see embedders.py
    opposite_embedder: str = "hashing"  # choosing opposites (ExoViP: CLIP text embeddings)
    opposites: OppositeConfig = field(default_factory=OppositeConfig)
    intermediate_weight: float = 0.0  # share of the reward from verified tool-call results
    max_intermediate: int = 8  # trace records verified per program (the first ones)

    def __post_init__(self) -> None:
        bad = set(self.verifiers) - set(VERIFIERS)
        if bad or not self.verifiers:
            raise ValueError(
                f"verifier.verifiers must be a non-empty subset of {list(VERIFIERS)}, got {self.verifiers}"
            )
        if set(self.weights) - set(VERIFIERS):
            raise ValueError(f"verifier.weights: unknown verifier(s) {sorted(set(self.weights) - set(VERIFIERS))}")
        if not 0.0 <= self.intermediate_weight <= 1.0:
            raise ValueError(f"verifier.intermediate_weight must be in [0, 1], got {self.intermediate_weight}")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> VerifierConfig:
        """Build from YAML settings; unknown keys fail with the valid ones."""
        names = {f.name for f in fields(cls)}
        unknown = set(settings) - names
        if unknown:
            raise ValueError(f"verifier reward: unknown setting(s) {sorted(unknown)}; valid: {sorted(names)}")
        values = dict(settings)
        if "verifiers" in values:
            values["verifiers"] = tuple(values["verifiers"])
        if isinstance(values.get("opposites"), Mapping):
            values["opposites"] = OppositeConfig(**values["opposites"])
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["verifiers"] = list(self.verifiers)
        out["opposites"] = {f.name: getattr(self.opposites, f.name) for f in fields(self.opposites)}
        return out


class VerifierReward:
    """Callable reward: `(examples, results, programs) -> list[float | None]`."""

    def __init__(self, caller: ToolCaller, config: VerifierConfig | None = None) -> None:
        self.config = config or VerifierConfig()
        self.caller = caller
        self.opposites = OppositeSampler(
            embedder=build_embedder(self.config.opposite_embedder), config=self.config.opposites
        )
        same = self.config.embedder == self.config.opposite_embedder
        embed = self.opposites.embed if same else build_embedder(self.config.embedder)
        self.scorer = ClaimScorer(
            caller,
            self.opposites,
            embed,
            self.config.verifiers,
            self.config.itm_template,
            self.config.caption_template,
        )
        self.counts = {"scored": 0, "no_claim": 0, "masked": 0}

    def __call__(
        self, examples: Sequence[Example], results: Sequence[ExecutionResult], programs: Sequence[str]
    ) -> list[float | None]:
        if not (len(examples) == len(results) == len(programs)):
            raise ValueError(f"got {len(examples)} examples, {len(results)} results, {len(programs)} programs")
        checks: list[Check] = []
        owners: list[tuple[int, bool]] = []  # (item, is_final) per check
        for i, (example, result) in enumerate(zip(examples, results)):
            if result.status != "ok":
                continue
            ref = self.caller.image(example).ref
            final = self.final_check(example, result.answer, ref)
            if final is not None:
                checks.append(final)
                owners.append((i, True))
            if self.config.intermediate_weight > 0:
                for check in self.trace_checks(result.tool_calls, ref):
                    checks.append(check)
                    owners.append((i, False))
        scored = self.scorer.score(checks) if checks else []
        finals: dict[int, CheckScore] = {}
        inters: dict[int, list[CheckScore]] = {}
        for (i, is_final), score in zip(owners, scored):
            if is_final:
                finals[i] = score
            else:
                inters.setdefault(i, []).append(score)
        return [self._combine(finals.get(i), inters.get(i, [])) for i in range(len(results))]

    def _combine(self, final: CheckScore | None, inters: list[CheckScore]) -> float | None:
        if (final is not None and final.infra) or any(s.infra for s in inters):
            self.counts["masked"] += 1
            return None
        weights = self.config.weights
        value = final.combined(weights) if final is not None else None
        inter_values = [v for v in (s.combined(weights) for s in inters) if v is not None]
        w = self.config.intermediate_weight
        if value is None and not inter_values:
            self.counts["no_claim"] += 1
            return None
        self.counts["scored"] += 1
        if not inter_values or w == 0:
            return value
        inter = sum(inter_values) / len(inter_values)
        return inter if value is None else (1 - w) * value + w * inter

    # -- claims ----------------------------------------------------------------------------------
    def final_check(self, example: Example, answer: Any, ref: str) -> Check | None:
        known = frozenset(self.opposites.vocabulary)
        box = parse_box(answer)
        if box is not None:
            region = _int_box(box)
            return Check(ref, region, text_claim(example.query, known)) if region else None
        text = answer_to_text(answer)
        if text is None or not text.strip():
            return None
        return Check(ref, None, build_claim(example.query, text, known))

    def trace_checks(self, records: Sequence[ToolCallRecord], ref: str) -> list[Check]:
        known = frozenset(self.opposites.vocabulary)
        height = self.caller.host.images.get(ref).height
        out: list[Check] = []
        for record in records:
            if len(out) >= self.config.max_intermediate:
                break
            if record.tool not in TRACE_TOOLS or record.result.startswith("ToolError"):
                continue
            try:
                result = json.loads(record.result)
            except json.JSONDecodeError:
                continue  # the trace keeps a truncated rendering of long results
            box = tuple(record.box) if record.box else None
            out.extend(_record_checks(record, result, ref, box, height, known))
        return out[: self.config.max_intermediate]


def _record_checks(
    record: ToolCallRecord, result: Any, ref: str, box: Any, height: int, known: frozenset[str]
) -> list[Check]:
    args = record.args
    if record.tool == "verify" and isinstance(result, bool):
        phrase = f"{args.get('property', '')} {args.get('object_name', '')}".strip()
        return [Check(ref, box, text_claim(phrase, known, 1 if result else -1))] if phrase else []
    if record.tool == "vqa" and isinstance(args.get("question"), str):
        # A `vqa(choices=...)` result is {"answer", "scores"}: the claim is about the answer.
        text = answer_to_text(result.get("answer") if isinstance(result, dict) else result)
        return [Check(ref, box, build_claim(args["question"], text, known))] if text else []
    if record.tool == "detect" and isinstance(result, list) and isinstance(args.get("noun"), str):
        claims: list[Check] = []
        for det in result:
            if isinstance(det, dict) and isinstance(det.get("box"), list) and len(det["box"]) == 4:
                region = _int_box(box_from_top_left(*det["box"], height=height))
                if region:
                    claims.append(Check(ref, region, text_claim(args["noun"], known)))
        return claims
    return []


def _int_box(box: Any) -> tuple[int, int, int, int] | None:
    left, lower, right, upper = (int(round(v)) for v in box)
    return (left, lower, right, upper) if right > left and upper > lower else None


def verifier_reward(runner: Any = None, tool_host: Any = None, **settings: Any) -> RewardFn:
    """ExoViP verification of the final answer (and optionally of the trace) through the tool host.

    Live resources: `runner` (executor SyncRunner, preferred: its loop serves the host) or
    `tool_host`. Settings: see `VerifierConfig`.
    """
    config = VerifierConfig.from_settings(settings)
    return VerifierReward(ToolCaller.from_resources(runner=runner, tool_host=tool_host), config)
