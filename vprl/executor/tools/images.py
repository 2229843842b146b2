"""The image store: images by content hash, shared by the API side and the tool backends.

Dataset images are registered once and kept; images a program builds live while their owner
holds them (see `ImageStore`). A call names its image by the hash, so calls and cache keys stay
plain JSON.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vprl.data.safe_files import RefusedFile, open_image_file
from vprl.executor.tools.errors import ToolUnavailable


@dataclass
class ImageInfo:
    """What a backend may know about an image: where its pixels are and which scene it shows."""

    ref: str
    width: int
    height: int
    path: str | None = None
    image_id: str | None = None  # the dataset's id (GQA imageId, COCO id), for annotation lookups
    pixels: Any = None  # numpy (H, W, 3) uint8, loaded lazily

    def load_pixels(self):
        if self.pixels is None:
            if self.path is None:
                raise ToolUnavailable(f"image {self.ref} has neither pixels nor a path")
            self.pixels = load_rgb(self.path)
        return self.pixels


def read_image_file(path: str | Path) -> bytes:
    """An image file's bytes, read only if it is a regular file under the size cap, opened without
    blocking: a dataset row may name a FIFO (an open would hang the reward call) or a device
    (`/dev/zero` never ends). `RefusedFile` (a ValueError) names the path and the reason. Dataset
    images live anywhere on the machine, so no folder is ruled out; a relative path is the working
    directory's, as the loaders give it."""
    return open_image_file(path, roots=[os.sep], base=os.getcwd())


def _opened(data: bytes, path: str | Path):
    from PIL import Image

    try:
        return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:  # an Exception, not an OSError: the trainer would see it
        raise RefusedFile(path, f"not an image to decode ({exc})") from None


def load_rgb(path: str | Path):
    """Read an image file as a (H, W, 3) uint8 numpy array."""
    import numpy as np

    with _opened(read_image_file(path), path) as im:
        return np.asarray(im.convert("RGB"))


def bytes_ref(data: bytes) -> str:
    """Content hash of an image file's bytes: the cache key part that names the image."""
    return hashlib.sha1(data).hexdigest()[:20]


def array_ref(pixels) -> str:
    """Content hash of a pixel array (for images that programs build themselves)."""
    h = hashlib.sha1(str(pixels.shape).encode())
    h.update(pixels.tobytes())
    return h.hexdigest()[:20]


class ImageStore:
    """Maps content hashes to `ImageInfo`; shared by the API side and the backends.

    Dataset images (`add_file`, `add_array` without an owner, `add`) stay for the store's life.
    Images a *program* builds are registered with an owner (`add_array(pixels, owner=task)`) and
    live only while an owner holds them: `release(owner)` (the runner calls it when the program's
    result is in) drops the owner's claims and evicts every image no one holds any more, unless a
    tool call on it is still queued or running (`pin`/`unpin`; it goes when the call is done). As
    a backstop against callers that never release, at most `max_program_images` program images and
    `max_program_bytes` of their pixels are kept; past that the least recently used one goes.
    """

    def __init__(self, max_program_images: int = 4096, max_program_bytes: int = 2 << 30) -> None:
        self._by_ref: dict[str, ImageInfo] = {}
        self.max_program_images = max_program_images
        self.max_program_bytes = max_program_bytes
        self._program_bytes = 0
        self._holders: OrderedDict[str, set[Hashable]] = OrderedDict()  # program images, least recently used first
        self._held: dict[Hashable, set[str]] = {}  # owner -> refs
        self._pins: dict[str, int] = {}

    def add_file(self, path: str | Path, image_id: str | None = None) -> ImageInfo:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist")
        data = read_image_file(path)
        ref = bytes_ref(data)
        if ref not in self._by_ref:
            with _opened(data, path) as im:
                width, height = im.size
            self._by_ref[ref] = ImageInfo(ref, width, height, str(path), image_id or path.stem)
        self._keep(ref)
        return self._by_ref[ref]

    def add_array(self, pixels, image_id: str | None = None, owner: Hashable | None = None) -> ImageInfo:
        ref = array_ref(pixels)
        known = ref in self._by_ref
        if not known:
            height, width = pixels.shape[:2]
            self._by_ref[ref] = ImageInfo(ref, width, height, None, image_id, pixels)
        if owner is None:
            self._keep(ref)
        elif not known or ref in self._holders:  # a dataset image stays a dataset image
            if ref not in self._holders:
                self._holders[ref] = set()
                self._program_bytes += _nbytes(self._by_ref[ref])
            self._holders[ref].add(owner)
            self._holders.move_to_end(ref)
            self._held.setdefault(owner, set()).add(ref)
            while len(self._holders) > 1 and (
                len(self._holders) > self.max_program_images or self._program_bytes > self.max_program_bytes
            ):
                self._evict(next(iter(self._holders)))
        return self._by_ref[ref]

    def add(self, info: ImageInfo) -> ImageInfo:
        info = self._by_ref.setdefault(info.ref, info)
        self._keep(info.ref)
        return info

    def get(self, ref: str) -> ImageInfo:
        try:
            info = self._by_ref[ref]
        except KeyError:
            raise ToolUnavailable(f"unknown image {ref}: it was never registered with the tool host") from None
        if ref in self._holders:
            self._holders.move_to_end(ref)
        return info

    def __contains__(self, ref: str) -> bool:
        return ref in self._by_ref

    def forget(self, ref: str) -> None:
        """Drop an image whatever registered it (a cache of images someone else holds, like a
        served tool's, bounds its memory this way)."""
        self._pins.pop(ref, None)
        self._evict(ref)

    def __len__(self) -> int:
        return len(self._by_ref)

    # -- images programs build -------------------------------------------------------------------
    def program_built(self, ref: str) -> bool:
        """Whether `ref` is an image only programs registered (not a dataset image)."""
        return ref in self._holders

    def owned_bytes(self, owner: Hashable) -> int:
        """Pixel bytes of the program images `owner` holds."""
        return sum(_nbytes(self._by_ref[ref]) for ref in self._held.get(owner, ()) if ref in self._by_ref)

    def release(self, owner: Hashable) -> list[str]:
        """Drop `owner`'s claims; returns the refs evicted now (pinned ones go at their `unpin`)."""
        evicted = []
        for ref in self._held.pop(owner, ()):
            holders = self._holders.get(ref)
            if holders is None:
                continue
            holders.discard(owner)
            if not holders and not self._pins.get(ref):
                self._evict(ref)
                evicted.append(ref)
        return evicted

    def pin(self, ref: str) -> None:
        """Keep `ref` while a tool call on it is queued or running."""
        self._pins[ref] = self._pins.get(ref, 0) + 1

    def unpin(self, ref: str) -> None:
        left = self._pins.get(ref, 0) - 1
        if left > 0:
            self._pins[ref] = left
            return
        self._pins.pop(ref, None)
        if ref in self._holders and not self._holders[ref]:
            self._evict(ref)

    def _keep(self, ref: str) -> None:
        """`ref` is (also) a dataset image: never evict it."""
        self._untrack(ref)

    def _evict(self, ref: str) -> None:
        self._untrack(ref)
        self._by_ref.pop(ref, None)

    def _untrack(self, ref: str) -> None:
        if ref not in self._holders:
            return
        for owner in self._holders.pop(ref):
            self._held.get(owner, set()).discard(ref)
        self._program_bytes -= _nbytes(self._by_ref[ref])


def _nbytes(info: ImageInfo) -> int:
    return int(getattr(info.pixels, "nbytes", 0) or info.width * info.height * 3)
