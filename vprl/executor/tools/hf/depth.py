"""`depth`: median depth of a region, larger = farther, from DPT or Depth-Anything.

The model runs on the *whole* image and the region's median is taken from that map (as ViperGPT's
implementation does), because relative depth models have a per-image unknown scale and shift:
medians from separately processed crops would not be comparable. Calls on one image therefore
share one forward, and the last `map_cache` maps are kept.

DPT, MiDaS and Depth-Anything (relative) output relative inverse depth (disparity, larger =
closer, defined up to scale and shift, so it may be <= 0 and 1/d is unusable). We report
`max(d over the image) - d`: monotone, >= 0, larger = farther, 0 at the nearest pixel. Values are
comparable between regions of one image only. Metric checkpoints (`output: depth`) are used as is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolUnavailable
from vprl.executor.tools.hf.loading import Placement, float_dtype, from_pretrained, input_device, model_type
from vprl.executor.tools.hf.regions import chunks, crop, region_of
from vprl.executor.tools.hf.settings import DepthSettings
from vprl.executor.tools.images import ImageStore

FAMILIES = ("dpt", "depth_anything")


@dataclass
class DepthModel:
    model: Any
    processor: Any
    maps: OrderedDict[str, np.ndarray] = field(default_factory=OrderedDict)  # image ref -> (H, W) depth


def load_depth(path: str, placement: Placement) -> DepthModel:
    from transformers import AutoImageProcessor, AutoModelForDepthEstimation

    family = model_type(path)
    if family not in FAMILIES:
        raise ToolUnavailable(f"depth: {path!r} is a {family!r} model; supported families: {list(FAMILIES)}")
    return DepthModel(
        from_pretrained(AutoModelForDepthEstimation, path, placement), AutoImageProcessor.from_pretrained(path)
    )


def to_depth(prediction: np.ndarray, output: str) -> np.ndarray:
    """Model output -> depth with larger = farther (see the module docstring)."""
    prediction = prediction.astype(np.float32)
    return prediction.max() - prediction if output == "disparity" else prediction


def depth(dm: DepthModel, settings: DepthSettings, calls: Sequence[ToolCall], images: ImageStore) -> list[float]:
    regions = [region_of(call, images) for call in calls]
    missing = list(dict.fromkeys(r.image for r in regions if r.image not in dm.maps))
    for batch in chunks(missing, settings.max_batch_size):
        for ref, raw in zip(batch, predict(dm, [images.get(ref).load_pixels() for ref in batch])):
            dm.maps[ref] = to_depth(raw, settings.output)
    results = []
    for region in regions:
        dm.maps.move_to_end(region.image)
        results.append(round(float(np.median(crop(dm.maps[region.image], region))), 6))
    while len(dm.maps) > max(settings.map_cache, 0):
        dm.maps.popitem(last=False)
    return results


def predict(dm: DepthModel, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Raw model output at each image's own resolution.

    Images are preprocessed one by one and batched by preprocessed shape: processors that keep the
    aspect ratio (Depth-Anything) give different shapes that cannot share a tensor.
    """
    import torch
    from PIL import Image

    pils = [Image.fromarray(np.ascontiguousarray(a)) for a in arrays]
    pixels = [dm.processor(images=im, return_tensors="pt")["pixel_values"] for im in pils]
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(pixels):
        by_shape.setdefault(tuple(p.shape), []).append(i)
    out: list[np.ndarray | None] = [None] * len(arrays)
    for idx in by_shape.values():
        batch = torch.cat([pixels[i] for i in idx]).to(input_device(dm.model), float_dtype(dm.model))
        with torch.inference_mode():
            outputs = dm.model(pixel_values=batch)
        outputs.predicted_depth = outputs.predicted_depth.float()
        sizes = [(pils[i].height, pils[i].width) for i in idx]
        processed = dm.processor.post_process_depth_estimation(outputs, target_sizes=sizes)
        for i, result in zip(idx, processed):
            out[i] = result["predicted_depth"].cpu().numpy()
    return out  # type: ignore[return-value]
