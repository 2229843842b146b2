"""The sandbox itself: framing, the layer probe, the canary, and that no secret is reachable."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest
from own_processes import SANDBOX_UID_BASE, sandbox_pids
from PIL import Image

from vprl.data.records import Example
from vprl.executor.host import ToolHost
from vprl.executor.runner import BatchRunner, RunnerConfig, SyncRunner
from vprl.executor.sandbox import framing, uids
from vprl.executor.sandbox.connection import SandboxUnavailable
from vprl.executor.sandbox.probe import LAYERS, explain_missing, probe_layers
from vprl.executor.sandbox.uids import POOL_END
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.oracle import OracleBackend

SECRET_ANSWER = "zebra" + "crossing" + "-7f3a"  # built at run time so this file's text is not the needle
SECRET_ATTR = "mauve" + "ish" + "-91c"
SECRET_ENV = "tok" + "-" + "5e1d" * 4


def make_world(root: Path) -> tuple[ToolHost, list[Example]]:
    """Two tiny images with scene graphs (GQA format, x/y top-left) and an oracle tool host."""
    scenes = {
        "scene1": {
            "width": 80,
            "height": 60,
            "objects": {
                "1": {
                    "name": "cat",
                    "x": 5,
                    "y": 5,
                    "w": 20,
                    "h": 20,
                    "attributes": ["black", SECRET_ATTR],
                    "relations": [],
                },
                "2": {"name": "dog", "x": 50, "y": 30, "w": 25, "h": 25, "attributes": ["white"], "relations": []},
            },
        },
        "scene2": {
            "width": 40,
            "height": 40,
            "objects": {
                "1": {"name": "cat", "x": 1, "y": 1, "w": 10, "h": 10, "attributes": ["orange"], "relations": []}
            },
        },
    }
    examples = []
    for image_id, scene in scenes.items():
        path = root / f"{image_id}.png"
        pixels = np.full((scene["height"], scene["width"], 3), 40 if image_id == "scene1" else 200, np.uint8)
        Image.fromarray(pixels).save(path)
        examples.append(
            Example(f"q-{image_id}", "gqa", "vqa", "what colour is the cat?", str(path), answers=(SECRET_ANSWER,))
        )
    host = ToolHost(OracleBackend(ImageStore(), scenes=scenes), max_wait_ms=1.0)
    return host, examples


NORMAL = [
    "def execute_command(image):\n    return ImagePatch(image).find('cat')[0].simple_query('what color is the cat?')\n",
    "def execute_command(image):\n    p = ImagePatch(image)\n    return bool_to_yesno(p.exists('dog'))\n",
    "def execute_command(image):\n    return len(ImagePatch(image).find('animal'))\n",
    "def execute_command(image):\n    p = ImagePatch(image)\n    return [p.width, p.height, p.horizontal_center]\n",
    "def execute_command(image):\n    return int(ImagePatch(image).cropped_image.mean())\n",
    "def execute_command(image):\n    cats = ImagePatch(image).find('cat')\n    return cats[0] if cats else None\n",
]


def normal_program(i: int) -> str:
    """A varied, deterministic normal program (most do tool calls)."""
    return NORMAL[i % len(NORMAL)] + f"# variant {i}\nX_{i} = {i}\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="module")
def runner(world):
    host, _ = world
    os.environ["VPRL_FAKE_HF_TOKEN"] = SECRET_ENV  # must never reach a sandbox
    try:
        with SyncRunner(host, RunnerConfig(slots=2, timeout_s=2.0, max_rpcs=50)) as r:
            yield r
    finally:
        del os.environ["VPRL_FAKE_HF_TOKEN"]


def run_one(runner: SyncRunner, example: Example, source: str):
    (result,) = runner.run([(example, source)])
    return result


# -- framing -------------------------------------------------------------------------------------
def test_frames_round_trip_and_enforce_cap():
    reader = framing.FrameReader(max_frame=100)
    data = framing.encode({"a": [1, "é", None]}) + framing.encode("x")
    assert reader.feed(data[:3]) == []
    assert reader.feed(data[3:]) == [{"a": [1, "é", None]}, "x"]
    assert reader.feed(framing.encode(1) + framing.HEADER.pack(101)) == [1]  # good frames before a bad one survive
    assert isinstance(reader.error, framing.FrameTooLarge)
    assert reader.feed(framing.encode(2)) == []  # a broken stream accepts nothing more
    bad = framing.FrameReader(100)
    assert bad.feed(framing.HEADER.pack(2) + b"\xff\xfe") == [] and isinstance(bad.error, framing.FrameError)
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    nested = framing.FrameReader(1 << 20)
    assert nested.feed(framing.HEADER.pack(len(deep)) + deep) == [] and nested.error is not None
    assert framing.decode_body(framing.encode("a\ud800b")[4:]) == "a?b"  # lone surrogates cannot travel


# -- layers --------------------------------------------------------------------------------------
def test_probe_finds_every_layer_as_root():
    if os.geteuid() != 0:
        pytest.skip("the full layer set needs root")
    report = probe_layers()
    assert report == {name: "ok" for name in LAYERS}, report


def test_missing_layer_is_named_with_its_fix():
    message = explain_missing({**{n: "ok" for n in LAYERS}, "netns": "PermissionError: [Errno 1]"})
    assert "netns" in message and "fix:" in message and "--sandbox none" in message
    assert "chroot" not in message


def test_refuses_to_start_without_a_required_layer(world):
    host, _ = world

    async def start():
        await BatchRunner(host, RunnerConfig(slots=1, require_layers=("netns", "no_such_layer"))).start()

    with pytest.raises(SandboxUnavailable, match="no_such_layer"):
        asyncio.run(start())


# -- the canary: isolation is really on ------------------------------------------------------------
CANARY = """
def execute_command(image):
    import os, sys, resource
    facts = {"uid": os.getuid(), "pid": os.getpid(), "root": os.listdir("/"), "env": sorted(os.environ),
             "fds": sorted(int(fd) for fd in range(64) if _isfd(fd)),
             "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0], "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[0]}
    try:
        os.setuid(0)
        facts["setuid0"] = True
    except PermissionError:
        facts["setuid0"] = False
    try:
        import socket
        facts["socket"] = "imported"
    except ImportError:
        facts["socket"] = "absent"
    return facts

