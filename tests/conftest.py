"""Fixtures shared by several test modules."""

import numpy as np
import pytest

from vprl.executor.tools.images import ImageStore

HALVES_H, HALVES_W = 100, 200


def pytest_configure(config):
    # Sandboxes that outlive their supervisor stay in this run's process tree, where the leak checks
    # look (tests/own_processes.py), instead of going to init.
    from own_processes import adopt_orphans

    adopt_orphans()


def pytest_collection_modifyitems(config, items):
    # The tests that read a background job's result run last: the job has had the suite to finish.
    waiting = [item for item in items if item.get_closest_marker("background")]
    items[:] = [item for item in items if not item.get_closest_marker("background")] + waiting


def pytest_collection_finish(session):
    import background_jobs

    if session.config.option.collectonly:
        return
    names = [m.args[0] for item in session.items if (m := item.get_closest_marker("background"))]
    background_jobs.start(list(dict.fromkeys(names)))


def pytest_sessionfinish(session, exitstatus):
    import background_jobs

    background_jobs.stop_all()


@pytest.fixture()
def store():
    """An ImageStore holding one 200x100 image, left half red and right half blue: `(store, ref)`."""
    images = ImageStore()
    pixels = np.zeros((HALVES_H, HALVES_W, 3), dtype=np.uint8)
    pixels[:, : HALVES_W // 2, 0] = 255
    pixels[:, HALVES_W // 2 :, 2] = 255
    return images, images.add_array(pixels).ref


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core box spin up to 50x slower.

    A module opts in with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def repair_assets(tmp_path_factory):
    """A shapes world and a policy fitted on it for 60 steps, shared by the repair tests (GRPO, RLOO,
    a plain trl script): `(world, policy)`."""
    from rl_tiny import build_policy, build_world

    root = tmp_path_factory.mktemp("repair")
    world = build_world(root / "world")
    return world, build_policy(root / "policy", world, fit_steps=60)
