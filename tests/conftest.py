"""Fixtures shared by several test modules."""

import numpy as np
import pytest

from executor.tools.base import ImageStore

HALVES_H, HALVES_W = 100, 200


@pytest.fixture()
def store():
    """An ImageStore holding one 200x100 image, left half red and right half blue: `(store, ref)`."""
    images = ImageStore()
    pixels = np.zeros((HALVES_H, HALVES_W, 3), dtype=np.uint8)
    pixels[:, : HALVES_W // 2, 0] = 255
    pixels[:, HALVES_W // 2 :, 2] = 255
    return images, images.add_array(pixels).ref
