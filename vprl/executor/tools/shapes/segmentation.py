"""Classical vision for the shapes world: find coloured shapes in pixels, with no annotations.

1. Colour segmentation in HSV: saturated, bright-enough pixels are foreground (the background
   is grey); each is given the nearest hue of the colour vocabulary.
2. Connected components per colour; tiny ones are noise.
3. Shape from contour features: solidity (area / convex hull area) separates the star (concave)
   from the convex shapes; the fill of the minimum enclosing circle (area / circle area) orders
   the convex ones: circle ~0.95, hexagon ~0.83, square ~0.64, triangle ~0.41; a coarse polygon
   fit with three corners also says triangle.
4. Size from the enclosing circle's radius against a threshold scaled with the image.

Occluded shapes lose area and get mislabelled, touching shapes of one colour merge: it is a real
(imperfect) tool, and `bench/shapes_tools.py` measures how imperfect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from vprl.data.shapes.scene import COLOR_HUES

MIN_SATURATION = 100  # of 255; the grey background with luminance noise stays far below
MIN_VALUE = 50
MIN_AREA = 24  # pixels at 256 px; smaller components are noise or slivers of occluded shapes
SIZE_RADIUS = 17.5  # enclosing-circle radius between the small and large classes, at 256 px


@dataclass(frozen=True)
class Blob:
    """One detected shape; the box is top-left `(x0, y0, x1, y1)`, x1/y1 exclusive."""

    x0: int
    y0: int
    x1: int
    y1: int
    color: str
    shape: str
    size: str
    score: float


def _hue_table() -> tuple[np.ndarray, tuple[str, ...]]:
    """Nearest vocabulary colour for each OpenCV full-range hue value (0-255)."""
    names = tuple(COLOR_HUES)
    centres = np.array([COLOR_HUES[n] for n in names], dtype=np.float64)
    hues = np.arange(256) * 360.0 / 256
    diff = np.abs(hues[:, None] - centres[None, :])
    diff = np.minimum(diff, 360 - diff)
    return np.argmin(diff, axis=1).astype(np.int16), names


_HUE_LUT, _COLOR_NAMES = _hue_table()


def classify(area: float, hull_area: float, radius: float, corners: int = 0) -> tuple[str, float]:
    """Shape name and a confidence from contour features (`corners`: vertices of a coarse
    polygon fit, 0 if unknown)."""
    solidity = area / hull_area if hull_area > 0 else 0.0
    fill = area / (math.pi * radius * radius) if radius > 0 else 0.0
    if solidity < 0.82:
        return "star", min(1.0, (0.82 - solidity) * 5 + 0.5)
    if corners == 3:  # blur rounds a small triangle's corners and raises its fill towards a square's
        return "triangle", 0.8
    # Boundaries halfway between the ideal fills of neighbouring shapes.
    for name, low, ideal in (("circle", 0.89, 0.95), ("hexagon", 0.73, 0.83), ("square", 0.52, 0.64)):
        if fill >= low:
            return name, max(0.3, 1.0 - abs(fill - ideal) * 3)
    return "triangle", max(0.3, 1.0 - abs(fill - 0.41) * 3)


def segment(pixels: np.ndarray) -> list[Blob]:
    """Every shape found in an (H, W, 3) uint8 RGB image, left to right."""
    height, width = pixels.shape[:2]
    scale = min(width, height) / 256
    hsv = cv2.cvtColor(np.ascontiguousarray(pixels), cv2.COLOR_RGB2HSV_FULL)
    fg = (hsv[..., 1] >= MIN_SATURATION) & (hsv[..., 2] >= MIN_VALUE)
    labels = np.where(fg, _HUE_LUT[hsv[..., 0]], -1)
    min_area = max(4, MIN_AREA * scale * scale)
    blobs: list[Blob] = []
    for ci in np.unique(labels):
        if ci < 0:
            continue
        mask = (labels == ci).astype(np.uint8)
        n, comp, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
        for k in range(1, n):
            x, y, w, h, area = (int(v) for v in stats[k])
            if area < min_area:
                continue
            crop = (comp[y : y + h, x : x + w] == k).astype(np.uint8)
            contours, _ = cv2.findContours(crop, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
            contour = max(contours, key=cv2.contourArea)
            hull_area = cv2.contourArea(cv2.convexHull(contour)) + 0.5 * cv2.arcLength(contour, True)
            # The enclosing circle of the pixel centres misses half a pixel all round.
            radius = cv2.minEnclosingCircle(contour)[1] + 0.5
            corners = len(cv2.approxPolyDP(contour, 0.08 * cv2.arcLength(contour, True), True))
            shape, score = classify(area, hull_area, radius, corners)
            size = "large" if radius >= SIZE_RADIUS * scale else "small"
            blobs.append(Blob(x, y, x + w, y + h, _COLOR_NAMES[int(ci)], shape, size, round(score, 3)))
    return sorted(blobs, key=lambda b: (b.x0, b.y0))
