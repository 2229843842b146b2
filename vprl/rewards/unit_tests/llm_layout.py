"""The layout step of LM-grounded diffusion ([U] D.4.1; docs/references.md#test-images): a description becomes
boxes, by an LLM.

The model sees a few-shot prompt (`prompts/layout.txt`): a 512x512 canvas with its origin at the
top-left, one `('phrase', [x, y, width, height])` box per object, a background prompt and a
negative prompt. ViUniT samples 5 replies (temperature 1.0, top-p 0.9, 320 new tokens) because
replies often carry no usable box; the first reply with at least one box is the layout. Boxes are
clipped to the canvas; a box left with no area is dropped and counted in `warnings`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from vprl.rewards.unit_tests.llm_backends import SampledBackendSettings, TextBackend, build_text_backend

PROMPT = Path(__file__).parent / "prompts" / "layout.txt"
CAPTION_SLOT = "<CAPTION>"
DEFAULT_BACKGROUND = "A realistic scene"
_NUM = r"(-?\d+(?:\.\d+)?)"
_BOX = re.compile(rf"\(\s*(['\"])(?P<phrase>.+?)\1\s*,\s*\[\s*{_NUM}\s*,\s*{_NUM}\s*,\s*{_NUM}\s*,\s*{_NUM}\s*\]\s*\)")
_BACKGROUND = re.compile(r"Background\s+prompt\s*:\s*(.*)", re.I)
_NEGATIVE = re.compile(r"Negative\s+prompt\s*:\s*(.*)", re.I)
_NEXT_BLOCK = re.compile(r"\n\s*Caption\s*:", re.I)


@dataclass(frozen=True)
class LayoutBox:
    phrase: str
    box: tuple[int, int, int, int]  # x, y, width, height on the canvas, top-left origin (LMD's convention)


@dataclass(frozen=True)
class Layout:
    boxes: tuple[LayoutBox, ...]
    background: str = DEFAULT_BACKGROUND
    negative: str | None = None  # what the description excludes ("without birds" -> "birds")
    canvas: int = 512

    @property
    def phrases(self) -> list[str]:
        return [b.phrase for b in self.boxes]

    def gligen_boxes(self) -> list[list[float]]:
        """Boxes as GLIGEN wants them: [x0, y0, x1, y1] as fractions of the canvas."""
        c = float(self.canvas)
        return [[x / c, y / c, (x + w) / c, (y + h) / c] for x, y, w, h in (b.box for b in self.boxes)]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "boxes": [{"phrase": b.phrase, "box": list(b.box)} for b in self.boxes]}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Layout:
        boxes = tuple(LayoutBox(str(b["phrase"]), tuple(int(v) for v in b["box"])) for b in row["boxes"])
        return cls(
            boxes, str(row.get("background", DEFAULT_BACKGROUND)), row.get("negative"), int(row.get("canvas", 512))
        )


def _optional(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip().strip("\"'").strip()
    return None if not text or text.lower() in ("none", "null", "n/a", "nothing") else text


def parse_layout(reply: str, canvas: int = 512, warnings: Counter | None = None) -> Layout | None:
    """The layout in one reply, or None (counted as `no_boxes`) when it holds no usable box."""
    warnings = warnings if warnings is not None else Counter()
    match = _NEXT_BLOCK.search(reply)
    reply = reply[: match.start()] if match else reply
    boxes = []
    for m in _BOX.finditer(reply):
        phrase = " ".join(m.group("phrase").split())
        x, y, w, h = (float(m.group(i)) for i in range(3, 7))
        x0, y0 = max(0.0, x), max(0.0, y)
        x1, y1 = min(float(canvas), x + w), min(float(canvas), y + h)
        if not phrase or x1 - x0 < 1 or y1 - y0 < 1:
            warnings["box_dropped"] += 1
            continue
        boxes.append(LayoutBox(phrase, (round(x0), round(y0), round(x1 - x0), round(y1 - y0))))
    if not boxes:
        warnings["no_boxes"] += 1
        return None
    background = _BACKGROUND.search(reply)
    negative = _NEGATIVE.search(reply)
    return Layout(
        boxes=tuple(boxes),
        background=_optional(background.group(1) if background else None) or DEFAULT_BACKGROUND,
        negative=_optional(negative.group(1) if negative else None),
        canvas=canvas,
    )


@dataclass(frozen=True)
class LayoutPlannerConfig(SampledBackendSettings):
    STOP: ClassVar[tuple[str, ...]] = ("\nCaption:",)

    num_candidates: int = 5
    temperature: float = 1.0
    max_new_tokens: int = 320
    canvas: int = 512
    template: str | None = None  # a prompt file with a <CAPTION> slot (default: prompts/layout.txt)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.canvas < 8:
            raise ValueError(f"canvas must be >= 8 pixels, got {self.canvas}")


class LlmLayoutPlanner:
    """`plan(descriptions)` -> one `Layout` (or None when no reply had a box) per description."""

    def __init__(self, config: LayoutPlannerConfig, backend: TextBackend | None = None, engine: Any = None) -> None:
        self.config = config
        path = Path(config.template) if config.template else PROMPT
        if not path.is_file():
            raise FileNotFoundError(f"template: no prompt file at {path}")
        self.template = path.read_text()
        if CAPTION_SLOT not in self.template:
            raise ValueError(f"layout prompt {path} lacks the {CAPTION_SLOT} slot")
        self.backend = backend if backend is not None else build_text_backend(config, engine=engine)
        self.warnings: Counter = Counter()
        key = {k: v for k, v in asdict(config).items() if k not in ("device", "batch_size", "gpu_memory_utilization")}
        key["template"] = hashlib.sha1(self.template.encode()).hexdigest()[:12]
        self.config_key = "llm_layout:" + json.dumps(key, sort_keys=True)

    def prompt(self, description: str) -> str:
        return self.template.replace(CAPTION_SLOT, " ".join(description.split()))

    def plan(self, descriptions: Sequence[str]) -> list[Layout | None]:
        if not descriptions:
            return []
        replies = self.backend.generate([self.prompt(d) for d in descriptions], self.config.sampling)
        return [self.layout_from_replies(r) for r in replies]

    def layout_from_replies(self, replies: Sequence[str]) -> Layout | None:
        for reply in replies:
            layout = parse_layout(reply, self.config.canvas, self.warnings)
            if layout is not None:
                return layout
        self.warnings["no_layout"] += 1
        return None
