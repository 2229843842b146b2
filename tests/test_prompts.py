"""The prompt builder: API listing rendered from vprl.executor.api, slot order, ICE files, config round-trip."""

from __future__ import annotations

import ast
import builtins
import inspect
import json
from pathlib import Path

import pytest

from vprl.executor.api import API_OBJECTS, ImagePatch
from vprl.executor.api.spec import VARIANTS, ApiVariant, get_variant
from vprl.train.prompts import (
    PreviousAttempt,
    PromptConfig,
    PromptTemplate,
    build_prompt,
    load_examples,
    prompt_hash,
    read_examples,
    render_api,
)
from vprl.train.prompts.render import render_function

REPO = Path(__file__).resolve().parents[1]
SHIPPED_ICES = REPO / "configs" / "prompts" / "example_ices.jsonl"
TASK_OF = {"vipergpt_video": "video_qa", "abstract_video": "video_qa"}


def _write_ices(path: Path, n: int) -> Path:
    rows = [
        {"query": f"query number {i}", "program": f"def execute_command(image) -> str:\n    return '{i}'\n"}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- listing


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_renders_parseable_source_with_exactly_its_members(name):
    listing = render_api(name)
    tree = ast.parse(listing)
    spec = get_variant(name)
    assert listing.startswith("import math\n")
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert list(classes) == [c for c, _ in spec.classes]
    assert functions == list(spec.functions)
    for class_name, members in spec.classes:
        shown = [n.name for n in classes[class_name].body if isinstance(n, ast.FunctionDef)]
        assert shown == list(members)
    assert render_api(name) == listing  # deterministic


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_rendered_docstrings_and_signatures_are_the_real_ones(name):
    tree = ast.parse(render_api(name))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            real = API_OBJECTS[node.name]
            assert ast.get_docstring(node) == inspect.getdoc(real)
            assert [a.arg for a in node.args.args] == list(inspect.signature(real).parameters)
        elif isinstance(node, ast.ClassDef):
            cls = API_OBJECTS[node.name]
            for member in node.body:
                if isinstance(member, ast.FunctionDef):
                    raw = inspect.getattr_static(cls, member.name)
                    real = raw.fget if isinstance(raw, property) else raw
                    assert ast.get_docstring(member) == inspect.getdoc(real), member.name


def test_signature_keeps_annotations_and_defaults_unquoted():
    listing = render_api("vipergpt")
    assert "def simple_query(self, question: str = None) -> str:" in listing
    assert "def find(self, object_name: str) -> list[ImagePatch]:" in listing
    assert "'str'" not in listing


def test_property_is_rendered_as_property():
    listing = render_api("viunit")
    assert "    @property\n    def area(self) -> int:" in listing
    assert "@property" not in render_api("vipergpt")


def test_class_summary_lists_only_the_shown_methods():
    viunit = ast.get_docstring(ast.parse(render_api("viunit")).body[1])
    assert "crop_left_of_bbox(left: int, lower: int, right: int, upper: int) -> ImagePatch" in viunit
    assert "compute_depth" not in viunit and "best_text_match" not in viunit
    viper = ast.get_docstring(ast.parse(render_api("vipergpt")).body[1])
    assert "compute_depth() -> float" in viper and "crop_left_of_bbox" not in viper
    assert "Attributes" in viper  # the other sections are kept


def test_changing_a_docstring_changes_the_listing_prompt_and_hash(monkeypatch):
    config = PromptConfig(variant="vipergpt")
    before_listing, before_hash = render_api("vipergpt"), prompt_hash(config)
    monkeypatch.setattr(ImagePatch.exists, "__doc__", "Whether the thing is there.\n\n>>> image_patch.exists('cow')")
    after = render_api("vipergpt")
    assert after != before_listing
    assert '"""Whether the thing is there.' in after
    assert "Whether the thing is there." in build_prompt("is there a cow?", config)
    assert prompt_hash(config) != before_hash
    monkeypatch.undo()
    assert render_api("vipergpt") == before_listing


def test_changing_a_signature_changes_the_listing(monkeypatch):
    def find(self, object_name: str, threshold: float = 0.1) -> list[ImagePatch]:
        """Find things."""

    monkeypatch.setattr(ImagePatch, "find", find)
    assert "def find(self, object_name: str, threshold: float = 0.1) -> list[ImagePatch]:" in render_api("abstract")


def test_docstrings_with_quotes_and_backslashes_round_trip():
    def tricky(a, /, x: int = 3, *, flag: bool = False, **rest) -> str:
        pass

    tricky.__doc__ = '"quoted" start, a \\n backslash and """ triple quotes"'
    source = render_function(tricky)
    assert source.startswith("def tricky(a, /, x: int = 3, *, flag: bool = False, **rest) -> str:")
    assert ast.get_docstring(ast.parse(source).body[0]) == inspect.getdoc(tricky)


def test_unknown_member_in_a_variant_is_an_error_naming_it():
    bad = ApiVariant("broken", (("ImagePatch", ("find", "teleport")),), ())
    with pytest.raises(ValueError, match="ImagePatch.teleport"):
        render_api(bad)
    with pytest.raises(ValueError, match="unknown API variant"):
        render_api("nope")


# ---------------------------------------------------------------- prompt assembly


def test_slots_come_in_stanic_order(tmp_path):
    config = PromptConfig(ice_file=str(_write_ices(tmp_path / "ices.jsonl", 2)))
    previous = PreviousAttempt(program="def execute_command(image) -> str:\n    return foo\n", error="NameError: foo")
    prompt = build_prompt("what colour is the cube?", config, previous=previous, context="taken at night")
    marks = [
        "import math",
        "class ImagePatch:",
        "def coerce_to_numeric",
        "# query number 0",
        "# query number 1",
        "write a Python function `execute_command`",
        "Consider the following guidelines:",
        "An earlier attempt at this query:\n# what colour is the cube?\ndef execute_command(image) -> str:\n"
        "    return foo\n",
        "NameError: foo",
        "Correct the function",
        "# Context: taken at night",
    ]
    positions = [prompt.index(m) for m in marks]
    assert positions == sorted(positions)
    assert prompt.endswith("# Context: taken at night\n# what colour is the cube?\ndef execute_command(image) -> str:")


def test_static_part_is_a_shared_prefix_and_the_hash_ignores_the_query(tmp_path):
    template = PromptTemplate.from_config(PromptConfig())
    a, b = template.build("how many cats?"), template.build("is the sky blue?")
    assert a.startswith(template.static.rstrip("\n")) and b.startswith(template.static.rstrip("\n"))
    assert template.hash == prompt_hash(PromptConfig()) and len(template.hash) == 16
    assert prompt_hash(PromptConfig(variant="abstract")) != template.hash
    assert prompt_hash(PromptConfig(task="grounding")) != template.hash  # signature differs
    ices = str(_write_ices(tmp_path / "ices.jsonl", 3))
    assert prompt_hash(PromptConfig(ice_file=ices)) != prompt_hash(PromptConfig(ice_file=ices, max_ices=2))


@pytest.mark.parametrize(
    ("config", "signature"),
    [
        (PromptConfig(task="vqa"), "def execute_command(image) -> str:"),
        (PromptConfig(task="itm"), "def execute_command(image) -> str:"),
        (PromptConfig(task="grounding"), "def execute_command(image) -> ImagePatch:"),
        (PromptConfig(task="vqa", return_annotation="bool"), "def execute_command(image) -> bool:"),
        (
            PromptConfig(variant="abstract_video", task="video_qa"),
            "def execute_command(video, question, possible_answers) -> str:",
        ),
    ],
)
def test_entry_point_signature_follows_the_task(config, signature):
    prompt = build_prompt("some query", config)
    assert prompt.endswith("# some query\n" + signature)


def test_guidelines_come_from_the_variant_and_task():
    grounding = build_prompt("the left cup", PromptConfig(variant="abstract", task="grounding"))
    for line in get_variant("abstract").guidelines:
        assert f"- {line}\n" in grounding
    assert "every possible control flow returns an ImagePatch" in grounding
    video = build_prompt("why did the boy run?", PromptConfig(variant="abstract_video", task="video_qa"))
    assert "VideoSegment(video)" in video and "Using the `VideoSegment` class" in video
    bare = build_prompt("the left cup", PromptConfig(task="grounding", include_guidelines=False))
    assert "guidelines" not in bare and "every possible control flow" not in bare


def test_multiline_query_and_context_stay_comments():
    prompt = build_prompt("first line\nsecond line", PromptConfig(), context="a\nb")
    assert prompt.endswith("# Context: a\n# b\n# first line\n# second line\ndef execute_command(image) -> str:")
    with pytest.raises(ValueError, match="query"):
        build_prompt("  ", PromptConfig())


def test_viunit_layout(tmp_path):
    config = PromptConfig(variant="viunit", layout="viunit", ice_file=str(_write_ices(tmp_path / "i.jsonl", 2)))
    prompt = build_prompt("is the cat left of the dog?", config)
    header, first, instruction = (
        prompt.index("# Examples of how to use the API"),
        prompt.index("# Query: query number 0\nProgram:\ndef execute_command"),
        prompt.index("write a Python function"),
    )
    assert instruction < header < first
    assert prompt.endswith("# Query: is the cat left of the dog?\nProgram:\ndef execute_command(image) -> str:")


# ---------------------------------------------------------------- ICE files


def test_ices_appear_in_file_order_and_max_ices_truncates_explicitly(tmp_path):
    path = str(_write_ices(tmp_path / "ices.jsonl", 5))
    prompt = build_prompt("q", PromptConfig(ice_file=path))
    positions = [prompt.index(f"# query number {i}\n") for i in range(5)]
    assert positions == sorted(positions)
    template = PromptTemplate.from_config(PromptConfig(ice_file=path, max_ices=2))
    assert [ex.query for ex in template.examples.examples] == ["query number 0", "query number 1"]
    assert template.examples.available == 5 and template.examples.truncated
    assert "query number 2" not in template.build("q")
    none = PromptTemplate.from_config(PromptConfig(ice_file=path, max_ices=0))
    assert "query number" not in none.static and none.examples.truncated
    assert not load_examples(path, 10).truncated


def test_missing_ice_file_names_itself(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        build_prompt("q", PromptConfig(ice_file=str(tmp_path / "nowhere.jsonl")))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"query": "q"}', r"missing key\(s\) \['program'\]"),
        ('{"program": "def execute_command(image):\\n    return 1\\n"}', r"missing key\(s\) \['query'\]"),
        ('["q", "p"]', "expected a JSON object"),
        ('{"query": "q", "program": ""}', "'program' must be a non-empty string"),
        ('{"query": "q", "program": "def execute_command(image):\\nreturn 1"}', "does not parse"),
    ],
)
def test_bad_ice_rows_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"query": "ok", "program": "def execute_command(image):\n    return 'a'\n"})
    path.write_text(f"{good}\n\n{line}\n")
    with pytest.raises(ValueError, match=message) as info:
        read_examples(path)
    assert f"{path}:3" in str(info.value)


