"""Images programs build are evicted when their program is done (and an LRU cap backs that up)."""

from __future__ import annotations

import asyncio
import base64
import contextlib

import numpy as np
import pytest
from test_sandbox import make_world

from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolError
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.oracle import OracleBackend


def pixels(value: int, size: int = 8) -> np.ndarray:
    return np.full((size, size, 3), value, np.uint8)


def test_an_image_lives_while_an_owner_holds_it():
    store = ImageStore()
    a = store.add_array(pixels(1), owner="p1")
    assert store.add_array(pixels(1), owner="p2") is a  # same content, two holders
    assert store.program_built(a.ref) and store.owned_bytes("p1") == 8 * 8 * 3
    assert store.release("p1") == [] and a.ref in store
    assert store.release("p2") == [a.ref] and a.ref not in store
    assert store.release("p2") == []  # releasing twice is harmless


def test_dataset_images_are_never_evicted():
    store = ImageStore()
    dataset = store.add_array(pixels(2))  # no owner: a dataset image
    assert store.add_array(pixels(2), owner="p1") is dataset and not store.program_built(dataset.ref)
    promoted = store.add_array(pixels(3), owner="p1")
    store.add_array(pixels(3))  # the same content later added as a dataset image stays
    assert store.release("p1") == [] and dataset.ref in store and promoted.ref in store


def test_a_pinned_image_outlives_its_owner_until_the_call_is_done():
    store = ImageStore()
    ref = store.add_array(pixels(4), owner="p1").ref
    store.pin(ref)
    assert store.release("p1") == [] and ref in store
    store.unpin(ref)
    assert ref not in store


def test_lru_cap_on_count_and_bytes():
    store = ImageStore(max_program_images=3)
    refs = [store.add_array(pixels(10 + i), owner="leaky").ref for i in range(3)]
    store.get(refs[0])  # used: now the most recent
    newest = store.add_array(pixels(20), owner="leaky").ref
    assert [r in store for r in (*refs, newest)] == [True, False, True, True]
    by_bytes = ImageStore(max_program_bytes=2 * 8 * 8 * 3)
    first = by_bytes.add_array(pixels(30), owner="a").ref
    by_bytes.add_array(pixels(31), owner="b")
    by_bytes.add_array(pixels(32), owner="c")
    assert first not in by_bytes and len(by_bytes) == 2


def test_host_caps_the_bytes_one_program_may_register():
    host = ToolHost(OracleBackend(ImageStore(), scenes={}), max_program_image_bytes=2 * 8 * 8 * 3)
    data = [base64.b64encode(pixels(v).tobytes()).decode() for v in (1, 2, 3)]
    host.register([8, 8], data[0], owner="p")
    host.register([8, 8], data[1], owner="p")
    with pytest.raises(ToolError, match="at most"):
        host.register([8, 8], data[2], owner="p")
    assert host.release("p") == 2 and host.metrics()["images_evicted"] == 2
    host.close()


def test_a_queued_call_keeps_its_image(tmp_path):
    host, _ = make_world(tmp_path)
    ref = host.register([8, 8], base64.b64encode(pixels(5).tobytes()).decode(), owner="p")[0]

    async def go():
        call = asyncio.ensure_future(host.call(ToolCall("depth", ref, None, {})))
        await asyncio.sleep(0)  # queued for its batch, not yet run
        host.release("p")
        assert ref in host.images
        with contextlib.suppress(ToolError):  # the oracle has no scene for a program's image
            await call
        return ref in host.images

    assert asyncio.run(go()) is False  # gone once its call was done
    host.close()


BUILDS_IMAGES = """
def execute_command(image):
    import numpy as np
    patches = [ImagePatch(np.full((3, 10, 12), {v} + k, dtype=np.uint8)) for k in range(3)]
    return [p.width for p in patches] + [int(patches[0].cropped_image.mean())]
"""


@pytest.mark.parametrize("sandbox", ["full", "none"])
def test_images_a_program_builds_are_evicted_when_it_is_done(tmp_path, sandbox):
    host, examples = make_world(tmp_path)
    warned = pytest.warns(RuntimeWarning) if sandbox == "none" else contextlib.nullcontext()
    with warned, SyncRunner(host, RunnerConfig(slots=2, timeout_s=5.0, sandbox=sandbox)) as runner:
        runner.run([(examples[0], "def execute_command(image):\n    return 1\n")])  # dataset image in
        baseline = len(host.images)
        results = runner.run([(examples[i % 2], BUILDS_IMAGES.format(v=50 * i)) for i in range(4)])
        after = len(host.images)
    assert [r.status for r in results] == ["ok"] * 4, results
    assert results[1].answer == [12, 12, 12, 50]
    assert host.metrics()["registered"] == 12
    assert host.metrics()["images_evicted"] == 12 and after == baseline + 1  # only the second dataset image
    host.close()
