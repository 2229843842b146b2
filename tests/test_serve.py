"""The tools as a service on Ray Serve (Serve runs on a CPU): the executor gets the same answers
served as in-process, ranks share one served stack, a replica killed mid-run costs no program, and
a service that is not there fails at start naming what is missing."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from vprl.data.records import write_jsonl  # noqa: E402
from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs  # noqa: E402
from vprl.data.shapes.tasks import load_shapes_tasks  # noqa: E402
from vprl.executor.backends import open_backend  # noqa: E402
from vprl.executor.host import ToolHost  # noqa: E402
from vprl.executor.runner import RunnerConfig, SyncRunner  # noqa: E402
from vprl.executor.serve.deploy import ServiceUnavailable, deploy, undeploy  # noqa: E402
from vprl.executor.tools.stack import build_backend  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# A short batch window, so calls of different clients meet in one batch even on a slow CPU.
SERVE = {"app_prefix": "test-shapes-", "default": {"max_batch_size": 16, "batch_wait_timeout_s": 0.05}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("served") / "world"
    build_dataset(BuildConfig(out=str(root), train=60, val=4, winoground=0, sugarcrepe=0, refcoco=0, seed=4))
    examples = load_shapes_tasks(root, ["train"])["train"]
    gold = load_gold_programs(root)["vqa"]
    return root, examples, gold


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray instance with the shapes stack deployed (one replica per tool)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a stale cluster
    stack = tmp_path_factory.mktemp("stack") / "shapes_served.yaml"
    stack.write_text(yaml.safe_dump({"backend": "shapes", "serve": SERVE}))
    settings = deploy(stack)
    try:
        yield ray.get_runtime_context().gcs_address, stack, settings
    finally:
        serve.shutdown()
        ray.shutdown()


def _run_cli(tmp_path, examples, programs, stack, service=None, name="out") -> list[dict]:
    write_jsonl(tmp_path / "examples.jsonl", examples)
    write_jsonl(
        tmp_path / "programs.jsonl",
        [{"id": str(i), "example_id": e.id, "program": p} for i, (e, p) in enumerate(programs)],
    )
    out = tmp_path / f"{name}.jsonl"
    command = [sys.executable, "-m", "vprl.executor.run", "--examples", str(tmp_path / "examples.jsonl")]
    command += [
        "--programs",
        str(tmp_path / "programs.jsonl"),
        "--tool_stack",
        str(stack),
        "--out",
        str(out),
        "--executor_slots",
        "2",
    ]
    command += ["--tool_service", service] if service else []
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def _programs(world, n=24):
    _, examples, gold = world
    crash = "def execute_command(image):\n    return ImagePatch(image).find('circle')[5].simple_query('What color?')\n"
    return [(e, gold[e.query]) for e in examples[:n]] + [(examples[0], crash)]


def test_the_executor_answers_the_same_with_the_shapes_tools_served(tmp_path, world, cluster):
    address, stack, _ = cluster
    programs = _programs(world)
    local = _run_cli(tmp_path, [e for e, _ in programs], programs, stack, name="local")
    served = _run_cli(tmp_path, [e for e, _ in programs], programs, stack, address, name="served")
    assert [(r["status"], r["answer"]) for r in served] == [(r["status"], r["answer"]) for r in local]
    assert {r["status"] for r in served} == {"ok", "runtime_error"}


def test_the_executor_answers_the_same_with_a_tiny_hf_stack_served(tmp_path, world, cluster):
    import tiny_models

    stack = tmp_path / "hf_served.yaml"
    stack.write_text(
        yaml.safe_dump(
            {
                "backend": "hf",
                "device": "cpu",
                "dtype": "float32",
                # one call at a time on both sides: a random-weight model's answers may depend on padding
                "detect": {"model": tiny_models.build("grounding_dino", tmp_path / "m"), "max_batch_size": 1},
                "vqa": {"model": tiny_models.build("blip2_t5", tmp_path / "m"), "max_batch_size": 1},
                "caption": {"model": tiny_models.build("blip2_t5", tmp_path / "m"), "max_batch_size": 1},
                # vqa and caption share a model, so they share a deployment (one copy of BLIP-2)
                "serve": {"app_prefix": "test-hf-", "groups": {"blip2": ["vqa", "caption"]}},
            }
        )
    )
    settings = deploy(stack)
    try:
        programs = _programs(world, n=6)
        local = _run_cli(tmp_path, [e for e, _ in programs], programs, stack, name="local")
        served = _run_cli(tmp_path, [e for e, _ in programs], programs, stack, cluster[0], name="served")
    finally:
        undeploy(settings)
    assert [(r["status"], r["answer"]) for r in served] == [(r["status"], r["answer"]) for r in local]
    assert any(r["status"] == "ok" for r in served)
    assert settings.members == {"blip2": ["vqa", "caption"], "detect": ["detect"]}


def _replica(app: str):
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if app in a["name"]]
    assert names, f"no replica of {app}"
    return ray.get_actor(names[0], namespace="serve")


def test_a_replica_killed_mid_run_costs_no_program(world, cluster):
    address, stack, settings = cluster
    _, examples, gold = world
    jobs = [(e, gold[e.query]) for e in examples]
    with SyncRunner(ToolHost(build_backend(stack)), RunnerConfig(slots=2)) as runner:
        expected = runner.run(jobs)
    backend = open_backend(stack, service=address)
    pid = backend.handles["detect"].stats.remote().result()["pid"]
    killed = threading.Event()
    send = backend.run
    detect_batches = itertools.count()

    def run(tool, calls):
        # The third detect batch goes out while its replica is being killed.
        if tool == "detect" and next(detect_batches) == 2:
            threading.Thread(target=lambda: (ray.kill(_replica(settings.app("detect"))), killed.set())).start()
        return send(tool, calls)

    backend.run = run
    with SyncRunner(ToolHost(backend, rpc_timeout_s=120), RunnerConfig(slots=2)) as runner:
        got = runner.run(jobs)
    assert killed.is_set() and len(got) == len(jobs)
    assert [r.status for r in got].count("infra_error") == 0
    assert [(r.status, r.answer) for r in got] == [(r.status, r.answer) for r in expected]
    assert backend.handles["detect"].stats.remote().result()["pid"] != pid  # a new replica answered


def test_a_missing_service_or_tool_fails_at_start_naming_it(tmp_path, cluster):
    address, _, _ = cluster
    stack = tmp_path / "not_deployed.yaml"
    stack.write_text(yaml.safe_dump({"backend": "shapes", "serve": {"app_prefix": "nobody-", "tools": ["detect"]}}))
    with pytest.raises(ServiceUnavailable, match=r"does not deploy detect \(applications nobody-detect\)"):
        open_backend(stack, service=address)
    command = [sys.executable, "-c", "from vprl.executor.serve.deploy import connect; connect('127.0.0.1:1')"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert proc.returncode != 0 and "no Ray cluster at '127.0.0.1:1'" in proc.stderr


def test_two_ranks_train_on_one_served_stack_and_share_its_batches(tmp_path, cluster):
    """`accelerate launch --num_processes 2`: both ranks' tool hosts call the same deployments, whose
    batches mix calls of the two ranks."""
    from rl_tiny import build_policy, build_world, write_recipe

    address = cluster[0]
    # A stack of its own with a longer batch window: the two ranks reach execution at about the same
    # time each step (they gather rewards together), but a loaded CPU can put them a few 100 ms apart.
    stack = tmp_path / "ranks.yaml"
    serve_section = {"app_prefix": "test-ranks-", "default": {"max_batch_size": 32, "batch_wait_timeout_s": 0.4}}
    stack.write_text(yaml.safe_dump({"backend": "shapes", "serve": serve_section}))
    settings = deploy(stack)
    world = build_world(tmp_path / "world")
    policy = build_policy(tmp_path / "policy", world)
    names = list(settings.placements)
    before = {name: serve.get_app_handle(settings.app(name)).stats.remote().result() for name in names}
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack=str(stack),
        tool_service=address,
        output_dir=str(tmp_path / "run"),
        max_steps=3,
        per_device_train_batch_size=8,
        warmup_steps=0,
    )
    command = [str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command += ["--main_process_port", str(29700 + os.getpid() % 200), "vprl/train/rl.py", "--config", str(recipe)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        after = {name: serve.get_app_handle(settings.app(name)).stats.remote().result() for name in names}
    finally:
        undeploy(settings)
    assert not {settings.app(name) for name in names} & set(serve.status().applications)  # gone on return
    calls = sum(after[n]["calls"] - before[n]["calls"] for n in names)
    mixed = sum(after[n]["mixed_batches"] - before[n]["mixed_batches"] for n in names)
    assert calls > 0 and mixed > 0, after
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 16 and not any(r["status"] == "infra_error" for r in rows)


def test_the_serve_section_is_checked_naming_the_bad_key():
    from vprl.executor.serve.settings import parse_serve

    stack = {"_source": "s.yaml", "detect": {"model": "m", "max_batch_size": 8}}
    settings = parse_serve({**stack, "serve": {"groups": {"pair": ["detect", "vqa"]}}}, ["detect", "vqa", "itm"])
    assert settings.members == {"pair": ["detect", "vqa"], "itm": ["itm"]} and settings.app_of("vqa") == "vprl-pair"
    assert settings.placements["pair"].max_batch_size == 8  # the largest batch of its tools
    assert settings.placements["pair"].deployment_options()["max_ongoing_requests"] >= 8
    bad = [
        ({"detect": {"num_gpu": 1}}, r"serve\.detect: unknown key\(s\) \['num_gpu'\]"),
        (
            {"detect": {"max_batch_size": 8, "max_ongoing_requests": 5}},
            r"max_ongoing_requests \(5\) below max_batch_size",
        ),
        ({"tools": ["llm"]}, r"serve\.tools: \['llm'\] are not tools this stack configures"),
        ({"groups": {"a": ["detect"], "b": ["detect"]}}, r"serve\.groups: \['detect'\] in two groups"),
        ({"replicas": 2}, r"serve: unknown key\(s\) \['replicas'\]"),
    ]
    for section, message in bad:
        with pytest.raises(ValueError, match=message):
            parse_serve({**stack, "serve": section}, ["detect", "vqa", "itm"])
