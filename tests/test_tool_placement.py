"""Issue #24, fault 3: every model of a training process goes on that process's GPU, and the layout
check plans it there. Eight GPUs are faked on the CPU: torch reports them, moving a module to one
records the move and leaves the weights where they are, and making one current records the thread."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import types
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import tiny_models as tiny  # noqa: E402
from test_layout import recipe_prompts  # noqa: E402

from vprl.executor.host import ToolHost  # noqa: E402
from vprl.executor.tools.calls import ToolCall  # noqa: E402
from vprl.executor.tools.hf import HFBackend  # noqa: E402
from vprl.executor.tools.stack import stack_path  # noqa: E402
from vprl.train.recipe import layout  # noqa: E402
from vprl.train.recipe.checks import reward_config  # noqa: E402
from vprl.train.recipe.parsing import ConfigError  # noqa: E402
from vprl.train.recipe.rl_config import parse_rl_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class FakeGPUs:
    """What the code asked of the fake GPUs: `moves` (thread, device) per module moved, `current`
    (thread, index) per block run with a device current."""

    def __init__(self, monkeypatch, count: int) -> None:
        self.moves: list[tuple[str, str]] = []
        self.current: list[tuple[str, int]] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "device", self._device)
        real_to = torch.nn.Module.to

        def to(module, *args, **kwargs):
            where = kwargs.get("device", args[0] if args else None)
            if isinstance(where, (str, torch.device)):
                self.moves.append((threading.current_thread().name, str(where)))
                return module  # a fake GPU: the weights stay on the CPU
            return real_to(module, *args, **kwargs)

        monkeypatch.setattr(torch.nn.Module, "to", to)

    @contextlib.contextmanager
    def _device(self, index):
        self.current.append((threading.current_thread().name, int(index)))
        yield


@pytest.fixture(scope="module")
def clip_path(tmp_path_factory):
    return tiny.build("clip", tmp_path_factory.mktemp("placement"))


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return tiny.build("causal_lm", tmp_path_factory.mktemp("placement_lm"))


def test_in_process_tools_of_rank_3_load_on_gpu_3_not_gpu_0_from_the_worker_thread(monkeypatch, clip_path, store):
    """Fault: the tool host's worker thread loaded the stack with device "cuda", which in a new thread
    is GPU 0, whatever the rank."""
    gpus = FakeGPUs(monkeypatch, 8)
    monkeypatch.setenv("LOCAL_RANK", "3")
    images, ref = store
    host = ToolHost(HFBackend(images, device="auto", itm={"model": clip_path}, verify={"model": clip_path}))
    try:
        asyncio.run(host.call(ToolCall("itm", ref, None, {"texts": ["a cat"]})))  # loads on first use
    finally:
        host.close()
    assert gpus.moves and all(device == "cuda:3" for _, device in gpus.moves), gpus.moves
    assert all(thread.startswith("tool-backend") for thread, _ in gpus.moves)  # loaded by the worker
    assert {index for thread, index in gpus.current if thread.startswith("tool-backend")} == {3}


def test_preloading_places_every_tool_on_the_ranks_gpu(monkeypatch, clip_path, store):
    gpus = FakeGPUs(monkeypatch, 8)
    monkeypatch.setenv("LOCAL_RANK", "3")
    images, _ = store
    backend = HFBackend(images, device="cuda", itm={"model": clip_path}, verify={"model": clip_path, "device": "cpu"})
    host = ToolHost(backend)
    try:
        loaded = host.preload()
    finally:
        host.close()
    assert loaded == [f"verify: {clip_path} on cpu", f"itm: {clip_path} on cuda:3"]
    assert sorted(device for _, device in gpus.moves) == ["cpu", "cuda:3"]


def test_the_unit_test_writer_and_the_verifiers_embedder_of_rank_3_load_on_gpu_3(monkeypatch, clip_path, lm_path):
    """Fault: the writer, the image generator and the embedders resolved "cuda"/"auto" without an
    index: GPU 0 for every rank."""
    from vprl.rewards.unit_tests import diffusion
    from vprl.rewards.unit_tests.llm_backends import BackendSettings
    from vprl.rewards.unit_tests.llm_backends import HFBackend as WriterBackend
    from vprl.rewards.verifiers.embedders import build_embedder

    gpus = FakeGPUs(monkeypatch, 8)
    monkeypatch.setenv("LOCAL_RANK", "3")
    writer = WriterBackend(BackendSettings(model=lm_path))
    writer._load()
    embedder = build_embedder(f"clip:{clip_path}@cuda")
    assert embedder.device == "cuda:3"

    class Pipeline:
        @classmethod
        def from_pretrained(cls, path, **kwargs):
            pipe = cls()
            pipe.dtype = kwargs["torch_dtype"]
            return pipe

        def to(self, device):
            gpus.moves.append(("diffusers", str(device)))
            return self

        def set_progress_bar_config(self, **kwargs):
            pass

    import diffusers

    monkeypatch.setattr(diffusers.DiffusionPipeline, "load_config", classmethod(lambda cls, path: {}))
    pipe = diffusion._load(Pipeline, diffusion.DiffusionConfig(model="tiny/sd"))
    assert pipe.dtype == torch.float16  # "auto" on a GPU
    assert [device for _, device in gpus.moves] == ["cuda:3", "cuda:3", "cuda:3"]


def test_a_vllm_engine_is_refused_on_a_rank_whose_gpu_vllm_would_not_use(monkeypatch):
    """vLLM starts an engine on the first visible GPU: on rank 1 of two GPUs it would land on GPU 0."""
    from vprl.rewards.unit_tests.llm_backends import BackendSettings, VllmBackend

    FakeGPUs(monkeypatch, 2)
    built = []
    module = types.ModuleType("vllm")
    module.LLM = lambda **kwargs: built.append(kwargs)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(RuntimeError, match=r"first visible GPU, not on this process's cuda:1.*backend: server"):
        _ = VllmBackend(BackendSettings(model="m", backend="vllm")).engine
    monkeypatch.setenv("LOCAL_RANK", "0")
    _ = VllmBackend(BackendSettings(model="m", backend="vllm")).engine
    assert len(built) == 1


def _plan(recipe: str, gpus: list[float], *extra: str):
    cfg = parse_rl_config(["--config", str(REPO / "configs" / recipe), *extra])
    stack = yaml.safe_load(stack_path(cfg.executor.tool_stack).read_text())
    queries = ["Is there a red car?"]
    return layout.plan_layout(cfg, stack, reward_config(cfg), queries, gpus, recipe_prompts(cfg, queries))


def test_two_processes_on_one_gpu_are_counted_twice_there(monkeypatch):
    """Fault: the check counted one copy of the policy, its vLLM and the ViUniT stack per GPU and
    passed, while the processes sharing a GPU each put theirs on it."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    plan = _plan("grpo_codellama_gqa_correctness.yaml", [80.0])
    with pytest.raises(ConfigError, match=r"cuda:0 would need .* for 2 training process\(es\) but has 80\.0 GiB"):
        plan.check()
    assert plan.per_device() == [pytest.approx(2 * plan.per_process)]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    _plan("grpo_codellama_gqa_correctness.yaml", [80.0]).check()  # one process fits


