"""The page's folder, written so that nothing planted in it can redirect a write.

Run and evaluation folders are shared; whoever can write into one can leave `view/index.html.tmp`
as a symlink to a file of the person who next writes the page, or make `view` itself a symlink.
Every write here goes through a descriptor of a folder the viewer made (or one of the user's own,
not a symlink), creates its temporary file exclusively without following links, and renames it
over the target, which replaces a link instead of writing through it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFolder(ValueError):
    pass


class OutFolder:
    """A folder opened once; names are written, checked and made relative to its descriptor."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path: Path, parent: OutFolder | None = None) -> OutFolder:
        """Make `path` (its parents too, for the top folder), or open it if it is the user's own
        folder and no symlink. Inside `parent`, `path` is a name checked against `parent`'s descriptor."""
        dir_fd = parent.fd if parent is not None else None
        name = path.name if parent is not None else path
        shown = parent.path / path.name if parent is not None else path
        if parent is None:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(name, 0o755, dir_fd=dir_fd)
        except FileExistsError:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                raise UnsafeFolder(
                    f"{shown}: a symlink; the viewer writes only into a folder of its own (remove it or pass --out)"
                ) from None
            if not stat.S_ISDIR(info.st_mode):
                raise UnsafeFolder(f"{shown}: exists and is not a folder (remove it or pass --out)") from None
            if info.st_uid != os.geteuid():
                raise UnsafeFolder(
                    f"{shown}: a folder of another user (uid {info.st_uid}); the viewer writes only into "
                    "a folder of its own (pass --out)"
                ) from None
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:  # swapped for a symlink since the check: ELOOP / ENOTDIR
            raise UnsafeFolder(f"{shown}: cannot be opened as a folder ({exc.strerror})") from None
        return cls(shown, fd)

    def write(self, name: str, data: bytes) -> None:
        """`name` replaced by `data` all at once: through `name.tmp`, created exclusively."""
        tmp = name + ".tmp"
        with contextlib.suppress(FileNotFoundError):  # a leftover or planted one: unlinking never follows a link
            os.unlink(tmp, dir_fd=self.fd)
        try:
            fd = os.open(tmp, _NEW_FILE_FLAGS, 0o644, dir_fd=self.fd)
        except FileExistsError:
            raise UnsafeFolder(
                f"{self.path / tmp}: made again by someone else while the page was written; not written"
            ) from None
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            os.unlink(tmp, dir_fd=self.fd)
            raise

    def has_file(self, name: str) -> bool:
        """A regular file (a link does not count: the page would show what it points to)."""
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return False

    def size(self, name: str) -> int:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_size if self.has_file(name) else 0

    def close(self) -> None:
        os.close(self.fd)
