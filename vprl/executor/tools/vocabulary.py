"""The attribute words of the shapes world and the rewards (colours, sizes, materials, generic nouns), once.

Each list holds one spelling per meaning; the other spellings and synonyms a text may use map onto
it (`SYNONYMS`). The shapes world's palette and sizes (`vprl.data.shapes.scene`) are its own, drawn from
these words. What the oracle reads as a colour, material, shape or size in a scene graph is the
wider GQA vocabulary of `vprl/executor/tools/lexicon.yaml`.
"""

from __future__ import annotations

# The basic colour terms and the shapes world's cyan and magenta. The order breaks ties in the
# opposite search (vprl.rewards.verifiers.opposites): reordering can change a colour's opposite.
COLORS = (
    "red",
    "green",
    "blue",
    "yellow",
    "purple",
    "orange",
    "cyan",
    "magenta",
    "white",
    "black",
    "gray",
    "brown",
    "pink",
)
MATERIALS = ("wood", "metal", "glass", "plastic", "rubber", "fabric", "stone", "paper")
SIZE_SYNONYMS = {"big": "large", "huge": "large", "tiny": "small", "little": "small"}
SYNONYMS = {"grey": "gray", "wooden": "wood", "metallic": "metal", **SIZE_SYNONYMS}
# Nouns that name no kind of object ("the red object"); plurals are these plus "s".
GENERIC_NOUNS = ("object", "thing", "shape", "item")
