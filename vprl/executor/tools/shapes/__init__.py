"""The `shapes` tool backend: classical computer vision on the pixels of shapes-world images."""

from vprl.executor.tools.shapes.backend import ShapesBackend
from vprl.executor.tools.shapes.segmentation import Blob, classify, segment

__all__ = ["Blob", "ShapesBackend", "classify", "segment"]
