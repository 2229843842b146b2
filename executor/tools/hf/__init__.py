"""The `hf` tool backend: GroundingDINO/OWLv2, CLIP/SigLIP, BLIP-2, DPT/Depth-Anything and a causal LM
through transformers.

    backend = HFBackend(images, **stack_yaml_without_backend_key)
    backend.run("detect", [ToolCall("detect", ref, None, {"noun": "cat", "threshold": None})])

Only the tools named in the config are supported; each tool's model loads on its first call and is
shared with any other tool naming the same checkpoint and placement. Settings: `settings.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from executor.tools.base import ToolBackend
from executor.tools.calls import TOOLS, ToolCall
from executor.tools.hf import depth as depth_mod
from executor.tools.hf import detection, matching
from executor.tools.hf import llm as llm_mod
from executor.tools.hf import vqa as vqa_mod
from executor.tools.hf.loading import ModelCache, Placement
from executor.tools.hf.settings import ToolSettings, parse_config
from executor.tools.images import ImageStore

__all__ = ["HFBackend"]


class HFBackend(ToolBackend):
    name: ClassVar[str] = "hf"

    def __init__(self, images: ImageStore, **config: Any) -> None:
        super().__init__(images, **config)
        self.defaults, self.tools = parse_config(config)
        self.models = ModelCache()

    @classmethod
    def check_settings(cls, **settings: Any) -> None:
        parse_config(settings)

    @classmethod
    def configured_tools(cls, **settings: Any) -> list[str]:
        return [tool for tool in TOOLS if tool in parse_config(settings)[1]]

    def supports(self, tool: str) -> bool:
        return tool in TOOLS and tool in self.tools

    def _model(self, tool: str, kind: str, loader: Callable[[str, Placement], Any]) -> Any:
        settings = self.tools[tool]
        return self.models.get(kind, settings.model, settings.placement(self.defaults), loader)

    def _settings(self, tool: str) -> Any:
        settings: ToolSettings = self.tools[tool]
        return settings

    def detect(self, calls: list[ToolCall]) -> list[Any]:
        det = self._model("detect", "detector", detection.load_detector)
        return detection.detect(det, self._settings("detect"), calls, self.images)

    def verify(self, calls: list[ToolCall]) -> list[Any]:
        m = self._model("verify", "matcher", matching.load_matcher)
        return matching.verify(m, self._settings("verify"), calls, self.images)

    def itm(self, calls: list[ToolCall]) -> list[Any]:
        m = self._model("itm", "matcher", matching.load_matcher)
        return matching.itm(m, self._settings("itm"), calls, self.images)

    def vqa(self, calls: list[ToolCall]) -> list[Any]:
        cap = self._model("vqa", "captioner", vqa_mod.load_captioner)
        return vqa_mod.answer(cap, self._settings("vqa"), calls, self.images)

    def caption(self, calls: list[ToolCall]) -> list[Any]:
        cap = self._model("caption", "captioner", vqa_mod.load_captioner)
        return vqa_mod.answer(cap, self._settings("caption"), calls, self.images)

    def depth(self, calls: list[ToolCall]) -> list[Any]:
        dm = self._model("depth", "depth", depth_mod.load_depth)
        return depth_mod.depth(dm, self._settings("depth"), calls, self.images)

    def llm(self, calls: list[ToolCall]) -> list[Any]:
        settings = self._settings("llm")
        kind = f"llm-{settings.engine}"
        tm = self._model("llm", kind, lambda path, placement: llm_mod.load_text_model(path, placement, settings))
        return llm_mod.llm(tm, settings, calls)
