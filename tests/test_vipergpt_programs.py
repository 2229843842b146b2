"""Programs written in the style of ViperGPT's API prompt and chat API prompt run unchanged against
the image API with the oracle, and give the answer a person gives looking at the scene.

The programs are ours, not copies: each uses the constructs its prompt file teaches (the call forms,
keyword arguments, helpers and return types), so a construct the runtime lacks fails here. The
benchmark prompts' programs (GQA, OK-VQA, RefCOCO) are in tests/test_vipergpt_benchmarks.py, the
video ones (the API prompt's and the NExT-QA prompt's) in tests/test_vipergpt_video.py.
"""

from __future__ import annotations

import pytest
from vipergpt_world import expected, obj, run, scene

W, H = 640, 480

# -- the API prompt (prompts/api.prompt): ImagePatch methods as its docstrings use them ---------------
API = {
    "find_all": (
        """
def execute_command(image) -> List[ImagePatch]:
    image_patch = ImagePatch(image)
    mug_patches = image_patch.find("mug")
    return mug_patches
""",
        scene(W, H, a=obj("mug", 40, 300, 60, 60), b=obj("mug", 400, 280, 60, 60), c=obj("table", 0, 340, 640, 140)),
        {"objects": ["a", "b"]},
    ),
    "exists_both": (
        """
def execute_command(image)->str:
    image_patch = ImagePatch(image)
    is_fork = image_patch.exists("fork")
    is_knife = image_patch.exists("knife")
    return bool_to_yesno(is_fork and is_knife)
""",
        scene(W, H, a=obj("fork", 100, 300, 20, 80), b=obj("spoon", 200, 300, 20, 80)),
        "no",
    ),
    "verify_property": (
        """
def execute_command(image) -> str:
    image_patch = ImagePatch(image)
    kettle_patches = image_patch.find("kettle")
    # Question assumes only one kettle patch
    return bool_to_yesno(kettle_patches[0].verify_property("kettle", "red"))
""",
        scene(W, H, a=obj("kettle", 200, 200, 100, 100, ["red", "metal"])),
        "yes",
    ),
    "best_text_match": (
        """
def execute_command(image)->str:
    image_patch = ImagePatch(image)
    bench_patches = image_patch.find("bench")
    # Question assumes one bench patch
    return bench_patches[0].best_text_match(["metal", "wooden"])
""",
        scene(W, H, a=obj("bench", 100, 250, 300, 120, ["wooden", "brown"])),
        "wooden",
    ),
    "sorted_simple_query": (
        """
def execute_command(image) -> str:
    image_patch = ImagePatch(image)
    car_patches = image_patch.find("car")
    car_patches.sort(key=lambda x: x.horizontal_center)
    car_patch = car_patches[1]
    return car_patch.simple_query("What color is the car?")
""",
        scene(
            W,
            H,
            a=obj("car", 20, 300, 150, 80, ["red"]),
            b=obj("car", 250, 300, 150, 80, ["blue"]),
            c=obj("car", 460, 300, 150, 80, ["white"]),
        ),  # fmt: skip
        "blue",
    ),
    "compute_depth": (
        """
def execute_command(image)->ImagePatch:
    image_patch = ImagePatch(image)
    bottle_patches = image_patch.find("bottle")
    bottle_patches.sort(key=lambda bottle: bottle.compute_depth())
    return bottle_patches[-1]
""",
        # the ground-plane cue: the bottle whose bottom edge is higher in the picture is farther away
        scene(W, H, a=obj("bottle", 100, 350, 40, 100), b=obj("bottle", 300, 150, 30, 70)),
        {"object": "b"},
    ),
    "crop_half": (
        """
def execute_command(image)->str:
    image_patch = ImagePatch(image)
    tree_patch = image_patch.find("tree")[0]
    top_half = tree_patch.crop(tree_patch.left, tree_patch.vertical_center, tree_patch.right, tree_patch.upper)
    return bool_to_yesno(top_half.exists("bird"))
""",
        scene(W, H, a=obj("tree", 100, 40, 300, 400), b=obj("bird", 200, 80, 40, 30)),
        "yes",
    ),
    "overlaps_with": (
        """
def execute_command(image) -> ImagePatch:
    image_patch = ImagePatch(image)
    desk_patch = image_patch.find("desk")[0]
    lamp_patches = image_patch.find("lamp")
    for lamp in lamp_patches:
        if lamp.overlaps_with(desk_patch.left, desk_patch.lower, desk_patch.right, desk_patch.upper):
            return lamp
    return lamp_patches[0]
""",
        scene(
            W, H, a=obj("lamp", 20, 20, 60, 80), b=obj("lamp", 300, 200, 60, 120), c=obj("desk", 250, 300, 300, 150)
        ),
        {"object": "b"},
    ),
    "llm_query_method": (
        """
def execute_command(image) -> str:
    image_patch = ImagePatch(image)
    statue_patches = image_patch.find("statue")
    statue_patch = statue_patches[0]
    statue_name = statue_patch.simple_query("What is this?")
    return statue_patch.llm_query(f"Who makes a {statue_name}?", long_answer=False)
""",
        scene(W, H, a=obj("statue", 200, 50, 150, 400, ["bronze"])),
        "a sculptor",
    ),
    "distance_patches": (
        """
def execute_command(image):
    image_patch = ImagePatch(image)
    dog_patches = image_patch.find('dog')
    ball_patches = image_patch.find('ball')
    ball_patch = ball_patches[0]
    dog_patches.sort(key=lambda x: distance(x, ball_patch))
    return dog_patches[0]
""",
        scene(W, H, a=obj("dog", 20, 300, 100, 80), b=obj("dog", 400, 300, 100, 80), c=obj("ball", 540, 350, 30, 30)),
        {"object": "b"},
    ),
}
FACTS = {"Who makes a statue? Answer in a few words.": "a sculptor"}

