"""`detect`: open-vocabulary detection with GroundingDINO or OWLv2 on the call's crop.

The family comes from the checkpoint's `model_type`. Each distinct (region, noun) pair is one batch
row; calls that differ only in `threshold` share a row and are filtered afterwards. Boxes are
clipped to the crop and shifted into the whole image's top-left pixels (see `regions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vprl.data.boxes import nms
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolError, ToolUnavailable
from vprl.executor.tools.hf.loading import Placement, float_dtype, from_pretrained, input_device, model_type
from vprl.executor.tools.hf.regions import Region, chunks, crop_boxes_to_image, crop_pil, dedupe, region_of
from vprl.executor.tools.hf.settings import DetectSettings
from vprl.executor.tools.images import ImageStore

# Paper defaults per family: ViUniT uses GroundingDINO at 0.2/0.2, Stanić et al. OWLv2 at 0.1.
DEFAULT_BOX_THRESHOLD = {"grounding-dino": 0.2, "owlv2": 0.1, "owlvit": 0.1}


@dataclass
class Detector:
    family: str
    model: Any
    processor: Any


def load_detector(path: str, placement: Placement) -> Detector:
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    family = model_type(path)
    if family not in DEFAULT_BOX_THRESHOLD:
        raise ToolUnavailable(
            f"detect: {path!r} is a {family!r} model; supported families: {sorted(DEFAULT_BOX_THRESHOLD)}"
        )
    model = from_pretrained(AutoModelForZeroShotObjectDetection, path, placement)
    return Detector(family, model, AutoProcessor.from_pretrained(path))


def noun_of(call: ToolCall) -> str:
    noun = call.args.get("noun")
    if not isinstance(noun, str) or not noun.strip():
        raise ToolError("detect needs a non-empty `noun` string")
    return " ".join(noun.lower().split())


def threshold_of(call: ToolCall, settings: DetectSettings, family: str) -> float:
    value = call.args.get("threshold")
    if value is None:
        value = settings.box_threshold if settings.box_threshold is not None else DEFAULT_BOX_THRESHOLD[family]
    if not 0.0 <= float(value) <= 1.0:
        raise ToolError(f"detect: threshold must be in [0, 1], got {value}")
    return float(value)


def detect(det: Detector, settings: DetectSettings, calls: Sequence[ToolCall], images: ImageStore) -> list[Any]:
    regions = [region_of(call, images) for call in calls]
    nouns = [noun_of(call) for call in calls]
    thresholds = [threshold_of(call, settings, det.family) for call in calls]
    rows, row_of_call = dedupe(list(zip(regions, nouns)))
    # A shared row is post-processed at the lowest threshold any of its calls asked for.
    row_threshold = [1.0] * len(rows)
    for i, row in enumerate(row_of_call):
        row_threshold[row] = min(row_threshold[row], thresholds[i])

    raw: list[tuple[np.ndarray, np.ndarray]] = []
    for batch in chunks(list(range(len(rows))), settings.max_batch_size):
        raw.extend(
            run_batch(
                det,
                [rows[r][0] for r in batch],
                [rows[r][1] for r in batch],
                min(row_threshold[r] for r in batch),
                settings.text_threshold,
                images,
            )
        )
    results = []
    for i, row in enumerate(row_of_call):
        scores, boxes = raw[row]
        results.append(to_results(scores, boxes, regions[i], nouns[i], thresholds[i], settings.nms_iou))
    return results


def run_batch(
    det: Detector,
    regions: Sequence[Region],
    nouns: Sequence[str],
    threshold: float,
    text_threshold: float,
    images: ImageStore,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """One forward over (crop, noun) rows -> per row (scores, boxes in the crop's top-left pixels)."""
    import torch

    crops = [crop_pil(images, region) for region in regions]
    sizes = [(im.height, im.width) for im in crops]  # post-processing wants (height, width)
    if det.family == "grounding-dino":
        # GroundingDINO reads a lower-case phrase ending with "." per row.
        inputs = det.processor(images=crops, text=[f"{noun}." for noun in nouns], return_tensors="pt", padding=True)
    else:
        inputs = det.processor(images=crops, text=[[noun] for noun in nouns], return_tensors="pt", padding=True)
    inputs = inputs.to(input_device(det.model))
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(float_dtype(det.model))
    with torch.inference_mode():
        outputs = det.model(**inputs)
    return postprocess(det, outputs, inputs, sizes, threshold, text_threshold)


def postprocess(
    det: Detector, outputs: Any, inputs: Any, sizes: list[tuple[int, int]], threshold: float, text_threshold: float
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The processor's own post-processing (box format, OWLv2's square padding) -> numpy per row."""
    outputs.logits = outputs.logits.float()
    outputs.pred_boxes = outputs.pred_boxes.float()
    if det.family == "grounding-dino":
        processed = det.processor.post_process_grounded_object_detection(
            outputs, inputs["input_ids"], threshold=threshold, text_threshold=text_threshold, target_sizes=sizes
        )
    else:
        processed = det.processor.post_process_grounded_object_detection(
            outputs, threshold=threshold, target_sizes=sizes
        )
    return [(r["scores"].cpu().numpy(), r["boxes"].cpu().numpy()) for r in processed]


def to_results(
    scores: np.ndarray, boxes: np.ndarray, region: Region, label: str, threshold: float, nms_iou: float | None
) -> list[dict[str, Any]]:
    """Detections of one call: above `threshold`, inside the region, best first, in whole-image pixels."""
    keep = scores > threshold
    scores, boxes = scores[keep], crop_boxes_to_image(boxes[keep], region)
    # A box clipped to under one pixel would give the program an empty crop.
    valid = (boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1)
    scores, boxes = scores[valid], boxes[valid]
    order = nms(boxes, scores, nms_iou) if nms_iou is not None else list(np.argsort(-scores, kind="stable"))
    return [
        {"box": [round(float(v), 2) for v in boxes[i]], "score": round(float(scores[i]), 4), "label": label}
        for i in order
    ]
