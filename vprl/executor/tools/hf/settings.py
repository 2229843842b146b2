"""The hf backend's configuration: top-level placement defaults plus one settings block per tool.

A tool stack YAML (e.g. `vprl/executor/tools/stacks/viunit.yaml`, the stack named `viunit`) minus its `backend:` key is passed as keyword
arguments to `HFBackend`. Unknown keys are errors that list the valid ones, at every level.
Defaults are the papers' settings (ViUniT's, [U] C.2; see `docs/references.md#tool-stacks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from vprl.data.typed import check_row
from vprl.executor.tools.hf.loading import Placement


@dataclass
class ToolSettings:
    """Keys every tool block accepts. `device`/`dtype`/`quantization` default to the top-level ones."""

    model: str = ""  # hub id or local directory
    device: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    max_batch_size: int = 8

    def placement(self, defaults: Placement) -> Placement:
        return Placement(
            device=self.device or defaults.device,
            dtype=self.dtype or defaults.dtype,
            quantization=self.quantization or defaults.quantization,
        )


@dataclass
class DetectSettings(ToolSettings):
    # None = the family's paper default: GroundingDINO 0.2 (ViUniT), OWLv2 0.1 (Stanić). A call's
    # `threshold` argument overrides it (self-tuning lowers it between trials).
    box_threshold: float | None = None
    text_threshold: float = 0.2  # GroundingDINO only: token-level threshold (ViUniT: 0.2)
    nms_iou: float | None = None  # optional greedy NMS between the boxes of one call


@dataclass
class VerifySettings(ToolSettings):
    # verify = softmax over [template, *contrasts] (CLIP/SigLIP logits); true when P(template) > threshold.
    threshold: float = 0.8  # ViUniT's "0.8 similarity threshold" for CLIP, read as this probability
    template: str = "a photo of a {property} {object}"
    contrasts: list[str] = field(default_factory=lambda: ["a photo of a {object}"])


@dataclass
class ItmSettings(ToolSettings):
    template: str = "{text}"  # e.g. "a photo of {text}"


@dataclass
class GenerationSettings(ToolSettings):
    """BLIP-2 generation. `max_length`/`min_length` count *generated* tokens (mapped to max/min_new_tokens)
    so they mean the same for Flan-T5 (encoder-decoder, as in LAVIS) and OPT/Llama (decoder-only)."""

    prompt: str = ""
    num_beams: int = 5
    max_length: int = 10
    min_length: int = 1
    length_penalty: float = -1.0
    repetition_penalty: float = 1.0
    max_batch_size: int = 4  # ViUniT: BLIP-2 max batch 4


@dataclass
class VqaSettings(GenerationSettings):
    prompt: str = "Question: {question} Answer:"  # BLIP-2 Flan-T5 QA prompt


@dataclass
class CaptionSettings(GenerationSettings):
    length_penalty: float = 1.0  # ViUniT captioning: length_penalty 1, max_length 30
    max_length: int = 30


@dataclass
class DepthSettings(ToolSettings):
    # What the model outputs: "disparity" (relative inverse depth: DPT, MiDaS, Depth-Anything relative) or
    # "depth" (metric checkpoints). Disparity d is reported as max(d over the image) - d: larger = farther.
    output: str = "disparity"
    map_cache: int = 8  # depth maps of the last N images kept (calls on one image share one forward)
    max_batch_size: int = 4


@dataclass
class LlmSettings(ToolSettings):
    engine: str = "transformers"  # or "vllm" (GPU only)
    max_new_tokens: int = 256
    chat_template: bool = True  # wrap the prompt as a user turn when the tokenizer has a chat template
    gpu_memory_utilization: float = 0.3  # vLLM only: leaves room for the vision models on the same GPU


TOOL_SETTINGS: dict[str, type[ToolSettings]] = {
    "detect": DetectSettings,
    "verify": VerifySettings,
    "itm": ItmSettings,
    "vqa": VqaSettings,
    "caption": CaptionSettings,
    "depth": DepthSettings,
    "llm": LlmSettings,
}
TOP_LEVEL = ("device", "dtype", "quantization")


def _names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def parse_tool(tool: str, block: Any) -> ToolSettings:
    cls = TOOL_SETTINGS[tool]
    if isinstance(block, str):
        block = {"model": block}
    if not isinstance(block, dict):
        raise ValueError(f"hf backend: `{tool}` must be a mapping with a `model` key, got {type(block).__name__}")
    unknown = sorted(set(block) - set(_names(cls)))
    if unknown:
        raise ValueError(f"hf backend: unknown key(s) {unknown} under `{tool}`; valid keys: {_names(cls)}")
    check_row(cls, block, f"hf backend: `{tool}`")
    settings = cls(**block)
    if not settings.model:
        raise ValueError(f"hf backend: `{tool}.model` is required (a hub id or a local directory)")
    if settings.max_batch_size < 1:
        raise ValueError(f"hf backend: `{tool}.max_batch_size` must be >= 1, got {settings.max_batch_size}")
    if isinstance(settings, DepthSettings) and settings.output not in ("disparity", "depth"):
        raise ValueError(f"hf backend: `depth.output` must be 'disparity' or 'depth', got {settings.output!r}")
    if isinstance(settings, LlmSettings) and settings.engine not in ("transformers", "vllm"):
        raise ValueError(f"hf backend: `llm.engine` must be 'transformers' or 'vllm', got {settings.engine!r}")
    return settings


def parse_config(config: dict[str, Any]) -> tuple[Placement, dict[str, ToolSettings]]:
    """Validate a whole config; returns the default placement and the settings of configured tools."""
    valid = list(TOP_LEVEL) + list(TOOL_SETTINGS)
    unknown = sorted(set(config) - set(valid))
    if unknown:
        raise ValueError(f"hf backend: unknown key(s) {unknown}; valid keys: {valid}")
    top = {k: config[k] for k in TOP_LEVEL if k in config}
    check_row(Placement, top, "hf backend")
    defaults = Placement(**top)
    tools = {tool: parse_tool(tool, config[tool]) for tool in TOOL_SETTINGS if config.get(tool) is not None}
    for settings in tools.values():
        settings.placement(defaults)  # raises on a bad per-tool device/dtype/quantization now, not at first use
    return defaults, tools
