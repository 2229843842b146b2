"""The page's pictures: one downscaled JPEG per distinct image, named by its content.

Rollouts of one question share its image (a group of G samples, every epoch), so a page of a few
thousand cards needs a few hundred pictures. A picture is named by the hash of the file's bytes:
the same image under two paths is written once, and a page written again into the same folder
reuses what is there instead of decoding every image anew.

Image paths come from rows anyone with access to the folder could have written: a path is read only
as a regular file under the run (or evaluation) folder or a dataset root its recipe names, capped
in size and opened without blocking (`vprl.data.safe_files`); a refused one gets a placeholder that
says why, and is never copied.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from vprl.data.safe_files import MAX_IMAGE_BYTES, RefusedFile, open_image_file
from vprl.train.view.out_folder import OutFolder

IMAGES_DIR = "images"


@dataclass(frozen=True)
class Picture:
    src: str  # relative to the page
    width: int  # of the original image: boxes are in its pixels
    height: int

    def to_json(self) -> dict[str, object]:
        return {"src": self.src, "w": self.width, "h": self.height}


class Pictures:
    """Image path -> index into `table`, thumbnails written on first use.

    `base` is the folder relative paths are taken from (the run's, not the working directory);
    `roots` the folders images may be read from (`allow` adds the dataset roots once known)."""

    def __init__(
        self,
        out: OutFolder,
        base: Path,
        max_side: int = 384,
        quality: int = 80,
        max_bytes: int = MAX_IMAGE_BYTES,
    ):
        self.base = base
        self.roots: list[str] = [str(base)]
        self.max_side = max_side
        self.quality = quality
        self.max_bytes = max_bytes
        self.table: list[Picture] = []
        self._by_path: dict[str, int | None] = {}
        self._by_hash: dict[str, int] = {}
        self.dir = OutFolder.open(Path(IMAGES_DIR), parent=out)
        self.missing: list[str] = []  # paths that could not be read as pictures (videos, deleted files)
        self.refused: dict[str, str] = {}  # path -> why it was not read at all (naming the path)

    def allow(self, *roots: str | os.PathLike[str] | None) -> None:
        self.roots += [os.fspath(r) for r in roots if r]

    def index(self, path: str) -> int | None:
        """The picture of an image file; None when it cannot be read (the page says so)."""
        if path in self._by_path:
            return self._by_path[path]
        found = self._add(path)
        self._by_path[path] = found
        return found

    def problem(self, path: object) -> str | None:
        """Why the picture of `path` is missing, for its placeholder; None when it is there."""
        if not isinstance(path, str):
            return None
        if path in self.refused:
            return "refused: " + self.refused[path]
        return "could not be read as a picture" if path in self.missing else None

    def size(self, index: int | None) -> tuple[int, int] | None:
        return None if index is None else (self.table[index].width, self.table[index].height)

    def _add(self, path: str) -> int | None:
        try:
            data = open_image_file(path, self.roots, self.max_bytes, base=self.base)
        except RefusedFile as exc:
            self.refused[path] = str(exc)
            return None
        digest = hashlib.sha1(data).hexdigest()[:20]
        if digest in self._by_hash:
            return self._by_hash[digest]
        name = f"{digest}.jpg"
        try:
            with Image.open(io.BytesIO(data)) as im:
                width, height = im.size
                if not self.dir.has_file(name):
                    self._write(im, name)
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError):
            self.missing.append(path)
            return None
        self.table.append(Picture(f"{IMAGES_DIR}/{name}", width, height))
        self._by_hash[digest] = len(self.table) - 1
        return len(self.table) - 1

    def _write(self, im: Image.Image, name: str) -> None:
        im.draft("RGB", (self.max_side, self.max_side))  # JPEG: decode at a reduced scale, much faster
        small = im.convert("RGB")
        small.thumbnail((self.max_side, self.max_side), Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        small.save(buf, format="JPEG", quality=self.quality, optimize=True)
        self.dir.write(name, buf.getvalue())

    def written_bytes(self) -> int:
        return sum(self.dir.size(p.src.rsplit("/", 1)[1]) for p in self.table)

    def close(self) -> None:
        self.dir.close()
