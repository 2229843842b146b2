"""Programs written in the style of ViperGPT's benchmark prompts for GQA, OK-VQA and RefCOCO run
unchanged against the image API with the oracle (and the rule language model of
tests/vipergpt_world.py where they reach a language model), and give the answer a person gives
looking at the scene. The programs are ours, in each prompt's style: the GQA prompt's fallbacks to
the whole image, the OK-VQA prompt's guesses combined by `process_guesses`, the RefCOCO prompt's
patches, sorts, `best_image_match` with keywords, and `distance` of patches and of coordinates.
"""

from __future__ import annotations

import pytest
from vipergpt_world import expected, obj, run, scene

W, H = 640, 480

# -- the GQA prompt (prompts/benchmarks/gqa.prompt): fall back to the whole image, compare centres ----
GQA = {
    "right_of": (
        """
def execute_command(image)->str:
    image_patch = ImagePatch(image)
    girl_patches = image_patch.find("girl")
    # Question assumes one girl patch
    if len(girl_patches) == 0:
        # If no girl is found, query the image directly
        return image_patch.simple_query("Is there an umbrella to the right of the girl?")
    girl_patch = girl_patches[0]
    umbrella_patches = image_patch.find("umbrella")
    if len(umbrella_patches) == 0:
        return "no"
    for umbrella_patch in umbrella_patches:
        if umbrella_patch.horizontal_center > girl_patch.horizontal_center:
            return "yes"
    return "no"
""",
        scene(W, H, a=obj("girl", 300, 150, 80, 250), b=obj("umbrella", 80, 100, 120, 100)),
        "no",
    ),
    "which_part": (
        """
def execute_command(image)->str:
    image_patch = ImagePatch(image)
    cat_patches = image_patch.find("cat")
    # Question assumes only one cat patch
    if len(cat_patches) == 0:
        return image_patch.simple_query("In which part is the cat, the top or the bottom?")
    if cat_patches[0].vertical_center < image_patch.vertical_center:
        return "bottom"
    else:
        return "top"
""",
        scene(W, H, a=obj("cat", 300, 380, 80, 60)),
        "bottom",
    ),
    "ask_directly": (
        """
def execute_command(image)->str:
    # a relation (holding), so ask directly
    image_patch = ImagePatch(image)
    return image_patch.simple_query("What is the woman holding?")
""",
        scene(W, H, a=obj("woman", 200, 100, 120, 350, relations=[("holding", "b")]), b=obj("cup", 290, 250, 40, 50)),
        "cup",
    ),
    "either_exists": (
        """
def execute_command(image)->str:
    image_patch = ImagePatch(image)
    is_pear = image_patch.exists("pear")
    is_plum = image_patch.exists("plum")
    return bool_to_yesno(is_pear or is_plum)
""",
        scene(W, H, a=obj("plum", 200, 200, 40, 40)),
        "yes",
    ),
}

# -- the OK-VQA prompt (prompts/benchmarks/okvqa.prompt): guesses combined by process_guesses --------
OKVQA = {
    "direct": (
        """
def execute_command(image)->str:
    # The question is direct perception, so we can just ask the image
    image = ImagePatch(image)
    direct_guess = image.simple_query("What animal is this?")
    return direct_guess
""",
        scene(W, H, a=obj("giraffe", 200, 50, 200, 400)),
        "giraffe",
    ),
    "knowledge": (
        """
def execute_command(image)->str:
    # The question needs outside knowledge: first what the animal is
    image = ImagePatch(image)
    guesses = []
    animal = image.simple_query("What animal is this?")
    external_knowledge_query = "Where does a {} live in the wild?".format(animal)
    step_by_step_guess = llm_query(external_knowledge_query)
    guesses.append("the animal is {}".format(animal) + ", so " + step_by_step_guess)
    direct_guess = image.simple_query("Where does this animal live in the wild?")
    guesses.append(direct_guess)
    return process_guesses("Where does this animal live in the wild?", guesses)
""",
        scene(W, H, a=obj("giraffe", 200, 50, 200, 400)),
        "savanna",
    ),
}
OKVQA_FACTS = {"Where does a giraffe live in the wild?": "savanna", "Question: Where does this animal live": "savanna"}