# -- the chat API prompt (prompts/chatapi.prompt): the same class, `visual_property`, llm_query -------
CHATAPI = {
    "visual_property_keyword": (
        """
def execute_command(image) -> str:
    image_patch = ImagePatch(image)
    vase_patches = image_patch.find("vase")
    return bool_to_yesno(vase_patches[0].verify_property("vase", visual_property="glass"))
""",
        scene(W, H, a=obj("vase", 250, 200, 80, 160, ["glass", "clear"])),
        "yes",
    ),
    "llm_query_function": (
        """
def execute_command(image) -> str:
    image_patch = ImagePatch(image)
    fruit_patches = image_patch.find("fruit")
    fruit_name = fruit_patches[0].simple_query("What is this?")
    return llm_query(f"Which vitamin is {fruit_name} rich in?", long_answer=False)
""",
        scene(W, H, a=obj("orange", 250, 200, 80, 80, ["orange"])),
        "vitamin c",
    ),
    "coerce_to_numeric": (
        """
def execute_command(image) -> str:
    image_patch = ImagePatch(image)
    apples = coerce_to_numeric(image_patch.simple_query("How many apples are there?"))
    oranges = len(image_patch.find("orange"))
    return str(apples - oranges)
""",
        scene(
            W,
            H,
            a=obj("apple", 20, 300, 50, 50),
            b=obj("apple", 120, 300, 50, 50),
            c=obj("apple", 220, 300, 50, 50),
            d=obj("orange", 420, 300, 50, 50),
        ),  # fmt: skip
        "2",
    ),
    "best_image_match": (
        """
def execute_command(image) -> ImagePatch:
    image_patch = ImagePatch(image)
    cat_patches = image_patch.find("cat")
    return best_image_match(cat_patches, ["striped cat"])
""",
        scene(W, H, a=obj("cat", 20, 300, 100, 80, ["black"]), b=obj("cat", 300, 300, 100, 80, ["striped"])),
        {"object": "b"},
    ),
}
CHAT_FACTS = {"Which vitamin is orange rich in?": "vitamin c"}

PROMPT_FILES = {"api": (API, FACTS), "chatapi": (CHATAPI, CHAT_FACTS)}
CASES = [
    (f"{file}:{name}", *case, facts) for file, (cases, facts) in PROMPT_FILES.items() for name, case in cases.items()
]


@pytest.mark.parametrize(("name", "program", "graph", "answer", "facts"), CASES, ids=[c[0] for c in CASES])
def test_a_program_in_the_style_of_each_prompt_file_runs_unchanged(name, program, graph, answer, facts, tmp_path):
    outcome = run(program, {"img": graph}, tmp_path, facts=facts)
    assert outcome.status == "ok", f"{name}: {outcome.error}"
    assert outcome.answer == expected(graph, answer), name