def _isfd(fd):
    import os
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
"""


def test_canary_proves_isolation(runner, world):
    _, examples = world
    result = run_one(runner, examples[0], CANARY)
    assert result.status == "ok", result
    facts = result.answer
    assert SANDBOX_UID_BASE <= facts["uid"] < POOL_END  # a range claimed from the machine's pool (uids.py)
    assert facts["pid"] == 1  # the init of a fresh pid namespace (spawn "clone", the default)
    assert facts["root"] == []  # empty chroot: no /etc, no /proc, no /dev/shm
    assert facts["env"] == []
    assert facts["fds"] == [0, 1, 2, 3, 4]  # stdin, output pipe (1, 2), the two channel pipes
    assert facts["nproc"] == 16 and facts["fsize"] == 0
    assert facts["setuid0"] is False
    assert facts["socket"] == "absent"


def test_normal_programs_answer_from_the_tools(runner, world):
    _, examples = world
    results = runner.run([(examples[0], NORMAL[0]), (examples[1], NORMAL[0]), (examples[0], NORMAL[5])])
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    assert results[0].answer == "black" and results[1].answer == "orange"
    assert results[2].answer == {"box": [5, 35, 25, 55]}  # top-left (5,5,25,25) in a 60-high image
    assert [c.tool for c in results[0].tool_calls] == ["detect", "vqa"]


# -- labels, secrets and files are out of reach -------------------------------------------------
MEMORY_SEARCH = """
def execute_command(image):
    import gc, sys
    needles = [{needles}]
    hits = []
    def look(value, where):
        if isinstance(value, str) and any(n in value for n in needles) and not any(value is n for n in needles):
            hits.append(where)
    for obj in gc.get_objects():
        if obj is needles or obj is hits:
            continue
        if isinstance(obj, dict):
            for k, v in list(obj.items()):
                look(k, "gc dict key"); look(v, "gc dict value")
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for v in list(obj):
                look(v, "gc container")
    for name, module in list(sys.modules.items()):
        for k, v in list(getattr(module, "__dict__", {{}}).items()):
            look(v, "module " + name + "." + str(k))
    for k, v in globals().items():
        look(v, "globals " + k)
    return hits
"""


def test_answers_scene_graphs_and_tokens_are_not_in_sandbox_memory(runner, world):
    _, examples = world
    # The needles are assembled at run time inside the program, so the source does not contain them.
    parts = [repr(s[:4]) + " + " + repr(s[4:]) for s in (SECRET_ANSWER, SECRET_ATTR, SECRET_ENV)]
    result = run_one(runner, examples[0], MEMORY_SEARCH.format(needles=", ".join(parts)))
    assert result.status == "ok", result
    assert result.answer == []


def test_environment_proc_and_files_are_unreachable(runner, world, tmp_path):
    _, examples = world
    marker = tmp_path / "marker.txt"
    marker.write_text("host file")
    program = f"""
