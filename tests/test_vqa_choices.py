"""`vqa(question, choices=[...])`: validation, cache keys, and probabilities over the choices from the
oracle/shapes backends (one-hot from their answer) and from BLIP-2 (the language model's scores)."""

from __future__ import annotations

import asyncio
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from vprl.data.shapes import BuildConfig, build_dataset
from vprl.data.shapes.tasks import load_shapes_tasks, scene_graph_files
from vprl.executor.host import ToolHost
from vprl.executor.tools.calls import MAX_CHOICES, ToolCall, validate_call
from vprl.executor.tools.errors import ToolError
from vprl.executor.tools.oracle import one_hot_scores
from vprl.executor.tools.stack import build_backend

LEFT, RIGHT = (0, 0, 100, 100), (100, 0, 200, 100)  # the red and the blue half of the `store` image


# -- the protocol -------------------------------------------------------------------------------------
def test_choices_are_validated(store):
    images, ref = store

    def check(args):
        return validate_call(ToolCall("vqa", ref, None, {"question": "is it red?", **args}), images)

    check({})
    check({"choices": ["yes", "no"]})
    check({"choices": [f"c{i}" for i in range(MAX_CHOICES)]})
    bad = {
        "non-empty list": "yes",
        "non-empty list ": [],
        "list of strings": ["yes", 1],
        "at most": [f"c{i}" for i in range(MAX_CHOICES + 1)],
        "not blank": ["yes", "  "],
        "characters": ["yes", "x" * 65],
        "distinct": ["yes", "yes"],
    }
    for reason, choices in bad.items():
        with pytest.raises(ToolError, match=reason.strip()):
            check({"choices": choices})


def test_one_hot_scores_fold_case_and_fall_back_to_uniform():
    assert one_hot_scores("yes", ["Yes", "no"]) == {"Yes": 1.0, "no": 0.0}
    assert one_hot_scores("red.", ["blue", "red", "green"]) == {"blue": 0.0, "red": 1.0, "green": 0.0}
    assert one_hot_scores("nothing", ["yes", "no"]) == {"yes": 0.5, "no": 0.5}  # no preference


# -- oracle and shapes ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes_choices")
    build_dataset(BuildConfig(out=str(root), train=2, val=16, seed=3, winoground=1, sugarcrepe=1, refcoco=1))
    return root


@pytest.mark.parametrize("backend_name", ["oracle", "shapes"])
def test_deterministic_backends_answer_one_hot_and_the_host_keys_on_choices(world, backend_name):
    if backend_name == "oracle":
        backend = build_backend({"backend": "oracle", "scene_graphs": [str(p) for p in scene_graph_files(world)]})
    else:
        backend = build_backend({"backend": "shapes"})
    host = ToolHost(backend)
    examples = load_shapes_tasks(world, ["val"])["val"]
    assert examples
    choices = ["yes", "no", "red", "2"]

    async def ask(example, args):
        ref = host.images.add_file(example.image, image_id=example.meta.get("imageId")).ref
        try:
            return (await host.call(ToolCall("vqa", ref, None, {"question": example.query, **args})))[0]
        except ToolError:
            return None  # a question the backend cannot parse: skipped

    async def main():
        rows = []
        for example in examples:
            plain = await ask(example, {})
            scored = await ask(example, {"choices": choices})
            rows.append((plain, scored))
        ok = [e for e, (plain, _) in zip(examples, rows) if plain is not None]
        calls = host.metrics()["backend_calls"]
        again = [await ask(example, {"choices": choices}) for example in ok]  # refusals are not cached
        reversed_ = await ask(ok[0], {"choices": choices[::-1]})
        return rows, calls, again, reversed_

    try:
        rows, calls, again, reversed_ = asyncio.run(main())
        after = host.metrics()["backend_calls"]
    finally:
        host.close()
    answered = [(p, s) for p, s in rows if p is not None]
    assert len(answered) >= len(rows) // 2
    for plain, scored in answered:
        assert isinstance(plain, str)  # without choices: the string, exactly as before
        assert scored["answer"] == plain and list(scored["scores"]) == choices
        assert scored["scores"] == one_hot_scores(plain, choices) and math.isclose(sum(scored["scores"].values()), 1)
    assert any(s["scores"]["yes"] == 1.0 for _, s in answered) or any(s["scores"]["no"] == 1.0 for _, s in answered)
    # The same call again is a cache hit; other choices (even reordered) are another key.
    assert again == [s for _, s in answered] and after == calls + 1
    assert list(reversed_["scores"]) == choices[::-1]
    plain_call = ToolCall("vqa", "img", None, {"question": "q"})
    keys = {
        c.cache_key("b")
        for c in (plain_call, ToolCall("vqa", "img", None, {"question": "q", "choices": ["yes", "no"]}))
    }
    assert len(keys) == 2


