"""The evaluation's GPU memory (issue #24, fault 4): vLLM gets an explicit share of GPU 0 that leaves
the tool stack room, one policy's engine is shut down before the next policy's starts, and a plan
that cannot fit is refused before any work in one line naming the components.

No GPU here: the GPUs' memory is a `FakeGPU`, and vLLM is a fake package whose `LLM` does what the
real one does with memory: like vLLM V1 it refuses to start unless its `gpu_memory_utilization` of
the GPU is free, holds that share until `llm_engine.engine_core.shutdown()`, and answers
`generate` with vLLM-shaped outputs.
"""

from __future__ import annotations

import importlib.machinery
import itertools
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from evaluate_helpers import build_tiny_llama, build_world

from vprl.train.evaluation import memory
from vprl.train.evaluation.config import EvalConfig
from vprl.train.evaluation.pipeline import evaluate, main, validate
from vprl.train.recipe.parsing import parse_config

REPO = Path(__file__).resolve().parents[1]
H100 = 79.2  # GiB torch reports for an 80 GB H100
BODY = "\n    return 'yes'"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class FakeGPU:
    def __init__(self, total: float, held: dict[str, float] | None = None):
        self.total, self.held = total, dict(held or {})

    def free(self, device: int = 0) -> float:
        return self.total - sum(self.held.values())


def fake_vllm(gpu: FakeGPU, events: list) -> dict[str, types.ModuleType]:
    """The modules of a fake vLLM install whose engines take and give back `gpu`'s memory."""
    ids = itertools.count(1)

    class LLM:
        def __init__(self, model, gpu_memory_utilization=0.9, **kwargs):  # 0.9: vLLM's default
            need = gpu_memory_utilization * gpu.total
            if gpu.free() < need:
                raise ValueError(
                    f"Free memory on device ({gpu.free():.2f}/{gpu.total:.2f} GiB) on startup is less than desired "
                    f"GPU memory utilization ({gpu_memory_utilization}, {need:.2f} GiB)"
                )
            self.name = f"engine-{next(ids)}"
            events.append(("start", self.name, gpu_memory_utilization, sorted(k for k in gpu.held if "engine" in k)))
            gpu.held[self.name] = need
            self.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(shutdown=self._shutdown))

        def _shutdown(self):
            gpu.held.pop(self.name, None)
            events.append(("shutdown", self.name))

        def generate(self, prompts, sampling_params=None, *, lora_request=None, use_tqdm=True):
            n = sampling_params.kwargs["n"]
            return [SimpleNamespace(outputs=[SimpleNamespace(text=BODY) for _ in range(n)]) for _ in prompts]

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    def cleanup_dist_env_and_memory(shutdown_ray: bool = False):
        events.append(("cleanup",))

    modules = {name: types.ModuleType(name) for name in ("vllm", "vllm.lora", "vllm.lora.request", "vllm.distributed")}
    modules["vllm"].__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # find_spec reads it
    modules["vllm"].LLM, modules["vllm"].SamplingParams = LLM, SamplingParams
    modules["vllm.lora.request"].LoRARequest = lambda name, lora_id, path: (name, lora_id, path)
    modules["vllm.distributed"].cleanup_dist_env_and_memory = cleanup_dist_env_and_memory
    return modules


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    build_world(root, val=4)
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, world):
    root = tmp_path_factory.mktemp("tiny")
    return build_tiny_llama(root / "model", world, context=256, adapter_out=root / "adapter"), str(root / "adapter")


@pytest.fixture
def gpu(monkeypatch):
    """One GPU of 80 GiB as this process sees it, vLLM installed (the fake) and CUDA available."""
    fake = FakeGPU(80.0)
    events: list = []
    for name, module in fake_vllm(fake, events).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(memory, "gpu_totals", lambda: [fake.total])
    monkeypatch.setattr(memory, "free_gib", fake.free)
    return fake, events


def _cfg(tmp_path, world, tiny, **kw) -> EvalConfig:
    base = dict(
        model_name_or_path=tiny[0],
        adapters=f"rl={tiny[1]}",
        shapes_root=str(world),
        datasets="shapes:val",
        prompt_layout="bare",
        limit=2,
        max_completion_length=16,
        generator="vllm",
        torch_dtype="float32",
        out=str(tmp_path / "out"),
    )
    return EvalConfig(**(base | kw))


def test_second_policy_engine_starts_after_the_first_gave_its_share_back(tmp_path, world, tiny, gpu):
    fake, events = gpu
    fake.held["tools"] = 20.0  # the stack's models, loaded on the GPU and kept warm across policies
    report = evaluate(_cfg(tmp_path, world, tiny, vllm_gpu_memory_utilization=0.5))
    assert set(report["results"]) == {"base", "rl"}
    starts = [e for e in events if e[0] == "start"]
    # each engine got the configured share (not vLLM's 0.9) and found no other engine on the GPU
    assert [(share, alive) for _, _, share, alive in starts] == [(0.5, []), (0.5, [])]
    assert [e[0] for e in events] == ["start", "shutdown", "cleanup", "start", "shutdown", "cleanup"]
    assert fake.held == {"tools": 20.0}  # the session's close released the last engine too


