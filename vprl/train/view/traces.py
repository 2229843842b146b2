"""A rollout's tool-call trace as marks on its image: which call, its label, its boxes, its program line.

The trace (`vprl.executor.results.ToolCallRecord` rows) gives each call's tool, arguments, the region it
looked at (`box`, API convention: origin bottom-left) and a short JSON result; `detect` results are
boxes in top-left pixels of the whole image. Everything here is converted to top-left pixels of the
original image, the convention of a picture on screen.

A trace row may carry the program line of its call (`line`); where it does not, the line is
inferred from the program's source: the one call site whose method and literal arguments match the
call. An inferred line is marked as such, and an ambiguous one (two sites could have made the call)
is left out rather than guessed.
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass
from typing import Any

from vprl.data.boxes import box_to_top_left

# The API functions whose call ends in each tool (vprl/executor/api/): the call sites a line can be.
CALL_SITES: dict[str, frozenset[str]] = {
    "detect": frozenset({"find", "exists"}),
    "verify": frozenset({"verify_property"}),
    "vqa": frozenset({"simple_query"}),
    "itm": frozenset({"best_text_match", "best_image_match"}),
    "depth": frozenset({"compute_depth", "sort_patches_front_to_back"}),
    "llm": frozenset({"llm_query", "select_answer", "process_guesses"}),
    "caption": frozenset(),
}
# Which positional argument of a call site holds which trace argument (matched when literal).
SITE_ARGS: dict[str, tuple[str, ...]] = {
    "find": ("noun",),
    "exists": ("noun",),
    "verify_property": ("object_name", "property"),
    "simple_query": ("question",),
}
SITE_KEYWORDS = {"object_name": "noun", "visual_property": "property", "question": "question"}
DEFAULT_QUESTION = "What is this?"  # simple_query() without a question asks this


@dataclass(frozen=True)
class CallMark:
    """One tool call as the page draws it. Boxes are top-left `[x0, y0, x1, y1]` image pixels."""

    index: int  # 1-based, in call order
    tool: str
    label: str  # `find("cup")`, `simple_query("What color?")`
    result: str  # the tool's answer as the trace keeps it
    region: list[float] | None  # the patch the call looked at; None when it is the whole image
    boxes: list[list[Any]]  # detect: [x0, y0, x1, y1, score, label] per box the trace kept
    cut: bool  # the trace's result was cut short: the rest of the answer (boxes past the cut) is not known
    line: int | None
    inferred: bool  # the line was matched from the source, not recorded by the executor

    def to_json(self) -> dict[str, Any]:
        return {
            "i": self.index,
            "tool": self.tool,
            "label": self.label,
            "res": self.result,
            "region": self.region,
            "boxes": self.boxes,
            "cut": self.cut,
            "line": self.line,
            "inf": self.inferred,
        }


def call_label(tool: str, args: dict[str, Any]) -> str:
    """How the program spelled the call, as near as the trace tells."""

    def q(value: Any, limit: int = 60) -> str:
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= limit else text[: limit - 4] + '..."'

    if tool == "detect":
        return f"find({q(args.get('noun'))})"
    if tool == "verify":
        return f"verify_property({q(args.get('object_name'))}, {q(args.get('property'))})"
    if tool == "vqa":
        choices = args.get("choices")
        return f"simple_query({q(args.get('question'))}" + (f", choices={q(choices)})" if choices else ")")
    if tool == "itm":
        return f"best_text_match({q(args.get('texts'))})"
    if tool == "depth":
        return "compute_depth()"
    if tool == "llm":
        return f"llm_query({q(args.get('prompt'))})"
    return f"{tool}()"


def detections(result: str) -> tuple[list[list[Any]], bool]:
    """The boxes of a `detect` result as the trace keeps it, and whether it was cut. The trace cuts
    long results mid-JSON; every whole box before the cut is kept."""
    text = result.strip()
    if not text.startswith("["):
        return [], False
    decoder = json.JSONDecoder()
    found: list[list[Any]] = []
    pos, cut = 1, True
    while pos < len(text):
        while pos < len(text) and text[pos] in " ,\n":
            pos += 1
        if text.startswith("]", pos):
            cut = False
            break
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        box = item.get("box") if isinstance(item, dict) else None
        if is_box(box):
            score = item.get("score")
            found.append([*box, score if isinstance(score, int | float) else None, str(item.get("label") or "")])
    return found, cut


def cut_short(result: str) -> bool:
    """Whether the trace cut this result short. `vprl.executor.results.short_result` ends a result it cut
    with "..." in the middle of its JSON, so what is left does not parse; a whole result never ends
    so (a string's own dots come before its closing quote), nor does a tool failure ("ToolError: ...",
    cut without the dots)."""
    if not result.endswith("...") or result.startswith("ToolError"):
        return False
    try:
        json.loads(result)
    except json.JSONDecodeError:
        return True
    return False


class SiteIndex:
    """The program's call sites of API functions, by name, with their literal arguments."""

    def __init__(self, program: str):
        self.sites: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        try:
            tree = ast.parse(program)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name is None:
                continue
            self.sites.setdefault(name, []).append((node.lineno, _literal_args(name, node)))

    def line_of(self, tool: str, args: dict[str, Any]) -> int | None:
        """The line of the only call site that can have made this call; None when none or several can."""
        lines = {
            line
            for name in CALL_SITES.get(tool, ())
            for line, literal in self.sites.get(name, ())
            if all(args.get(key) == value for key, value in literal.items())
        }
        return lines.pop() if len(lines) == 1 else None


