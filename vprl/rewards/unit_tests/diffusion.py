"""Test images from diffusers pipelines ([U] D.4; docs/references.md#test-images): text-to-image and layout-guided.

- "diffusers_t2i": Stable Diffusion or SDXL, picked from the checkpoint by
  `AutoPipelineForText2Image` (ViUniT: `CompVis/stable-diffusion-v1-4`,
  `stabilityai/stable-diffusion-xl-base-1.0`).
- "diffusers_layout": LM-grounded diffusion. A description first becomes a layout (boxes and
  phrases) by an LLM (`llm_layout.LlmLayoutPlanner`) or by a given function, then an image by
  `StableDiffusionGLIGENPipeline` (`gligen_phrases` / `gligen_boxes`). A description with no
  usable layout falls back to text-to-image with the same weights (counted in `warnings`).

ViUniT's settings are the defaults: 50 steps, guidance 16.0. When the pipeline's safety checker
flags an image, the generator retries with seed + 1, up to `nsfw_retries` (10) more times, and then
raises `UnsafeImageError`. The noise comes from a CPU `torch.Generator` seeded with the seed, so a
(description, seed) pair gives the same image on every run and device type.
"""

from __future__ import annotations

import importlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from PIL import Image

from vprl.executor.tools.hf.loading import resolve_device, torch_dtype
from vprl.rewards.unit_tests.llm_layout import Layout, LayoutPlannerConfig, LlmLayoutPlanner
from vprl.rewards.unit_tests.protocols import register_generator

ON_EMPTY_LAYOUT = ("text_to_image", "error")
DTYPES = ("auto", "float32", "bfloat16", "float16")


class UnsafeImageError(RuntimeError):
    """Every try at an image was flagged by the safety checker."""


class LayoutError(ValueError):
    """No layout for a description and `on_empty_layout: error`."""


@dataclass(frozen=True)
class DiffusionConfig:
    model: str = ""  # diffusers checkpoint (path or hub id)
    device: str = "auto"  # auto and cuda: this training process's GPU (vprl/executor/tools/devices.py)
    dtype: str = "auto"  # auto: float16 on CUDA, float32 on CPU
    steps: int = 50
    guidance_scale: float = 16.0
    height: int | None = None  # None: the checkpoint's native size
    width: int | None = None
    negative_prompt: str | None = None
    safety_checker: bool = True  # keep the checkpoint's checker (and the NSFW retries)
    nsfw_retries: int = 10

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("`model` is required: a diffusers checkpoint path or hub id")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.nsfw_retries < 0:
            raise ValueError(f"nsfw_retries must be >= 0, got {self.nsfw_retries}")
        for name in ("height", "width"):
            value = getattr(self, name)
            if value is not None and (value < 8 or value % 8):
                raise ValueError(f"{name} must be a multiple of 8 (>= 8), got {value}")

    @classmethod
    def from_dict(cls, settings: dict[str, Any], where: str):
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise ValueError(f"{where}: unknown setting(s) {unknown}; valid settings: {names}")
        return cls(**settings)

    def torch_dtype(self, device: str):
        if self.dtype == "auto":
            return torch_dtype("float16" if device.startswith("cuda") else "float32")
        return torch_dtype(self.dtype)

    def key(self) -> dict[str, Any]:
        # The device is left out: a CPU generator makes the noise, so images match across devices.
        return {k: v for k, v in asdict(self).items() if k != "device"}


def _load(pipeline_cls: Any, config: DiffusionConfig) -> Any:
    from diffusers import DiffusionPipeline

    device = resolve_device(config.device)
    kwargs: dict[str, Any] = {"torch_dtype": config.torch_dtype(device)}
    has_checker = "safety_checker" in DiffusionPipeline.load_config(config.model)
    if has_checker and not config.safety_checker:
        kwargs.update(safety_checker=None, requires_safety_checker=False)
    pipe = pipeline_cls.from_pretrained(config.model, **kwargs).to(device)
    pipe.set_progress_bar_config(disable=True)  # one image per call; the caller's loop has the bar
    return pipe


