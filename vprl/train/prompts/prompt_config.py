"""`PromptConfig`: which API variant, examples and layout a prompt uses (JSON/YAML round-trip)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from vprl.data.records import TASKS
from vprl.executor.api.spec import VARIANTS, get_variant

LAYOUTS = ("stanic", "viunit", "bare")

# The entry point's parameters and return annotation per task ([S]/[V] listings).
SIGNATURES: dict[str, tuple[str, str]] = {
    "vqa": ("image", "str"),
    "itm": ("image", "str"),
    "grounding": ("image", "ImagePatch"),
    "video_qa": ("video, question, possible_answers", "str"),
}


@dataclass(frozen=True)
class PromptConfig:
    """How to build a prompt.

    variant: API variant from `vprl.executor.api.spec` (vipergpt, abstract, viunit, vipergpt_video,
        abstract_video).
    task: vqa | itm | grounding | video_qa; chooses the entry point's signature and task guidelines.
    ice_file: JSONL file of `{query, program}` in-context examples (hand-written or mined ACEs);
        None for zero-shot.
    max_ices: keep only the first `max_ices` examples of the file (None keeps all).
    include_guidelines: add the "guidelines" bullets of the variant and task.
    layout: "stanic" (Stanić et al.'s slot order), "viunit" (`# Query:` / `Program:` blocks) or
        "bare" (only `# <query>` and the signature: no listing, examples or guidelines, for tiny
        policies with a short context that learned the API in training).
    return_annotation: override the task's return annotation (e.g. "ImagePatch").
    """

    variant: str = field(default="vipergpt", metadata={"help": f"API variant: {' | '.join(VARIANTS)}"})
    task: str = field(default="vqa", metadata={"help": f"entry point and guidelines: {' | '.join(TASKS)}"})
    ice_file: str | None = field(
        default=None, metadata={"help": "JSONL of {query, program} in-context examples (none: zero-shot)"}
    )
    max_ices: int | None = field(default=None, metadata={"help": "use the file's first N examples (none: all)"})
    include_guidelines: bool = field(default=True, metadata={"help": "add the variant's and task's guidelines"})
    layout: str = field(
        default="stanic",
        metadata={"help": f"{' | '.join(LAYOUTS)}; bare: the query and signature only, for tiny policies"},
    )
    return_annotation: str | None = field(
        default=None, metadata={"help": "the entry point's return annotation, e.g. ImagePatch (none: the task's)"}
    )

    def __post_init__(self) -> None:
        spec = get_variant(self.variant)
        if self.task not in TASKS:
            raise ValueError(f"PromptConfig.task: {self.task!r} is not one of {TASKS}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"PromptConfig.layout: {self.layout!r} is not one of {LAYOUTS}")
        if self.layout == "bare" and self.ice_file is not None:
            raise ValueError("PromptConfig: layout 'bare' shows no in-context examples; set ice_file to null")
        video_variant = any(name == "VideoSegment" for name, _ in spec.classes)
        if video_variant != (self.task == "video_qa"):
            kind = "a video" if video_variant else "an image"
            raise ValueError(f"PromptConfig: variant {self.variant!r} is {kind} API but task is {self.task!r}")
        if self.max_ices is not None and (
            isinstance(self.max_ices, bool) or not isinstance(self.max_ices, int) or self.max_ices < 0
        ):
            raise ValueError(f"PromptConfig.max_ices must be a non-negative integer or null, got {self.max_ices!r}")
        if not isinstance(self.include_guidelines, bool):
            raise ValueError(f"PromptConfig.include_guidelines must be true or false, got {self.include_guidelines!r}")
        if self.ice_file is not None:
            object.__setattr__(self, "ice_file", str(self.ice_file))
        if self.return_annotation is not None and not (
            isinstance(self.return_annotation, str) and self.return_annotation.strip()
        ):
            raise ValueError(
                f"PromptConfig.return_annotation must be a non-empty string, got {self.return_annotation!r}"
            )

    @property
    def signature(self) -> str:
        params, returns = SIGNATURES[self.task]
        return f"def execute_command({params}) -> {self.return_annotation or returns}:"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "PromptConfig") -> PromptConfig:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys are {names}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PromptConfig:
        return cls.from_dict(json.loads(text))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str, where: str = "PromptConfig") -> PromptConfig:
        return cls.from_dict(yaml.safe_load(text) or {}, where)

    @classmethod
    def load(cls, path: str | Path) -> PromptConfig:
        """Read a YAML (or JSON, which YAML reads too) file."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"prompt config {str(path)!r} does not exist")
        return cls.from_yaml(path.read_text(encoding="utf-8"), where=str(path))