def test_ice_extra_keys_round_trip(tmp_path):
    path = tmp_path / "ace.jsonl"
    row = {"query": "q", "program": "def execute_command(image):\n    return 'a'\n", "score": 1.0, "id": "gqa/1"}
    path.write_text(json.dumps(row) + "\n")
    (example,) = read_examples(path)
    assert example.extra == {"score": 1.0, "id": "gqa/1"} and example.to_json() == row


def test_shipped_examples_use_only_the_vipergpt_api():
    examples = read_examples(SHIPPED_ICES)
    assert len(examples) >= 3
    spec = get_variant("vipergpt")
    methods = set(dict(spec.classes)["ImagePatch"]) | {"append", "sort", "lower", "strip"}
    names = set(spec.functions) | {"ImagePatch"} | set(dir(builtins))
    for ex in examples:
        for node in ast.walk(ast.parse(ex.program)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id in names, (ex.query, node.func.id)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr in methods, (ex.query, node.func.attr)


# ---------------------------------------------------------------- config


def test_config_round_trips_through_json_and_yaml(tmp_path):
    config = PromptConfig(variant="abstract", task="grounding", ice_file="x.jsonl", max_ices=4, layout="stanic")
    assert PromptConfig.from_json(config.to_json()) == config
    assert PromptConfig.from_yaml(config.to_yaml()) == config
    (tmp_path / "p.yaml").write_text(config.to_yaml())
    assert PromptConfig.load(tmp_path / "p.yaml") == config


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"variant": "vipergpt", "ices": "x"}, r"unknown key\(s\) \['ices'\]; valid keys"),
        ({"variant": "gpt5"}, "unknown API variant"),
        ({"task": "caption"}, "task"),
        ({"layout": "chatml"}, "layout"),
        ({"variant": "vipergpt", "task": "video_qa"}, "is an image API but task is 'video_qa'"),
        ({"variant": "abstract_video", "task": "vqa"}, "is a video API"),
        ({"max_ices": -1}, "max_ices"),
        ({"max_ices": "3"}, "max_ices"),
        ({"include_guidelines": "yes"}, "include_guidelines"),
    ],
)
def test_bad_config_is_a_clear_error(data, message):
    with pytest.raises(ValueError, match=message):
        PromptConfig.from_dict(data)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_builds_a_prompt(name):
    prompt = build_prompt("a query", PromptConfig(variant=name, task=TASK_OF.get(name, "vqa")))
    assert prompt.count("\ndef execute_command(") == 1
