"""The page's pictures: one downscaled JPEG per distinct image, named by its content.

Rollouts of one question share its image (a group of G samples, every epoch), so a page of a few
thousand cards needs a few hundred pictures. A picture is named by the hash of the file's bytes:
the same image under two paths is written once, and a page written again into the same folder
reuses what is there instead of decoding every image anew.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

IMAGES_DIR = "images"


@dataclass(frozen=True)
class Picture:
    src: str  # relative to the page
    width: int  # of the original image: boxes are in its pixels
    height: int

    def to_json(self) -> dict[str, object]:
        return {"src": self.src, "w": self.width, "h": self.height}


class Pictures:
    """Image path -> index into `table`, thumbnails written on first use."""

    def __init__(self, out: Path, max_side: int = 384, quality: int = 80):
        self.dir = out / IMAGES_DIR
        self.max_side = max_side
        self.quality = quality
        self.table: list[Picture] = []
        self._by_path: dict[str, int | None] = {}
        self._by_hash: dict[str, int] = {}
        self.missing: list[str] = []  # paths that could not be read as pictures (videos, deleted files)

    def index(self, path: str) -> int | None:
        """The picture of an image file; None when it cannot be read (the page says so)."""
        if path in self._by_path:
            return self._by_path[path]
        found = self._add(path)
        self._by_path[path] = found
        return found

    def size(self, index: int | None) -> tuple[int, int] | None:
        return None if index is None else (self.table[index].width, self.table[index].height)

    def _add(self, path: str) -> int | None:
        try:
            data = Path(path).read_bytes()
        except OSError:
            self.missing.append(path)
            return None
        digest = hashlib.sha1(data).hexdigest()[:20]
        if digest in self._by_hash:
            return self._by_hash[digest]
        name = f"{digest}.jpg"
        target = self.dir / name
        try:
            with Image.open(path) as im:
                width, height = im.size
                if not target.is_file():
                    self._write(im, target)
        except (UnidentifiedImageError, OSError, ValueError):
            self.missing.append(path)
            return None
        self.table.append(Picture(f"{IMAGES_DIR}/{name}", width, height))
        self._by_hash[digest] = len(self.table) - 1
        return len(self.table) - 1

    def _write(self, im: Image.Image, target: Path) -> None:
        im.draft("RGB", (self.max_side, self.max_side))  # JPEG: decode at a reduced scale, much faster
        small = im.convert("RGB")
        small.thumbnail((self.max_side, self.max_side), Image.Resampling.LANCZOS)
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        small.save(tmp, format="JPEG", quality=self.quality, optimize=True)
        os.replace(tmp, target)
