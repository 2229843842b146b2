"""`SourceImage`: the handle a program receives as `image` (content hash, size, lazy pixels)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vprl.executor.api.context import current_client


@dataclass(frozen=True)
class SourceImage:
    """An image known to the tool host. Pixels are fetched on first use, never sent eagerly."""

    ref: str
    width: int
    height: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """(channels, height, width), the layout ViperGPT programs expect of `image`."""
        return (3, self.height, self.width)

    def pixels(self) -> np.ndarray:
        """(H, W, 3) uint8 pixels, top row first."""
        return current_client().pixels(self.ref)

    @classmethod
    def from_array(cls, array) -> SourceImage:
        """Register an array a program built (C, H, W) or (H, W, C) as a new image."""
        pixels = to_hwc_uint8(array)
        ref, width, height = current_client().register_pixels(pixels)
        return cls(ref, width, height)


class FrameSequence:
    """What `ImagePatch(x, i)` takes as frame `i` of `x` (a video segment, in ViperGPT's examples)."""

    def frame(self, index: int) -> SourceImage:
        raise NotImplementedError


def to_hwc_uint8(array) -> np.ndarray:
    """Accept (C, H, W) or (H, W, C) arrays, floats in [0, 1] or ints in [0, 255], or PIL images."""
    if hasattr(array, "convert") and hasattr(array, "size"):  # PIL.Image
        array = np.asarray(array.convert("RGB"))
    arr = np.asarray(array)
    if arr.ndim == 2:
        arr = np.stack([arr] * 3, axis=-1)
    if arr.ndim != 3:
        raise ValueError(f"an image must have 2 or 3 dimensions, got shape {arr.shape}")
    if arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3):
        arr = np.transpose(arr, (1, 2, 0))
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    if arr.dtype != np.uint8:
        scale = 255.0 if arr.size and float(np.nanmax(arr)) <= 1.0 else 1.0
        arr = np.clip(np.nan_to_num(arr.astype(np.float64) * scale), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(arr)