# -- the RefCOCO prompt (prompts/benchmarks/refcoco.prompt): return the patch --------------------------
REFCOCO = {
    "front": (
        """
def execute_command(image) -> ImagePatch:
    # Return the sofa
    image_patch = ImagePatch(image)
    sofa_patches = image_patch.find("sofa")
    sofa_patches.sort(key=lambda sofa: sofa.compute_depth())
    sofa_patch = sofa_patches[0]
    # Remember: return the sofa
    return sofa_patch
""",
        scene(W, H, a=obj("sofa", 50, 150, 200, 100), b=obj("sofa", 300, 300, 250, 150)),
        {"object": "b"},
    ),
    "middle": (
        """
def execute_command(image) -> ImagePatch:
    # Return the horse
    image_patch = ImagePatch(image)
    horse_patches = image_patch.find("horse")
    if len(horse_patches) == 0:
        horse_patches = [image_patch]
    horse_patches.sort(key=lambda horse: horse.horizontal_center)
    # Remember: return the horse
    return horse_patches[len(horse_patches) // 2]  # Return the middle horse
""",
        scene(
            W,
            H,
            a=obj("horse", 20, 200, 150, 150),
            b=obj("horse", 240, 200, 150, 150),
            c=obj("horse", 460, 200, 150, 150),
        ),  # fmt: skip
        {"object": "b"},
    ),
    "keyword_best_image_match": (
        """
def execute_command(image) -> ImagePatch:
    # Return the umbrella
    image_patch = ImagePatch(image)
    umbrella_patches = image_patch.find("umbrella")
    if len(umbrella_patches) == 0:
        umbrella_patches = [image_patch]
    umbrella_patch = best_image_match(list_patches=umbrella_patches, content=["polka dot umbrella"])
    # Remember: return the umbrella
    return umbrella_patch
""",
        scene(
            W, H, a=obj("umbrella", 20, 100, 150, 100, ["polka dot"]), b=obj("umbrella", 300, 100, 150, 100, ["red"])
        ),
        {"object": "a"},
    ),
    "closest_to": (
        """
def execute_command(image) -> ImagePatch:
    # Return the cup
    image_patch = ImagePatch(image)
    laptop_patches = image_patch.find("laptop")
    laptop_patches.sort(key=lambda laptop: laptop.horizontal_center)
    leftmost_laptop = laptop_patches[0]  # First from the left
    cup_patches = image_patch.find("cup")
    cup_patches.sort(key=lambda cup: distance(cup, leftmost_laptop))
    # Remember: return the cup
    return cup_patches[0]
""",
        scene(
            W,
            H,
            a=obj("laptop", 20, 250, 150, 100),
            b=obj("laptop", 420, 250, 150, 100),
            c=obj("cup", 190, 300, 40, 50),
            d=obj("cup", 590, 300, 40, 50),
        ),  # fmt: skip
        {"object": "c"},
    ),
    "number_on_shirt": (
        """
def execute_command(image) -> ImagePatch:
    # Return the player
    image_patch = ImagePatch(image)
    player_patches = image_patch.find("player")
    for patch in player_patches:
        if patch.exists("23"):
            return patch
    # Remember: return the player
    return player_patches[0]
""",
        scene(
            W,
            H,
            a=obj("player", 40, 60, 200, 400),
            b=obj("player", 360, 60, 200, 400),
            c=obj("17", 110, 150, 40, 40),
            d=obj("23", 430, 150, 40, 40),
        ),  # fmt: skip
        {"object": "b"},
    ),
    "centre_distance": (
        """
def execute_command(image) -> ImagePatch:
    # Return the kite
    image_patch = ImagePatch(image)
    kite_patches = image_patch.find("kite")
    if len(kite_patches) == 0:
        kite_patches = [image_patch]
    elif len(kite_patches) == 1:
        return kite_patches[0]
    rightmost_coordinate = max([patch.horizontal_center for patch in kite_patches])
    kite_patches_right = [patch for patch in kite_patches if
                          distance(patch.horizontal_center, rightmost_coordinate) < 100]
    if len(kite_patches_right) == 0:
        kite_patches_right = kite_patches
    kite_patches_right.sort(key=lambda p: p.vertical_center)
    kite_patch = kite_patches_right[1]
    # Remember: return the kite
    return kite_patch
""",
        scene(
            W,
            H,
            a=obj("kite", 20, 40, 60, 60),
            b=obj("kite", 500, 40, 60, 60),
            c=obj("kite", 520, 200, 60, 60),
            d=obj("kite", 510, 380, 60, 60),
        ),  # fmt: skip
        {"object": "c"},  # the right-hand kites from the bottom: d, then c
    ),
}

PROMPT_FILES = {"gqa": (GQA, {}), "okvqa": (OKVQA, OKVQA_FACTS), "refcoco": (REFCOCO, {})}
CASES = [
    (f"{file}:{name}", *case, facts) for file, (cases, facts) in PROMPT_FILES.items() for name, case in cases.items()
]


@pytest.mark.parametrize(("name", "program", "graph", "answer", "facts"), CASES, ids=[c[0] for c in CASES])
def test_a_program_in_the_style_of_each_prompt_file_runs_unchanged(name, program, graph, answer, facts, tmp_path):
    outcome = run(program, {"img": graph}, tmp_path, facts=facts)
    assert outcome.status == "ok", f"{name}: {outcome.error}"
    assert outcome.answer == expected(graph, answer), name
