"""Reading an image file whose path came from a row someone else wrote, without trusting the path.

A rollout row, a prediction or a dataset file names image paths; a shared folder can hold a FIFO
(an open would block forever), a device (`/dev/zero` never ends), a symlink to a private file, or
an absolute path anywhere on the machine. `open_image_file` reads a path only when it is a regular
file under one of the given roots once every symlink is resolved, no larger than a cap, and opens it
without blocking; anything else raises `RefusedFile`, whose message names the path and the reason.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

MAX_IMAGE_BYTES = 64 * 1024 * 1024  # a JPEG of 8k x 8k is about 20 MB: past this it is no picture
MAX_VIDEO_BYTES = 4 * 1024**3  # NExT-QA's clips are tens of MB; past this it is no dataset clip
_READ_CHUNK = 1 << 20
# A FIFO opened for reading blocks until a writer comes, unless O_NONBLOCK; a terminal would become
# the process's controlling one without O_NOCTTY; the last component must not be a symlink swapped
# in after the check.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


class RefusedFile(ValueError):
    """A path that is not read: outside the roots, not a regular file, too large, or unreadable."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def resolve_inside(
    path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]], base: str | os.PathLike[str] | None = None
) -> Path:
    """`path` with every symlink resolved, if that lies under one of `roots` (themselves resolved).
    A relative path is taken relative to `base`, never to the working directory."""
    text = os.fspath(path)
    if not text or "\0" in text:
        raise RefusedFile(path, "not a file path")
    try:
        os.fsencode(text)
    except UnicodeEncodeError:  # a lone surrogate from a JSON escape names no file
        raise RefusedFile(path, "not a file path (it has characters no file name can have)") from None
    if not os.path.isabs(text):
        if base is None:
            raise RefusedFile(path, "a relative path, and no folder it is relative to")
        text = os.path.join(os.fspath(base), text)
    real = os.path.realpath(text)
    resolved_roots = [os.path.realpath(os.fspath(r)) for r in roots if os.fspath(r)]
    if not _inside(real, resolved_roots):
        where = ", ".join(resolved_roots) or "(no folder allowed)"
        shown = "" if real == text else f" (it resolves to {real})"
        raise RefusedFile(path, f"outside the folders images are read from{shown}: {where}")
    return Path(real)


def open_image_file(
    path: str | os.PathLike[str],
    roots: Iterable[str | os.PathLike[str]],
    max_bytes: int = MAX_IMAGE_BYTES,
    base: str | os.PathLike[str] | None = None,
) -> bytes:
    """The bytes of `path` if it is a regular file of at most `max_bytes` under one of `roots`
    (symlinks resolved; a relative path taken relative to `base`); `RefusedFile` otherwise."""
    roots = list(roots)
    fd = _open_checked(path, resolve_inside(path, roots, base), roots, max_bytes)
    try:
        return _read_capped(fd, path, max_bytes)
    finally:
        os.close(fd)


def check_regular_file(
    path: str | os.PathLike[str],
    roots: Iterable[str | os.PathLike[str]],
    max_bytes: int,
    base: str | os.PathLike[str] | None = None,
) -> Path:
    """The resolved `path`, for a library that opens files by name (OpenCV's video reader), after the
    same checks as `open_image_file` on an open that cannot block; nothing is read."""
    roots = list(roots)
    real = resolve_inside(path, roots, base)
    os.close(_open_checked(path, real, roots, max_bytes))
    return real


def _open_checked(path: str | os.PathLike[str], real: Path, roots: list, max_bytes: int) -> int:
    """A descriptor of `real` once it is known to be a regular file of at most `max_bytes` under `roots`."""
    try:
        fd = os.open(real, _OPEN_FLAGS)
    except OSError as exc:
        raise RefusedFile(path, f"cannot be opened ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RefusedFile(path, f"not a regular file ({_kind(info.st_mode)})")
        if info.st_size > max_bytes:
            raise RefusedFile(path, f"{info.st_size:,} bytes, over the cap of {max_bytes:,}")
        _check_opened(fd, path, roots)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_opened(fd: int, path: str | os.PathLike[str], roots: list[str | os.PathLike[str]]) -> None:
    """A folder of the path swapped for a symlink between the check and the open is caught here:
    where the open file really is, as the kernel says."""
    link = f"/proc/self/fd/{fd}"
    if not os.path.exists(link):
        return  # no /proc (not Linux): the check before the open stands alone
    opened = os.readlink(link)
    if not _inside(opened, [os.path.realpath(os.fspath(r)) for r in roots]):
        raise RefusedFile(path, f"it was moved outside the folders images are read from while opening ({opened})")


def _read_capped(fd: int, path: str | os.PathLike[str], max_bytes: int) -> bytes:
    chunks, total = [], 0
    while True:
        try:
            chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - total))
        except OSError as exc:
            raise RefusedFile(path, f"cannot be read ({exc.strerror})") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:  # the file grew after fstat
            raise RefusedFile(path, f"more than the cap of {max_bytes:,} bytes")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return "not a plain file"
