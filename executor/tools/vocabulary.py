"""The attribute words that tools and rewards know (colours, sizes, materials, generic nouns), once.

Each list holds one spelling per meaning; the other spellings and synonyms a text may use map onto
it (`SYNONYMS`), and the `*_WORDS` lists are everything read as that kind of attribute. The shapes
world's palette and sizes (`data.shapes.scene`) are its own, drawn from these words.
"""

from __future__ import annotations

# The basic colour terms and the shapes world's cyan and magenta. The order breaks ties in the
# opposite search (rewards.verifiers.opposites): reordering can change a colour's opposite.
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
# What counts as an attribute of each kind in a question or a scene graph: the words above, their
# other spellings, and words with no opposite to search (teal is a shade; medium sits in between).
COLOR_WORDS = (*COLORS, "grey", "teal")
MATERIAL_WORDS = (*MATERIALS, "wooden", "metallic")
SIZE_WORDS = ("small", "large", *SIZE_SYNONYMS, "medium")
# Nouns that name no kind of object ("the red object"); plurals are these plus "s".
GENERIC_NOUNS = ("object", "thing", "shape", "item")
