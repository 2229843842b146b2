"""Issue #24, fault 6 (loading): the stack's models load before the first step, in-process and
served, so a cold load (a minute for BLIP-2 XXL) is never spent out of a tool call's timeout."""

from __future__ import annotations

import asyncio
import functools
import time
from types import SimpleNamespace

import pytest
from test_sandbox import make_world

import vprl.train.rl as rl
from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.oracle import OracleBackend

VQA = "def execute_command(image):\n    return ImagePatch(image).simple_query('what color is the cat?')\n"


class SlowLoadingOracle(OracleBackend):
    """The oracle behind a model that takes `load_s` to load, on its first use unless preloaded, as
    the hf backend's models do."""

    load_s = 1.5

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.loads = 0

    def _load(self) -> None:
        if not self.loads:
            time.sleep(self.load_s)
            self.loads += 1

    def preload(self) -> list[str]:
        self._load()
        return [*super().preload(), "vqa: a slow model"]

    def vqa(self, calls):
        self._load()
        return super().vqa(calls)


def test_the_first_tool_call_of_a_run_is_not_an_infra_error_while_a_model_loads(tmp_path, monkeypatch):
    """Fault: the models loaded on the first call, inside its timeout (30 s against BLIP-2's minute):
    the first step's programs were all `infra_error`. Here the load takes 1.5 s against 0.3 s."""
    oracle, examples = make_world(tmp_path)
    backend = SlowLoadingOracle(oracle.images, scenes=oracle.backend.scenes)
    monkeypatch.setattr(rl, "open_backend", lambda stack, service=None, **overrides: backend)
    monkeypatch.setattr(rl, "ToolHost", functools.partial(ToolHost, rpc_timeout_s=0.3))
    checked = SimpleNamespace(
        tool_stack={"backend": "oracle"},
        tool_service=None,
        tool_overrides={},
        runner=RunnerConfig(slots=1, timeout_s=2.0, rpc_timeout_s=0.3),
    )
    with rl.executor(checked) as (runner, host, _):
        assert backend.loads == 1  # before the first program
        (result,) = runner.run([(examples[0], VQA)])
    assert result.status == "ok" and result.answer == "black", result
    assert host.metrics()["unavailable"] == 0


@pytest.fixture(scope="module")
def stack_paths(tmp_path_factory):
    pytest.importorskip("transformers")
    import tiny_models as tiny

    root = tmp_path_factory.mktemp("preload")
    return {family: tiny.build(family, root) for family in ("clip", "grounding_dino")}


def test_the_hf_backend_loads_every_configured_model_before_any_call(stack_paths, store):
    from vprl.executor.tools.hf import HFBackend

    images, ref = store
    backend = HFBackend(
        images,
        device="cpu",
        detect={"model": stack_paths["grounding_dino"]},
        verify={"model": stack_paths["clip"]},
        itm={"model": stack_paths["clip"]},
    )
    host = ToolHost(backend)
    try:
        assert [line.split(":")[0] for line in host.preload()] == ["detect", "verify", "itm"]
        assert sorted(kind for kind, _, _ in backend.models.loaded()) == ["detector", "matcher"]  # CLIP once
        asyncio.run(host.call(ToolCall("itm", ref, None, {"texts": ["a cat"]})))
        assert len(backend.models.loaded()) == 2  # the call found its model loaded
    finally:
        host.close()


def test_a_served_replica_loads_its_models_before_serve_routes_a_call_to_it(stack_paths, store):
    """Fault: a replica loaded its model on its first request, inside the client's timeout, whatever
    `deploy.py` said. Serve routes nothing to a replica before its constructor returns."""
    pytest.importorskip("ray.serve")
    from vprl.executor.serve.replica import ToolReplica

    stack = {"backend": "hf", "device": "cpu", "itm": {"model": stack_paths["clip"]}}
    replica = ToolReplica(stack, ["itm"], max_batch_size=4, wait_s=0.01, cache_size=100)
    assert [kind for kind, _, _ in replica.backend.models.loaded()] == ["matcher"]
    assert replica.stats()["preloaded"] == [f"itm: {stack_paths['clip']} on cpu"]


def test_a_deployment_that_may_scale_to_zero_is_refused():
    from vprl.executor.serve.settings import parse_serve

    stack = {"_source": "stack.yaml", "serve": {"itm": {"autoscaling": {"min_replicas": 0, "max_replicas": 2}}}}
    with pytest.raises(ValueError, match=r"stack\.yaml: serve\.itm: autoscaling\.min_replicas must be >= 1"):
        parse_serve(stack, ["itm"])


def test_a_deployed_stack_has_its_models_loaded_when_deploy_returns(stack_paths, tmp_path):
    """The served path end to end on a local Ray: `deploy` returns once the replicas are up, and the
    client's preload reports the models they loaded, before any call."""
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    import yaml

    from vprl.executor.backends import open_backend
    from vprl.executor.serve.deploy import deploy

    stack = tmp_path / "hf_preload.yaml"
    itm = {"model": stack_paths["clip"]}
    stack.write_text(
        yaml.safe_dump({"backend": "hf", "device": "cpu", "itm": itm, "serve": {"app_prefix": "preload-"}})
    )
    # A cluster of its own, even beside one another test or user started on this machine.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        deploy(stack)
        host = ToolHost(open_backend(stack, service=ray.get_runtime_context().gcs_address))
        try:
            assert host.preload() == [f"itm: {stack_paths['clip']} on cpu (served by itm)"]
            assert host.metrics()["calls"] == 0
        finally:
            host.close()
    finally:
        serve.shutdown()
        ray.shutdown()