def test_shipped_gqa_configs_leave_the_tools_room_on_an_80gb_gpu():
    for path in sorted((REPO / "configs" / "eval").glob("gqa_*.yaml")):
        (cfg,) = parse_config([EvalConfig], ["--config", str(path)])
        share = yaml.safe_load(path.read_text())["vllm_gpu_memory_utilization"]
        assert 0 < share < 0.9, path.name
        plan = memory.plan_memory(cfg, "vllm", None, None, list, [H100])
        plan.check(cfg.tool_stack)
        assert any(c.name == "tool vqa, caption" and c.where == "GPU 0" for c in plan.components)
        cfg.vllm_gpu_memory_utilization = 0.9  # vLLM's default: BLIP-2 no longer fits beside it
        with pytest.raises(ValueError, match=r"lower vllm_gpu_memory_utilization to at most 0\.[5-8]"):
            memory.plan_memory(cfg, "vllm", None, None, list, [H100]).check(cfg.tool_stack)


def test_layout_that_cannot_fit_is_refused_in_one_line_naming_the_components(tmp_path, world, tiny, gpu, capsys):
    fake, events = gpu
    fake.total = 40.0
    argv = [
        "--model_name_or_path",
        tiny[0],
        "--shapes_root",
        str(world),
        "--datasets",
        "shapes:val",
        "--prompt_layout",
        "bare",
    ]
    argv += ["--tool_stack", str(REPO / "vprl/executor/tools/stacks/vipergpt.yaml"), "--generator", "vllm"]
    argv += ["--vllm_gpu_memory_utilization", "0.5", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and events == [] and not (tmp_path / "out").exists()
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and error[0].startswith("error: vllm_gpu_memory_utilization: 0.5 of GPU 0")
    for part in ("policy vLLM 20.0 GiB", "tool vqa, caption 12.5 GiB", "tool llm 14.2 GiB", "vipergpt.yaml"):
        assert part in error[0]


def test_tools_beside_the_transformers_policy_or_on_a_missing_gpu_are_refused(tmp_path, world, tiny):
    stack = yaml.safe_load((REPO / "vprl/executor/tools/stacks/vipergpt.yaml").read_text())
    path = tmp_path / "stack.yaml"
    cfg = _cfg(tmp_path, world, tiny, tool_stack=str(path), generator="hf")
    path.write_text(yaml.safe_dump(stack))
    with pytest.raises(ValueError, match=r"^tool_stack: GPU 0 \(24\.0 GiB.*tool llm 14\.2 GiB.*stack\.yaml$"):
        memory.plan_memory(cfg, "hf", None, None, list, [24.0]).check(cfg.tool_stack)
    stack["llm"]["device"] = "cuda:1"  # moved to a second GPU: both fit
    path.write_text(yaml.safe_dump(stack))
    plan = memory.plan_memory(cfg, "hf", None, None, list, [24.0, 24.0])
    plan.check(cfg.tool_stack)
    assert [c.name for c in plan.on(1)] == ["tool llm"]
    with pytest.raises(
        ValueError, match=r"tool_stack: llm \(Qwen/Qwen2\.5-7B-Instruct\) is placed on cuda:1, but 1 GPU"
    ):
        memory.plan_memory(cfg, "hf", None, None, list, [24.0])
    # self-tuning runs a second tool host: its models count a second time
    tuned = memory.plan_memory(cfg, "hf", {"llm": {"device": "cuda:0"}}, None, list, [24.0, 24.0])
    assert [c.name for c in tuned.on(0)].count("self-tuning tool llm") == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vllm_gpu_memory_utilization": 1.2}, r"vllm_gpu_memory_utilization: a share of GPU 0 between 0 and 1"),
        ({"vllm_gpu_memory_utilization": 0}, r"vllm_gpu_memory_utilization: a share of GPU 0 between 0 and 1"),
        ({"vllm_kwargs": '{"gpu_memory_utilization": 0.9}'}, r"vllm_kwargs: gpu_memory_utilization is set with the"),
    ],
)
def test_bad_vllm_share_is_refused_naming_the_key(tmp_path, world, tiny, change, message):
    with pytest.raises(ValueError, match=message):
        validate(_cfg(tmp_path, world, tiny, generator="auto", **change))


def test_share_too_small_for_the_weights_is_refused(tmp_path, world, tiny, gpu):
    fake, _ = gpu
    cfg = _cfg(tmp_path, world, tiny, vllm_gpu_memory_utilization=1e-9)
    with pytest.raises(ValueError, match=r"vllm_gpu_memory_utilization: 1e-09 of GPU 0 .* not even the policy's"):
        validate(cfg)


def test_an_engine_still_holding_the_gpu_stops_the_next_one_with_the_reason(gpu):
    fake, _ = gpu
    fake.held["engine-unreleased"] = 60.0
    with pytest.raises(RuntimeError, match=r"policy 'rl''s vLLM engine needs 40\.0 GiB free on GPU 0.* only 20\.0"):
        memory.wait_for_free(40.0, "policy 'rl''s vLLM engine", wait_s=0)
