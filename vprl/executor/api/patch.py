"""`ImagePatch`: the region of an image that generated programs reason about.

The docstrings of this module are shown to the LLM verbatim (the prompt is rendered from them), so
they are written for a code model: what each method answers, and a short usage example.

Coordinates everywhere are pixels of the original image with the origin at the bottom-left
corner (ViperGPT's convention, which the published example programs assume). A detector's
top-left box `(x0, y0, x1, y1)` becomes `left=x0, right=x1, lower=H-y1, upper=H-y0`, and the crop
of an (H, W) image is rows `H-upper:H-lower`, columns `left:right`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vprl.data.boxes import box_from_top_left, check_box, intersection
from vprl.executor.api.context import current_client
from vprl.executor.api.errors import expect_str, expect_str_list, unknown_attribute
from vprl.executor.api.language import llm_query
from vprl.executor.api.source import FrameSequence, SourceImage
from vprl.executor.limits import MAX_NAME


class ImagePatch:
    """A rectangular crop of an image, with methods that look at what is inside it.

    Coordinates are pixels of the original image, origin at the bottom-left corner: `left` and
    `right` are the horizontal borders (left < right), `lower` and `upper` the bottom and top
    borders (lower < upper). A larger `vertical_center` means higher up in the image.

    Attributes
    ----------
    cropped_image : array of shape (3, height, width)
        The pixels of the crop.
    left, lower, right, upper : int
        Borders of the crop in original-image coordinates.
    width, height : int
        Size of the crop in pixels.
    horizontal_center, vertical_center : float
        Centre of the crop in original-image coordinates.

    Methods
    -------
    find(object_name: str) -> list[ImagePatch]
    exists(object_name: str) -> bool
    verify_property(object_name: str, visual_property: str) -> bool
    best_text_match(option_list: list[str]) -> str
    simple_query(question: str = None) -> str
    compute_depth() -> float
    crop(left: int, lower: int, right: int, upper: int) -> ImagePatch
    overlaps_with(left: int, lower: int, right: int, upper: int) -> bool
    llm_query(question: str, long_answer: bool = True) -> str
    crop_left_of_bbox / crop_right_of_bbox / crop_above_bbox / crop_below_bbox(left, lower, right, upper) -> ImagePatch
    """

    def __init__(
        self, image, left: int = None, lower: int = None, right: int = None, upper: int = None, category: str = None
    ):
        """Make a patch of `image` with the given borders (original-image coordinates); with no
        borders the patch is the whole image.

        >>> image_patch = ImagePatch(image)
        >>> bottom_half = ImagePatch(image, 0, 0, image_patch.width, image_patch.height // 2)
        """
        if isinstance(image, FrameSequence):
            # ViperGPT's video examples write `ImagePatch(video_segment, i)` for "frame i".
            image = image.frame(0 if left is None else left)
            left = None
        elif isinstance(image, ImagePatch):
            if left is None and lower is None and right is None and upper is None:
                left, lower, right, upper = image.left, image.lower, image.right, image.upper
            category = category or image.category
            image = image._source
        elif not isinstance(image, SourceImage):
            image = SourceImage.from_array(image)
        self._source: SourceImage = image
        self._cropped: np.ndarray | None = None
        given = (left, lower, right, upper)
        if all(v is None for v in given):
            box = (0, 0, image.width, image.height)
        elif any(v is None for v in given):
            raise ValueError(
                f"ImagePatch needs all four borders or none, got left={left}, lower={lower}, "
                f"right={right}, upper={upper}"
            )
        else:
            box = check_box(tuple(_as_int("ImagePatch", v) for v in given), image.width, image.height)
        self.left, self.lower, self.right, self.upper = box
        self.width = self.right - self.left
        self.height = self.upper - self.lower
        self.horizontal_center = (self.left + self.right) / 2
        self.vertical_center = (self.lower + self.upper) / 2
        self.category = category

    @classmethod
    def from_bounding_box(cls, image, bounding_box: dict) -> ImagePatch:
        """Make a patch from `{"box": [left, lower, right, upper], "category": name}`."""
        return cls(image, *bounding_box["box"], category=bounding_box.get("category"))

    @property
    def area(self) -> int:
        """Area of the patch in pixels; use it to find the largest or smallest object.

        >>> # the largest car
        >>> largest_car = max(image_patch.find("car"), key=lambda car: car.area)
        """
        return self.width * self.height

    @property
    def cropped_image(self) -> np.ndarray:
        if self._cropped is None:
            pixels = self._source.pixels()
            rows = slice(self._source.height - self.upper, self._source.height - self.lower)
            self._cropped = np.ascontiguousarray(pixels[rows, self.left : self.right].transpose(2, 0, 1))
        return self._cropped

    def _tool(self, tool: str, **args: Any) -> Any:
        return current_client().call(tool, self._source.ref, self._box, args)

    def find(self, object_name: str) -> list[ImagePatch]:
        """Find every instance of an object in the patch and return one patch per instance, or
        an empty list when there is none. `object_name` is a short noun phrase such as "car" or
        "red ball".

        >>> # how many people are there?
        >>> image_patch = ImagePatch(image)
        >>> people = image_patch.find("person")
        >>> return str(len(people))
        """
        expect_str("find", "object_name", object_name)
        found = []
        for det in self._tool("detect", noun=object_name, threshold=None):
            box = self._clip_top_left(det["box"])
            if box is not None:
                found.append(ImagePatch(self._source, *box, category=det.get("label") or object_name))
        return found

    def exists(self, object_name: str) -> bool:
        """True if at least one instance of the object is in the patch.

        >>> # is there a dog?
        >>> return bool_to_yesno(ImagePatch(image).exists("dog"))
        """
        return len(self.find(object_name)) > 0

    def verify_property(self, object_name: str, visual_property: str) -> bool:
        """True if the object in the patch has the visual property (a colour, a material, a
        shape, ...). The object is assumed to be in the patch; it takes two arguments.

        >>> # is the cup made of glass?
        >>> cup_patch = ImagePatch(image).find("cup")[0]
        >>> return bool_to_yesno(cup_patch.verify_property("cup", "glass"))
        """
        expect_str("verify_property", "object_name", object_name)
        expect_str("verify_property", "visual_property", visual_property)
        return bool(self._tool("verify", object_name=object_name, property=visual_property))

    def best_text_match(self, option_list: list[str], prefix: str = None) -> str:
        """Return the option that best describes the patch. `prefix`, if given, is put before
        every option when matching (e.g. "a photo of").

        >>> # is the shirt blue or green?
        >>> shirt_patch = ImagePatch(image).find("shirt")[0]
        >>> return shirt_patch.best_text_match(["blue", "green"])
        """
        options = expect_str_list("best_text_match", "option_list", option_list)
        texts = [f"{prefix} {o}" if prefix else o for o in options]
        scores = self._tool("itm", texts=texts)
        return options[int(np.argmax(scores))]

    def simple_query(self, question: str = None) -> str:
        """Answer a simple question about the patch with a visual question answering model; with
        no question it answers "What is this?". Use it for perception, not for reasoning or
        outside knowledge.

        >>> # what colour is the car?
        >>> car_patch = ImagePatch(image).find("car")[0]
        >>> return car_patch.simple_query("What color is the car?")
        """
        question = "What is this?" if question is None else expect_str("simple_query", "question", question)
        return str(self._tool("vqa", question=question))

    def compute_depth(self) -> float:
        """Median depth of the patch: larger means farther from the camera.

        >>> # the person farthest away
        >>> people = ImagePatch(image).find("person")
        >>> farthest = sorted(people, key=lambda p: p.compute_depth())[-1]
        """
        return float(self._tool("depth"))

    def crop(self, left: int, lower: int, right: int, upper: int) -> ImagePatch:
        """A new patch for the given borders, in original-image coordinates like every other
        coordinate; the result is clipped to this patch.

        >>> # the upper half of the table
        >>> table = ImagePatch(image).find("table")[0]
        >>> top_half = table.crop(table.left, table.vertical_center, table.right, table.upper)
        """
        box = intersection([_as_int("crop", v) for v in (left, lower, right, upper)], self._box)
        if box is None:
            raise ValueError(
                f"crop (left={left}, lower={lower}, right={right}, upper={upper}) does not overlap the patch {self}"
            )
        return ImagePatch(self._source, *box)

    def overlaps_with(self, left: int, lower: int, right: int, upper: int) -> bool:
        """True if this patch overlaps the box with the given borders.

        >>> # is the cup on the table?
        >>> cup, table = image_patch.find("cup")[0], image_patch.find("table")[0]
        >>> return bool_to_yesno(cup.overlaps_with(table.left, table.lower, table.right, table.upper))
        """
        return self.left <= right and self.right >= left and self.lower <= upper and self.upper >= lower

    def llm_query(self, question: str, long_answer: bool = True) -> str:
        """Ask a language model a question that needs outside knowledge, not the image."""
        return llm_query(question, long_answer)

    def crop_left_of_bbox(self, left: int, lower: int, right: int, upper: int) -> ImagePatch:
        """The part of this patch to the left of the given box (all of its height).

        >>> # is there a cat left of the dog?
        >>> dog = image_patch.find("dog")[0]
        >>> left_part = image_patch.crop_left_of_bbox(dog.left, dog.lower, dog.right, dog.upper)
        >>> return bool_to_yesno(left_part.exists("cat"))
        """
        return self._strip(self.left, self.lower, left, self.upper)

    def crop_right_of_bbox(self, left: int, lower: int, right: int, upper: int) -> ImagePatch:
        """The part of this patch to the right of the given box (all of its height)."""
        return self._strip(right, self.lower, self.right, self.upper)

    def crop_above_bbox(self, left: int, lower: int, right: int, upper: int) -> ImagePatch:
        """The part of this patch above the given box (all of its width)."""
        return self._strip(self.left, upper, self.right, self.upper)

    def crop_below_bbox(self, left: int, lower: int, right: int, upper: int) -> ImagePatch:
        """The part of this patch below the given box (all of its width)."""
        return self._strip(self.left, self.lower, self.right, lower)

    def _strip(self, left, lower, right, upper) -> ImagePatch:
        # A box touching the border leaves nothing on that side; a 1-pixel strip keeps the call
        # valid so `find` simply returns nothing there (real detectors behave the same way).
        left, lower, right, upper = (_as_int("crop", v) for v in (left, lower, right, upper))
        left, right = max(self.left, min(left, self.right - 1)), min(self.right, max(right, self.left + 1))
        lower, upper = max(self.lower, min(lower, self.upper - 1)), min(self.upper, max(upper, self.lower + 1))
        if left >= right:
            left, right = (right - 1, right) if right > self.left else (left, left + 1)
        if lower >= upper:
            lower, upper = (upper - 1, upper) if upper > self.lower else (lower, lower + 1)
        return ImagePatch(self._source, left, lower, right, upper)

    def _clip_top_left(self, xyxy) -> tuple[int, int, int, int] | None:
        return intersection(box_from_top_left(*xyxy, height=self._source.height), self._box)

    @property
    def _box(self) -> tuple[int, int, int, int]:
        return (self.left, self.lower, self.right, self.upper)

    def __getattr__(self, name: str):
        # Only reached for names that do not exist: answer with the real ones nearby.
        if name.startswith("__"):
            raise AttributeError(name)
        raise unknown_attribute(
            "ImagePatch",
            name,
            [n for n in dir(type(self)) if not n.startswith("_")]
            + [
                "left",
                "lower",
                "right",
                "upper",
                "width",
                "height",
                "horizontal_center",
                "vertical_center",
                "category",
            ],
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImagePatch) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple:
        return (self._source.ref, *self._box)

    def __repr__(self) -> str:
        name = f"{self.category!r}, " if self.category else ""
        return f"ImagePatch({name}left={self.left}, lower={self.lower}, right={self.right}, upper={self.upper})"


def _as_int(method: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"{method}() expects pixel coordinates as numbers, got {type(value).__name__} {value!r:.{MAX_NAME}}"
        )
    if not np.isfinite(value):
        raise ValueError(f"{method}() got a non-finite coordinate {value!r}")
    return int(round(float(value)))
