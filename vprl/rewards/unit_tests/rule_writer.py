"""A rule-based test writer for the shapes world ("shapes_rules"): what an LLM test writer does,
done by rules so the unit-test reward means something on a CPU without a capable LLM.

It reads the query text alone (never the question's image, its labels or its scene graph) and
recognises the shapes world's question templates (`vprl/data/shapes/questions.py`) and image-text
captions (`Verify image matches text="..."`). For each it imagines small scenes in words, the way
ViUniT's few-shot prompts ask an LLM to: scenes where each possible answer is right, with
distractors and near-misses (the queried kind in the wrong colour, on the other side, one too
many), and writes them as `UnitTest(description, expected answer)`. Descriptions use the grammar
the layout generator reads (`vprl/rewards/unit_tests/description_grammar.py`). Candidates vary in
answers and in wording, so the sampler (Algorithm 1) has answers to cover and inputs to spread.

This module is the query side: the template table and the writer class. The scenes each family
imagines are `vprl/rewards/unit_tests/family_scenes.py`.

A query no template matches gets no tests and a counted warning (`unrecognised_query`).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vprl.rewards.unit_tests.family_scenes import PHRASE_PATTERN as _PHRASE
from vprl.rewards.unit_tests.family_scenes import RELATION_PATTERN as _REL
from vprl.rewards.unit_tests.family_scenes import (
    Writer,
    choose,
    compare_count,
    count,
    exist,
    itm,
    logic,
    position,
    query_attr,
    relate_exist,
    relate_query,
    same,
    superlative_position,
    superlative_size,
    verify_color,
)
from vprl.rewards.unit_tests.parsing import UnitTest
from vprl.rewards.unit_tests.protocols import register_writer
from vprl.rewards.unit_tests.scene_text import COLOR_PATTERN as _C
from vprl.rewards.unit_tests.scene_text import SHAPE_PATTERN as _S
from vprl.rewards.unit_tests.scene_text import SIZE_PATTERN as _Z
from vprl.rewards.unit_tests.scene_text import ImpossibleScene, describe

_REF = rf"(?:(?:{_Z}) )?(?:(?:{_C}) )?(?:{_S}|object)"
_PLURAL = rf"(?:(?:{_C}) )?(?:{_S}|object)s"
_ITM = re.compile(r'^verify image matches text\s*=\s*"(?P<caption>.+)"$', re.I)


@dataclass(frozen=True)
class Template:
    family: str
    pattern: re.Pattern
    write: Writer


def _t(family: str, pattern: str, write: Writer) -> Template:
    return Template(family, re.compile(f"^{pattern}$"), write)


TEMPLATES: tuple[Template, ...] = (
    _t("exist", rf"is there an? (?P<color>{_C}) (?P<shape>{_S})", exist),
    _t("count", rf"how many (?P<noun>{_PLURAL}) are there", count),
    _t("query_color", rf"what color is the (?P<ref>{_REF})", query_attr("color")),
    _t("query_shape", rf"what shape is the (?P<ref>{_REF})", query_attr("shape")),
    _t("query_size", rf"what size is the (?P<ref>{_REF})", query_attr("size")),
    _t("relate_query", rf"what color is the (?P<shape>{_S}) (?P<rel>{_REL}) the (?P<ref>{_REF})", relate_query),
    _t("relate_exist", rf"is there an? (?P<color>{_C}) object (?P<rel>{_REL}) the (?P<ref>{_REF})", relate_exist),
    _t("same_color", rf"do the (?P<r1>{_REF}) and the (?P<r2>{_REF}) have the same color", same("color")),
    _t("same_shape", rf"are the (?P<r1>{_REF}) and the (?P<r2>{_REF}) the same shape", same("shape")),
    _t("choose_color", rf"is the (?P<ref>{_REF}) (?P<a>{_C}) or (?P<b>{_C})", choose("color")),
    _t("choose_shape", rf"is the (?P<ref>{_REF}) an? (?P<a>{_S}) or an? (?P<b>{_S})", choose("shape")),
    _t("verify_color", rf"is the (?P<ref>{_REF}) (?P<color>{_C})", verify_color),
    _t("logic_and", rf"is there both an? (?P<p1>{_PHRASE}) and an? (?P<p2>{_PHRASE})", logic("and")),
    _t("logic_or", rf"is there either an? (?P<p1>{_PHRASE}) or an? (?P<p2>{_PHRASE})", logic("or")),
    _t("position_vertical", rf"is the (?P<ref>{_REF}) in the top or bottom half of the image", position("y")),
    _t("position_horizontal", rf"is the (?P<ref>{_REF}) on the left or right side of the image", position("x")),
    _t("superlative_size", rf"what color is the (?P<word>largest|smallest) (?P<noun>{_S}|object)", superlative_size),
    _t(
        "superlative_position",
        rf"what shape is the (?P<word>leftmost|rightmost|topmost|bottommost) (?:(?P<color>{_C}) )?object",
        superlative_position,
    ),
    _t("compare_count", rf"are there more (?P<p1>{_PLURAL}) than (?P<p2>{_PLURAL})", compare_count),
)


def match_template(query: str) -> tuple[str, Writer, dict[str, str]] | None:
    """The family a query belongs to, its writer and its slots; None when no template matches."""
    m = _ITM.match(query.strip())
    if m is not None:
        return "itm", itm, {"caption": m.group("caption")}
    text = " ".join(query.lower().strip().rstrip("?").split())
    for t in TEMPLATES:
        m = t.pattern.match(text)
        if m is not None:
            return t.family, t.write, {k: v for k, v in m.groupdict().items() if v is not None}
    return None


@register_writer("shapes_rules")
class ShapesRuleWriter:
    """Rule-based (not an LLM) test writer for the shapes world's query templates."""

    VERSION = 1  # bump when the rules change what tests a query gets
    sees_program = False  # query-only, like ViUniT's query-only prompt

    def __init__(self, num_candidates: int = 10, seed: int = 0):
        if num_candidates < 1:
            raise ValueError(f"num_candidates must be >= 1, got {num_candidates}")
        self.num_candidates, self.seed = int(num_candidates), int(seed)
        self.config_key = f"shapes_rules/v{self.VERSION}/n{self.num_candidates}/s{self.seed}"
        self.warnings: Counter = Counter()

    def write(self, queries: Sequence[str], programs: Sequence[str] | None = None) -> list[list[UnitTest]]:
        return [self.write_one(q) for q in queries]

    def write_one(self, query: str) -> list[UnitTest]:
        found = match_template(query)
        if found is None:
            self.warnings["unrecognised_query"] += 1
            return []
        _family, write, slots = found
        digest = hashlib.sha256(f"{self.seed}\x00{query}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        try:
            scenes = write(rng, slots, self.num_candidates)
        except ImpossibleScene:
            self.warnings["impossible_query"] += 1  # e.g. "the circle left of the circle"
            return []
        tests, seen = [], set()
        for scene, answer in scenes:
            test = UnitTest(describe(rng, scene), answer)
            if (test.caption.lower(), test.answer) not in seen:
                seen.add((test.caption.lower(), test.answer))
                tests.append(test)
        if not tests:
            self.warnings["unrecognised_query"] += 1
        return tests


__all__ = ["TEMPLATES", "ShapesRuleWriter", "match_template"]