def _literal_args(name: str, node: ast.Call) -> dict[str, Any]:
    """Trace arguments a call site fixes with literals (a variable argument fixes nothing)."""
    fixed: dict[str, Any] = {}
    for key, arg in zip(SITE_ARGS.get(name, ()), node.args):
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            fixed[key] = arg.value
    for kw in node.keywords:
        key = SITE_KEYWORDS.get(kw.arg or "")
        if key and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
            fixed[key] = kw.value.value
    if name == "simple_query" and not node.args and not node.keywords:
        fixed["question"] = DEFAULT_QUESTION
    return fixed


def call_marks(program: str, calls: list[dict[str, Any]], size: tuple[int, int] | None) -> list[CallMark]:
    """Marks for every call of a trace. `size` is the image's (width, height); without it (no
    picture) the regions are not converted and not drawn."""
    sites = SiteIndex(program) if calls else None
    marks = []
    for i, call in enumerate(calls, 1):
        tool = str(call.get("tool", ""))
        args = call.get("args") if isinstance(call.get("args"), dict) else {}
        result = str(call.get("result", ""))
        recorded = call.get("line")
        line = recorded if isinstance(recorded, int) else sites.line_of(tool, args)
        boxes, cut = detections(result) if tool == "detect" else ([], cut_short(result))
        marks.append(
            CallMark(
                index=i,
                tool=tool,
                label=call_label(tool, args),
                result=result,
                region=_region(call.get("box"), size),
                boxes=boxes,
                cut=cut,
                line=line,
                inferred=line is not None and not isinstance(recorded, int),
            )
        )
    return marks


def is_box(box: Any) -> bool:
    """Four finite numbers: what a trace or an answer may draw (a row could hold anything there)."""
    return (
        isinstance(box, list)
        and len(box) == 4
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in box)
    )


def _region(box: Any, size: tuple[int, int] | None) -> list[float] | None:
    if size is None or not is_box(box):
        return None
    width, height = size
    if list(box) == [0, 0, width, height]:
        return None  # the whole image: drawing its border says nothing
    return [float(v) for v in box_to_top_left(tuple(box), height)]


def answer_box(answer: Any) -> list[float] | None:
    """A grounding answer's box (`{"box": [left, lower, right, upper]}`, API convention), if it is one."""
    box = answer.get("box") if isinstance(answer, dict) else None
    if is_box(box):
        return [float(v) for v in box]
    return None


def to_top_left(box: list[float] | tuple[float, ...] | None, height: int) -> list[float] | None:
    return None if box is None else [float(v) for v in box_to_top_left(tuple(box), height)]