class _DiffusersGenerator:
    def __init__(self, config: DiffusionConfig, pipeline: Any = None) -> None:
        self.config = config
        self._pipeline = pipeline
        if pipeline is not None:
            pipeline.set_progress_bar_config(disable=True)  # one image per call; the caller's loop has the bar
        self.stats: Counter = Counter()  # images, nsfw_flagged, fallbacks
        self.last_seed: int | None = None  # the seed of the last image returned (after retries)

    def _call(self, pipe: Any, description: str, seed: int, **kwargs: Any) -> Image.Image:
        """Run `pipe`, retrying with seed + 1 while the safety checker flags the image."""
        import torch

        c = self.config
        if c.negative_prompt is not None:
            kwargs.setdefault("negative_prompt", c.negative_prompt)
        for attempt in range(c.nsfw_retries + 1):
            out = pipe(
                prompt=description,
                num_inference_steps=c.steps,
                guidance_scale=c.guidance_scale,
                height=c.height,
                width=c.width,
                generator=torch.Generator("cpu").manual_seed(seed + attempt),
                **kwargs,
            )
            flagged = getattr(out, "nsfw_content_detected", None)  # SDXL has no checker: attribute absent
            if not (flagged and flagged[0]):
                self.stats["images"] += 1
                self.last_seed = seed + attempt
                return out.images[0].convert("RGB")
            self.stats["nsfw_flagged"] += 1
        raise UnsafeImageError(
            f"the safety checker flagged all {c.nsfw_retries + 1} images for {description!r} "
            f"(seeds {seed}..{seed + c.nsfw_retries}); reword the test or raise nsfw_retries"
        )


class DiffusersTextToImage(_DiffusersGenerator):
    """ "diffusers_t2i": one Stable Diffusion / SDXL image per (description, seed)."""

    def __init__(self, config: DiffusionConfig, pipeline: Any = None) -> None:
        super().__init__(config, pipeline)
        self.config_key = "diffusers_t2i:" + json.dumps(config.key(), sort_keys=True)

    @property
    def pipeline(self) -> Any:
        if self._pipeline is None:
            from diffusers import AutoPipelineForText2Image

            self._pipeline = _load(AutoPipelineForText2Image, self.config)
        return self._pipeline

    def generate(self, description: str, seed: int) -> Image.Image:
        return self._call(self.pipeline, description, seed)


