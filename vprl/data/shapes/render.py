"""Drawing a scene with Pillow: grey background, shapes drawn in id order (later objects occlude
earlier ones), a random slight blur, then a brightness gradient and luminance noise over it all.
Each object's paint varies a little in hue, saturation and brightness, so that pixel tools meet
some of the trouble real images give them (soft edges, washed-out colours)."""

from __future__ import annotations

import colorsys
import io

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from vprl.data.shapes.scene import COLOR_HUES, Scene, polygon


def object_rgb(color: str, hue_jitter: float = 0.0, saturation: float = 0.9, value: float = 0.95):
    hue = ((COLOR_HUES[color] + hue_jitter) % 360) / 360
    r, g, b = colorsys.hsv_to_rgb(hue, saturation, value)
    return (int(r * 255), int(g * 255), int(b * 255))


def render(scene: Scene, rng: np.random.Generator, noise: float | None = None) -> np.ndarray:
    """(H, W, 3) uint8 pixels of the scene; `noise` is the grain's std (random 4-12 by default)."""
    im = Image.new("RGB", (scene.width, scene.height), (scene.background,) * 3)
    draw = ImageDraw.Draw(im)
    for o in scene.objects:
        fill = object_rgb(o.color, o.hue_jitter, float(rng.uniform(0.6, 1.0)), float(rng.uniform(0.65, 1.0)))
        if o.shape == "circle":
            draw.ellipse((o.cx - o.radius, o.cy - o.radius, o.cx + o.radius, o.cy + o.radius), fill=fill)
        else:
            draw.polygon(polygon(o.shape, o.cx, o.cy, o.radius, o.angle), fill=fill)
    blur = float(rng.uniform(0.0, 1.2))
    if blur > 0.3:
        im = im.filter(ImageFilter.GaussianBlur(blur))
    pixels = np.asarray(im, dtype=np.int16)
    # The same noise on all channels changes brightness, not hue, so the background stays grey.
    noise = float(rng.uniform(4, 12)) if noise is None else noise
    grain = rng.normal(0.0, noise, size=(scene.height, scene.width, 1))
    # A soft brightness gradient, so a single global threshold on value would not do.
    ramp = np.linspace(-12, 12, scene.width)[None, :, None] * rng.choice((-1, 1))
    return np.clip(pixels + grain + ramp, 0, 255).astype(np.uint8)


def png_bytes(pixels: np.ndarray, compress_level: int = 1) -> bytes:
    """PNG bytes of the pixels; the same pixels always give the same bytes."""
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()
