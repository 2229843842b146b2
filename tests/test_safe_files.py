"""`vprl.data.safe_files`: image paths from rows are read only as regular files under the allowed
folders, capped, never blocking (#37 item 4)."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from vprl.data.safe_files import RefusedFile, open_image_file, resolve_inside


@contextlib.contextmanager
def within(seconds: int):
    """Fail instead of hanging the suite when an open blocks (the FIFO case, on the old code)."""

    def expired(*_):
        raise TimeoutError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def tree(tmp_path):
    run = tmp_path / "run"
    (run / "pics").mkdir(parents=True)
    (run / "pics" / "a.png").write_bytes(b"picture")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(b"secret")
    os.symlink(outside / "secret.png", run / "pics" / "link.png")
    os.mkfifo(run / "pics" / "fifo.png")
    return run, outside


def test_item4_a_regular_file_inside_is_read_and_relative_paths_are_the_run_folders(tree, tmp_path, monkeypatch):
    run, _ = tree
    assert open_image_file(run / "pics" / "a.png", [run]) == b"picture"
    monkeypatch.chdir(tmp_path)  # the working directory has no pics/: the run folder is what counts
    assert open_image_file("pics/a.png", [run], base=run) == b"picture"
    with pytest.raises(RefusedFile, match=r"^pics/a.png: a relative path, and no folder"):
        open_image_file("pics/a.png", [run])
    assert resolve_inside("pics/../pics/a.png", [run], base=run) == (run / "pics" / "a.png").resolve()


@pytest.mark.parametrize(
    "name, reason",
    [
        ("fifo", r"fifo.png: not a regular file \(a FIFO\)"),
        ("zero", r"^/dev/zero: outside the folders"),
        ("passwd", r"^/etc/passwd: outside the folders"),
        ("absolute", r"secret.png: outside the folders"),
        ("symlink", r"link.png: outside the folders images are read from \(it resolves to .*secret.png\)"),
        ("escape", r"secret.png: outside the folders"),
    ],
)
def test_item4_what_is_not_a_regular_file_under_the_roots_is_refused(tree, name, reason):
    run, outside = tree
    path = {
        "fifo": str(run / "pics" / "fifo.png"),
        "zero": "/dev/zero",
        "passwd": "/etc/passwd",
        "absolute": str(outside / "secret.png"),
        "symlink": str(run / "pics" / "link.png"),
        "escape": "../outside/secret.png",
    }[name]
    with within(5), pytest.raises(RefusedFile, match=reason):
        open_image_file(path, [run], base=run)
    with within(5), pytest.raises(RefusedFile):  # a device under an allowed root is no file either
        open_image_file("/dev/zero", ["/dev"])


def test_item4_a_file_over_the_cap_is_refused_before_it_is_read(tree):
    run, _ = tree
    (run / "big.png").write_bytes(b"x" * 1001)
    with pytest.raises(RefusedFile, match=r"big.png: 1,001 bytes, over the cap of 1,000"):
        open_image_file(run / "big.png", [run], max_bytes=1000)
    assert open_image_file(run / "big.png", [run], max_bytes=1001) == b"x" * 1001
    with pytest.raises(RefusedFile, match=r"no file name can have"):
        open_image_file("a\ud800.png", [run], base=run)
    assert isinstance(RefusedFile("p", "r"), ValueError)  # callers that catch ValueError keep working
