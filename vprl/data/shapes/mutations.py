"""Plausible wrong variants of shapes-world gold programs: the mistakes a code LLM makes.

Each mutation kind is one textual edit of a gold program (the gold programs come from a few
templates, so the edits are exact): a flipped comparison, `max` for `min`, left for right, the
wrong axis, `[-1]` for `[0]`, the wrong attribute asked, a qualifier dropped from a noun phrase,
the same noun used twice, a missing check for an empty list, `and` for `or`, the answer inverted,
the first option returned instead of matching. Edits keep the gold's formatting, so a mutant
differs from its gold only where the mistake is.

A mutant always parses and differs from its gold as an AST; it is not always *wrong* on every
image (`[-1]` of a one-element list is `[0]`), which is what the per-kind wrong rate in the tests
measures. The bootstrap of the tiny policy trains on gold and mutants together so that the policy
starts imperfect the way real code LLMs are.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def _swap(text: str, a: str, b: str) -> str:
    """Every `a` becomes `b` and every `b` becomes `a`."""
    return re.sub("|".join(re.escape(s) for s in (a, b)), lambda m: b if m.group(0) == a else a, text)


def flip_comparison(src: str) -> str:
    return _swap(src, " < ", " > ")


def swap_extreme(src: str) -> str:
    return re.sub(r"\b(max|min)\(", lambda m: "min(" if m.group(1) == "max" else "max(", src)


def swap_side(src: str) -> str:
    return _swap(_swap(src, '"left"', '"right"'), '"top"', '"bottom"')


def swap_axis(src: str) -> str:
    return _swap(src, "horizontal_center", "vertical_center")


def index_swap(src: str) -> str:
    return _swap(src, "[0]", "[-1]")


ATTRIBUTE_SWAP = {"color": "shape", "shape": "color", "size": "color"}


def wrong_attribute(src: str) -> str:
    """The question a program asks a patch names the wrong attribute ("What shape" for "What color")."""
    return re.sub(
        r'(simple_query\("What) (color|shape|size)\b', lambda m: f"{m.group(1)} {ATTRIBUTE_SWAP[m.group(2)]}", src
    )


def drop_modifier(src: str) -> str:
    """The first qualifier of every multi-word noun phrase given to `find`/`exists` is lost
    ("red circle" -> "circle"), so the phrase picks out more objects than the question meant."""
    return re.sub(r'\b(find|exists)\("(\w+) ([\w ]+)"\)', lambda m: f'{m.group(1)}("{m.group(3)}")', src)


def repeated_noun(src: str) -> str:
    """The second distinct noun phrase is replaced by the first (one object looked up twice)."""
    phrases = list(dict.fromkeys(re.findall(r'\b(?:find|exists)\("([^"]+)"\)', src)))
    if len(phrases) < 2:
        return src
    first, second = phrases[0], phrases[1]
    return re.sub(rf'\b(find|exists)\("{re.escape(second)}"\)', lambda m: f'{m.group(1)}("{first}")', src)


def unchecked_empty(src: str) -> str:
    """Take the first element of a list without checking it is there: `exists(P)` becomes
    `find(P)[0]` (truthy when found, IndexError when not), `any(cond for p in LIST)` becomes `cond`
    on `LIST[0]`."""
    out = re.sub(r'image_patch\.exists\("([^"]+)"\)', r'bool(image_patch.find("\1")[0])', src)
    lines = out.split("\n")
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)return bool_to_yesno\(any\((.+?) for p in (\S+?)(?: for anchor in (\S+?))?\)\)$", line)
        if m:
            indent, cond, plist, alist = m.groups()
            head = [f"{indent}p = {plist}[0]"] + ([f"{indent}anchor = {alist}[0]"] if alist else [])
            lines[i : i + 1] = [*head, f"{indent}return bool_to_yesno({cond})"]
            break
    return "\n".join(lines)


def swap_logic(src: str) -> str:
    return re.sub(r"\) (and|or) image_patch", lambda m: f") {'or' if m.group(1) == 'and' else 'and'} image_patch", src)


def invert_answer(src: str) -> str:
    """yes/no inverted: `==` -> `!=`, else `bool_to_yesno(X)` -> `bool_to_yesno(not X)`."""
    if "bool_to_yesno(" not in src:
        return src
    if " == " in src:
        return src.replace(" == ", " != ")

    def negate(m: re.Match) -> str:
        expr = m.group(2)
        return f"{m.group(1)}bool_to_yesno(not {f'({expr})' if ' ' in expr else expr})"

    return re.sub(r"^(\s*return )bool_to_yesno\((.+)\)$", negate, src, count=1, flags=re.M)


def first_option(src: str) -> str:
    """Return the first of the options instead of matching the patch against them."""
    return re.sub(r'\w+\.best_text_match\(\["([^"]+)", "[^"]+"\]\)', r'"\1"', src)


EDITS: dict[str, Callable[[str], str]] = {
    "flip_comparison": flip_comparison,
    "swap_extreme": swap_extreme,
    "swap_side": swap_side,
    "swap_axis": swap_axis,
    "index_swap": index_swap,
    "wrong_attribute": wrong_attribute,
    "drop_modifier": drop_modifier,
    "repeated_noun": repeated_noun,
    "unchecked_empty": unchecked_empty,
    "swap_logic": swap_logic,
    "invert_answer": invert_answer,
    "first_option": first_option,
}
MUTATION_KINDS: tuple[str, ...] = tuple(EDITS)


@dataclass(frozen=True)
class Mutation:
    kind: str
    program: str

    def __post_init__(self) -> None:
        if self.kind not in MUTATION_KINDS:
            raise ValueError(f"Mutation.kind: {self.kind!r} is not one of {MUTATION_KINDS}")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "program": self.program}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Mutation:
        return cls(kind=row["kind"], program=row["program"])


def _tree(src: str) -> str | None:
    try:
        return ast.dump(ast.parse(src))
    except SyntaxError:
        return None


def mutate(program: str, kinds: tuple[str, ...] = MUTATION_KINDS) -> list[Mutation]:
    """Every applicable mutation of `program`, in `MUTATION_KINDS` order; each parses and differs
    from the program (and from the other mutants) as an AST."""
    gold = _tree(program)
    if gold is None:
        raise ValueError(f"cannot mutate a program that does not parse:\n{program}")
    seen = {gold}
    out = []
    for kind in kinds:
        if kind not in EDITS:
            raise ValueError(f"unknown mutation kind {kind!r}; valid: {MUTATION_KINDS}")
        text = EDITS[kind](program)
        tree = _tree(text)
        if tree is not None and tree not in seen:
            seen.add(tree)
            out.append(Mutation(kind, text))
    return out


@dataclass(frozen=True)
class MutationPair:
    """A question of a generated world, its gold program and one mutant of it."""

    task: str
    query: str
    gold: str
    mutation: Mutation

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "query": self.query, "gold": self.gold, "mutation": self.mutation.to_json()}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> MutationPair:
        return cls(row["task"], row["query"], row["gold"], Mutation.from_json(row["mutation"]))


def mutation_pairs(
    root: str | Path, seed: int = 0, n: int | None = None, tasks: tuple[str, ...] = ("vqa", "itm", "grounding")
) -> list[MutationPair]:
    """(query, gold, mutant) triples of a generated world's gold programs, shuffled with `seed`;
    the first `n` (all when None)."""
    from vprl.data.shapes import load_gold_programs

    gold = load_gold_programs(root)
    pairs = [
        MutationPair(task, query, program, m)
        for task in tasks
        for query, program in sorted(gold.get(task, {}).items())
        for m in mutate(program)
    ]
    order = np.random.default_rng(seed).permutation(len(pairs))
    pairs = [pairs[int(i)] for i in order]
    return pairs if n is None else pairs[:n]