def execute_command(image):
    import os
    out = {{"env": dict(os.environ)}}
    for path in ["/proc/1/environ", "/proc/self/environ", "/etc/passwd", {str(marker)!r}, "/dev/shm"]:
        try:
            out[path] = open(path).read()[:50]
        except OSError as exc:
            out[path] = type(exc).__name__
    return out
"""
    result = run_one(runner, examples[0], program)
    assert result.status == "ok", result
    assert result.answer["env"] == {}
    assert all(v in ("FileNotFoundError", "PermissionError") for k, v in result.answer.items() if k != "env")
    assert SECRET_ENV not in str(result)


def test_no_sandbox_processes_remain(runner, world):
    _, examples = world
    runner.run([(examples[0], "def execute_command(image):\n    import os\n    os.fork()\n    return 1\n")])
    for _ in range(100):
        if not sandbox_pids():
            break
        import time

        time.sleep(0.01)
    assert sandbox_pids() == []


def test_sandbox_none_runs_in_process_with_a_warning(world):
    host, examples = world
    with pytest.warns(RuntimeWarning, match="NO isolation"), SyncRunner(host, RunnerConfig(sandbox="none")) as r:
        results = r.run([(examples[0], NORMAL[0]), (examples[0], "def execute_command(image):\n    return 1/0\n")])
    assert [x.status for x in results] == ["ok", "runtime_error"]
    assert results[0].answer == "black" and len(results[0].tool_calls) == 2


def test_item_1_supervisor_has_a_session_of_its_own(runner):
    """#37 item 1: a program that reaches the supervisor's process group (or session) must find
    only the supervisor there, never the trainer that started it."""
    supervisor = runner.runner.supervisor.proc.pid
    assert os.getpgid(supervisor) == supervisor and os.getsid(supervisor) == supervisor
    assert os.getpgid(supervisor) != os.getpgrp()


UID_ONLY = "def execute_command(image):\n    import os\n    return os.getuid() + 0 * {}\n"


def test_item_1_two_executors_on_one_machine_never_share_a_uid(world):
    """#37 item 1: two executors (two ranks) side by side run their programs under disjoint uids, so
    neither can signal the other's programs nor eat into their RLIMIT_NPROC."""
    host, examples = world
    config = RunnerConfig(slots=2, timeout_s=2.0)
    programs = [(examples[0], UID_ONLY.format(i)) for i in range(20)]  # more than a slot's 8 turns
    with SyncRunner(host, config) as first, SyncRunner(host, config) as second:
        seen = [{r.answer for r in runner.run(programs)} for runner in (first, second)]
    assert all(len(got) > 2 and min(got) >= SANDBOX_UID_BASE and max(got) < POOL_END for got in seen), seen
    assert not seen[0] & seen[1], seen


def test_item_1_uid_ranges_are_claimed_until_released(tmp_path):
    first, second = uids.Claim(2, (str(tmp_path),)), uids.Claim(3, (str(tmp_path),))
    assert first.bases == [60000, 60008] and second.bases == [60016, 60024, 60032]
    with pytest.raises(OSError, match=f"needs {uids.POOL_RANGES} uid ranges .* only {uids.POOL_RANGES - 5} of"):
        uids.Claim(uids.POOL_RANGES, (str(tmp_path),))
    first.release()  # as when its supervisor dies: the kernel drops the locks
    assert uids.Claim(3, (str(tmp_path),)).bases == [60000, 60008, 60040]
    with pytest.raises(ValueError, match="slots must be 1..124"):
        uids.Claim(125, (str(tmp_path),))


def test_item_1_uid_lock_folder_must_be_private(tmp_path):
    folder = tmp_path / uids.LOCK_FOLDER
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)  # writable by anyone: anyone could hold every range
    with pytest.raises(OSError, match=f"{folder} must be a folder owned by uid 0 and writable by nobody else"):
        uids.Claim(1, (str(tmp_path),))


@pytest.mark.parametrize("sandbox", ["full", "restricted"])
def test_a_sandbox_that_fails_its_set_up_says_why(world, sandbox):
    """On the GPU machine every program came back `infra_error` "sandbox set-up failed (exit code 1)"
    and nothing said which step failed: the child now names the exception, and the error carries it."""
    from vprl.executor.sandbox.child import Limits

    host, examples = world
    # A descriptor limit no kernel grants: setrlimit fails in the set-up, after the task arrived.
    config = RunnerConfig(slots=1, timeout_s=2.0, sandbox=sandbox, limits=Limits(nofile=1 << 40))
    with SyncRunner(host, config) as r:
        result = run_one(r, examples[0], NORMAL[0])
    assert result.status == "infra_error"
    assert result.error.startswith("sandbox set-up failed (exit code 1): ")
    assert "Error: " in result.error  # the exception's class and message, e.g. "OverflowError: ..."
