"""The `hf` tool backend: GroundingDINO/OWLv2, CLIP/SigLIP, BLIP-2, DPT/Depth-Anything and a causal LM
through transformers.

    backend = HFBackend(images, **stack_yaml_without_backend_key)
    backend.run("detect", [ToolCall("detect", ref, None, {"noun": "cat", "threshold": None})])

Only the tools named in the config are supported; each tool's model is shared with any other tool
naming the same checkpoint and placement. `preload()` loads them all (the tool host does it before
the first call); a tool not preloaded loads on its first call. Every load and call runs with this
process's GPU current (`vprl/executor/tools/devices.py`). Settings: `settings.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from vprl.executor.tools.base import ToolBackend
from vprl.executor.tools.calls import TOOLS, ToolCall
from vprl.executor.tools.devices import on_device
from vprl.executor.tools.hf import depth as depth_mod
from vprl.executor.tools.hf import detection, matching
from vprl.executor.tools.hf import llm as llm_mod
from vprl.executor.tools.hf import vqa as vqa_mod
from vprl.executor.tools.hf.loading import ModelCache, Placement, resolve_device
from vprl.executor.tools.hf.settings import ToolSettings, parse_config
from vprl.executor.tools.images import ImageStore

__all__ = ["HFBackend"]

# The model each tool uses: (kind, loader). Tools of one kind and checkpoint share one model.
LOADERS: dict[str, tuple[str, Callable[[str, Placement], Any]]] = {
    "detect": ("detector", detection.load_detector),
    "verify": ("matcher", matching.load_matcher),
    "itm": ("matcher", matching.load_matcher),
    "vqa": ("captioner", vqa_mod.load_captioner),
    "caption": ("captioner", vqa_mod.load_captioner),
    "depth": ("depth", depth_mod.load_depth),
}


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

    def _loader(self, tool: str) -> tuple[str, Callable[[str, Placement], Any]]:
        if tool != "llm":
            return LOADERS[tool]
        settings = self.tools["llm"]
        return f"llm-{settings.engine}", lambda path, placement: llm_mod.load_text_model(path, placement, settings)

    def _model(self, tool: str) -> Any:
        settings = self.tools[tool]
        kind, loader = self._loader(tool)
        return self.models.get(kind, settings.model, settings.placement(self.defaults), loader)

    def _device(self, tool: str) -> str:
        return resolve_device(self.tools[tool].placement(self.defaults).device)

    def preload(self) -> list[str]:
        loaded = []
        for tool in self.tools:
            with on_device(self._device(tool)):
                self._model(tool)
            loaded.append(f"{tool}: {self.tools[tool].model} on {self._device(tool)}")
        return loaded

    def run(self, tool: str, calls: list[ToolCall]) -> list[Any]:
        if not self.supports(tool):
            return super().run(tool, calls)  # raises, naming the tools this stack has
        with on_device(self._device(tool)):
            return super().run(tool, calls)

    def _settings(self, tool: str) -> Any:
        settings: ToolSettings = self.tools[tool]
        return settings

    def detect(self, calls: list[ToolCall]) -> list[Any]:
        det = self._model("detect")
        return detection.detect(det, self._settings("detect"), calls, self.images)

    def verify(self, calls: list[ToolCall]) -> list[Any]:
        m = self._model("verify")
        return matching.verify(m, self._settings("verify"), calls, self.images)

    def itm(self, calls: list[ToolCall]) -> list[Any]:
        m = self._model("itm")
        return matching.itm(m, self._settings("itm"), calls, self.images)

    def vqa(self, calls: list[ToolCall]) -> list[Any]:
        cap = self._model("vqa")
        return vqa_mod.answer(cap, self._settings("vqa"), calls, self.images)

    def caption(self, calls: list[ToolCall]) -> list[Any]:
        cap = self._model("caption")
        return vqa_mod.answer(cap, self._settings("caption"), calls, self.images)

    def depth(self, calls: list[ToolCall]) -> list[Any]:
        dm = self._model("depth")
        return depth_mod.depth(dm, self._settings("depth"), calls, self.images)

    def llm(self, calls: list[ToolCall]) -> list[Any]:
        return llm_mod.llm(self._model("llm"), self._settings("llm"), calls)