def import_layout_fn(spec: str) -> Callable[[str], Layout | None]:
    """`package.module:function` -> the function (lets YAML name a rule-based layout step)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"layout_fn must look like 'package.module:function', got {spec!r}")
    fn = getattr(importlib.import_module(module), attr, None)
    if not callable(fn):
        raise ValueError(f"layout_fn {spec!r} is not a callable")
    return fn


class DiffusersLayoutToImage(_DiffusersGenerator):
    """ "diffusers_layout": description -> layout (LLM or function) -> GLIGEN image."""

    def __init__(
        self,
        config: DiffusionConfig,
        planner: LlmLayoutPlanner | None = None,
        layout_fn: Callable[[str], Layout | None] | str | None = None,
        pipeline: Any = None,
        scheduled_sampling_beta: float = 0.3,
        on_empty_layout: str = "text_to_image",
    ) -> None:
        super().__init__(config, pipeline)
        if (planner is None) == (layout_fn is None):
            raise ValueError("diffusers_layout needs exactly one of a layout planner (layout LLM) or a layout_fn")
        if on_empty_layout not in ON_EMPTY_LAYOUT:
            raise ValueError(f"on_empty_layout must be one of {list(ON_EMPTY_LAYOUT)}, got {on_empty_layout!r}")
        self.planner = planner
        self.layout_fn = import_layout_fn(layout_fn) if isinstance(layout_fn, str) else layout_fn
        self.beta = scheduled_sampling_beta
        self.on_empty_layout = on_empty_layout
        self.warnings: Counter = Counter()
        self._layouts: dict[str, Layout | None] = {}
        self._fallback: Any = None
        if planner is not None:
            source = planner.config_key
        else:
            source = f"fn:{getattr(self.layout_fn, '__module__', '?')}.{getattr(self.layout_fn, '__qualname__', '?')}"
        key = {**config.key(), "beta": self.beta, "on_empty_layout": on_empty_layout, "layout": source}
        self.config_key = "diffusers_layout:" + json.dumps(key, sort_keys=True)

    @property
    def pipeline(self) -> Any:
        if self._pipeline is None:
            from diffusers import StableDiffusionGLIGENPipeline

            self._pipeline = _load(StableDiffusionGLIGENPipeline, self.config)
        return self._pipeline

    def plan_layouts(self, descriptions: list[str]) -> list[Layout | None]:
        """Layouts for many descriptions in one batched LLM call (memoised; `generate` reuses them)."""
        todo = [d for d in dict.fromkeys(descriptions) if d not in self._layouts]
        if todo:
            planned = self.planner.plan(todo) if self.planner is not None else [self.layout_fn(d) for d in todo]
            self._layouts.update(zip(todo, planned))
        return [self._layouts[d] for d in descriptions]

    def _text_to_image(self) -> Any:
        """Stable Diffusion over the GLIGEN weights: without `gligen` kwargs the gated layers are skipped."""
        if self._fallback is None:
            from diffusers import StableDiffusionPipeline

            parts = {k: v for k, v in self.pipeline.components.items()}
            self._fallback = StableDiffusionPipeline(**parts, requires_safety_checker=False)
            self._fallback.set_progress_bar_config(disable=True)
        return self._fallback

    def generate(self, description: str, seed: int) -> Image.Image:
        (layout,) = self.plan_layouts([description])
        if layout is None:
            self.warnings["no_layout"] += 1
            if self.on_empty_layout == "error":
                raise LayoutError(f"no layout for {description!r} (on_empty_layout: error)")
            self.stats["fallbacks"] += 1
            return self._call(self._text_to_image(), description, seed)
        kwargs: dict[str, Any] = dict(
            gligen_phrases=layout.phrases,
            gligen_boxes=layout.gligen_boxes(),
            gligen_scheduled_sampling_beta=self.beta,
        )
        if layout.negative and self.config.negative_prompt is None:
            kwargs["negative_prompt"] = layout.negative
        return self._call(self.pipeline, description, seed, **kwargs)


@register_generator("diffusers_t2i")
def diffusers_t2i(pipeline: Any = None, **settings: Any) -> DiffusersTextToImage:
    """Registry factory: settings are `DiffusionConfig` fields; `pipeline` is a pipeline object handed in."""
    return DiffusersTextToImage(DiffusionConfig.from_dict(settings, "image generator 'diffusers_t2i'"), pipeline)


@register_generator("diffusers_layout")
def diffusers_layout(
    layout: dict[str, Any] | None = None,
    layout_fn: Callable[[str], Layout | None] | str | None = None,
    scheduled_sampling_beta: float = 0.3,
    on_empty_layout: str = "text_to_image",
    pipeline: Any = None,
    layout_backend: Any = None,
    **settings: Any,
) -> DiffusersLayoutToImage:
    """Registry factory. `layout` holds the layout LLM's settings (`LayoutPlannerConfig` fields:
    model, backend, num_candidates, ...); or `layout_fn` names a function (`module:function`)."""
    config = DiffusionConfig.from_dict(settings, "image generator 'diffusers_layout'")
    planner = None
    if layout is not None:
        planner_config = LayoutPlannerConfig.from_dict(layout, where="image generator 'diffusers_layout': layout")
        planner = LlmLayoutPlanner(planner_config, backend=layout_backend)
    return DiffusersLayoutToImage(config, planner, layout_fn, pipeline, scheduled_sampling_beta, on_empty_layout)