def test_the_layouts_per_gpu_totals_are_where_the_code_loads_each_ranks_tools(monkeypatch, clip_path, store):
    """Eight processes on four GPUs: load each rank's stack as its process would, add up the planned
    size of what moved to each device, and compare with the check's per-GPU totals."""
    gpus = FakeGPUs(monkeypatch, 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    stack = {"backend": "hf", "device": "auto", "dtype": "float16", "itm": {"model": clip_path}}
    plan = layout.Layout(layout.tool_components(stack, None), [80.0] * 4, processes=8)
    images, _ = store
    loaded = [0.0] * 4
    for rank in range(8):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        gpus.moves.clear()
        host = ToolHost(HFBackend(images, **{k: v for k, v in stack.items() if k != "backend"}))
        try:
            host.preload()
        finally:
            host.close()
        ((_, device),) = gpus.moves
        loaded[int(device.removeprefix("cuda:"))] += plan.per_process
    assert plan.per_device() == pytest.approx(loaded) and loaded == pytest.approx([2 * plan.per_process] * 4)
    assert "cuda:3: local rank(s) 3, 7" in plan.render()


def test_an_unprepared_vllm_writer_is_refused_before_any_work_under_two_gpus(monkeypatch):
    monkeypatch.setattr(layout, "_prepared", lambda settings, cfg, queries: False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    plan = _plan("grpo_codellama_gqa_unit_tests.yaml", [80.0, 80.0])
    with pytest.raises(
        ConfigError, match=r"local rank 1: unit-test writer: a vLLM engine .* cuda:1.*prepare_unit_tests"
    ):
        plan.check()


def test_a_run_stops_when_accelerates_gpu_is_not_where_its_tools_would_load(monkeypatch):
    from vprl.train.rl import check_device

    FakeGPUs(monkeypatch, 8)
    monkeypatch.setenv("LOCAL_RANK", "3")
    check_device(torch.device("cuda", 3))
    check_device(torch.device("cpu"))  # a CPU policy beside GPU tools is a choice, not a mismatch
    with pytest.raises(
        RuntimeError, match=r"accelerate trains this process on cuda:2 but its tools would load on cuda:3"
    ):
        check_device(torch.device("cuda", 2))