# -- BLIP-2 -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def blip_paths(tmp_path_factory):
    pytest.importorskip("transformers")
    import tiny_models as tiny

    root = tmp_path_factory.mktemp("vqa_choices_tiny")
    return {family: tiny.build(family, root) for family in ("blip2", "blip2_t5")}


@pytest.mark.parametrize("family", ["blip2", "blip2_t5"])
def test_blip2_scores_choices_with_its_language_model(blip_paths, store, family):
    import torch

    from vprl.executor.tools.hf import HFBackend
    from vprl.executor.tools.hf import vqa as vqa_mod
    from vprl.executor.tools.hf.regions import region_of

    images, ref = store
    backend = HFBackend(images, device="cpu", vqa={"model": blip_paths[family], "max_length": 3})
    choices = ["yes", "no", "a red square"]
    calls = [
        ToolCall("vqa", ref, LEFT, {"question": "is it red?", "choices": choices}),
        ToolCall("vqa", ref, RIGHT, {"question": "is it red?", "choices": choices}),
        ToolCall("vqa", ref, LEFT, {"question": "what shape is the biggest thing here?", "choices": choices}),
        ToolCall("vqa", ref, LEFT, {"question": "is it red?"}),
    ]
    left, right, other, plain = backend.run("vqa", calls)
    assert isinstance(plain, str) and left["answer"] == plain  # the generated answer, with or without choices
    for result in (left, right, other):
        assert list(result["scores"]) == choices
        probs = list(result["scores"].values())
        assert all(math.isfinite(p) and 0 < p < 1 for p in probs) and math.isclose(sum(probs), 1.0, rel_tol=1e-9)
    gap = lambda a, b: max(abs(a["scores"][c] - b["scores"][c]) for c in choices)  # noqa: E731
    assert gap(left, right) > 1e-6 and gap(left, other) > 1e-6  # the image and the question matter

    # Each log-probability is the model's own: -(its LM loss) x (the choice's token count), one row at a
    # time with no padding, and padding the choices together in one batch changes nothing.
    (cap,) = backend.models._loaded.values()
    settings = backend._settings("vqa")
    region, prompt = region_of(calls[0], images), vqa_mod.prompt_of(calls[0], settings)
    batched = vqa_mod.choice_logprobs(cap, [region] * 3, [prompt] * 3, choices, images)
    tok = cap.processor.tokenizer
    for choice, value in zip(choices, batched):
        inputs = cap.processor(images=[vqa_mod.crop_pil(images, region)], text=[prompt], return_tensors="pt")
        target = tok((" " if cap.decoder_only else "") + choice, add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            if cap.decoder_only:
                ids = torch.cat([inputs["input_ids"], torch.tensor([target])], dim=1)
                labels = torch.full_like(ids, -100)
                labels[0, -len(target) :] = torch.tensor(target)
                loss = cap.model(pixel_values=inputs["pixel_values"], input_ids=ids, labels=labels).loss
            else:
                loss = cap.model(**inputs, labels=torch.tensor([target])).loss
        assert value == pytest.approx(-float(loss) * len(target), rel=1e-4, abs=1e-5)
    expected = torch.softmax(torch.tensor(batched, dtype=torch.float64), 0).tolist()
    assert list(left["scores"].values()) == pytest.approx(expected, rel=1e-9)
