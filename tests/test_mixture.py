"""Dataset mixtures in an RL recipe: parsing (bad input named by file:line and key path), weighted
draws, a prompt template and a reward scope per entry, per-task metrics, the manifest, and GRPO
training on a mixture end to end."""

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from fixed_policy import build_fixed_policy
from rl_tiny import RECIPE_BASE, build_policy

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult
from vprl.rewards.build import build_rewards
from vprl.rewards.compose import RewardConfig, RewardSpec
from vprl.train.recipe.mixture import ENTRY_META, entry_of
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.rl_config import parse_rl_config

REPO = Path(__file__).resolve().parents[1]
SHAPES_STACK = "shapes"
MIXTURE = {
    "seed": 3,
    "datasets": [
        {"name": "vqa", "dataset": "shapes", "tasks": ["train"], "weight": 0.5},
        {"name": "itm", "dataset": "shapes", "tasks": ["winoground", "sugarcrepe"], "weight": 0.3},
        {"name": "ground", "dataset": "shapes", "tasks": ["refcoco"], "weight": 0.2},
    ],
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from vprl.data.shapes import BuildConfig, build_dataset

    root = tmp_path_factory.mktemp("mixture") / "world"
    build_dataset(
        BuildConfig(out=str(root), workers=1, train=16, val=4, winoground=2, sugarcrepe=1, refcoco=6, seed=5)
    )
    return root


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def _recipe(tmp_path, **values) -> Path:
    base = {**RECIPE_BASE, "output_dir": str(tmp_path / "run"), "tool_stack": SHAPES_STACK, "dataset_mixture": MIXTURE}
    base.pop("dataset")
    base.pop("dataset_tasks")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**base, **values}, sort_keys=False))
    return path


def _checked(tmp_path, world, model, **values):
    from vprl.train.recipe.checks import validate

    cfg = parse_rl_config(
        ["--config", str(_recipe(tmp_path, dataset_root=str(world), model_name_or_path=str(model), **values))]
    )
    return cfg, validate(cfg, check_layout=False)


def test_a_mixture_parses_typed_and_reads_back(tmp_path):
    cfg = parse_rl_config(["--config", str(_recipe(tmp_path))])
    entries = cfg.data.dataset_mixture.datasets
    assert [e.name for e in entries] == ["vqa", "itm", "ground"] and entries[1].tasks == ["winoground", "sugarcrepe"]
    assert cfg.data.dataset_mixture.seed == 3 and all(e.labels for e in entries)
    flat = cfg.to_flat()
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(flat))
    assert parse_rl_config(["--config", str(again)]).to_flat() == flat


@pytest.mark.parametrize("recipe", sorted((REPO / "configs/transfer").glob("*.yaml")), ids=lambda p: p.stem)
def test_the_transfer_recipes_parse_for_a_cpu(recipe):
    cfg = parse_rl_config(["--config", str(recipe)])
    assert cfg.training.use_cpu and cfg.prompt.prompt_layout == "bare" and cfg.training.learning_rate == 2e-3
    mixture = cfg.data.dataset_mixture
    assert mixture is not None or not cfg.data.dataset_labels  # a mixture, or a label-free adaptation


def _bad(tmp_path, match, **values):
    with pytest.raises(ConfigError, match=match):
        parse_rl_config(["--config", str(_recipe(tmp_path, **values))])


def test_bad_mixtures_are_named_by_file_line_and_key(tmp_path):
    text = _recipe(tmp_path).read_text().splitlines()
    line = next(i for i, t in enumerate(text, 1) if t.startswith("dataset_mixture:"))
    at = rf"recipe\.yaml:{line}: dataset_mixture"
    entries = MIXTURE["datasets"]
    negative = {**MIXTURE, "datasets": [{**entries[0], "weight": -1}]}
    _bad(tmp_path, at + r"\.datasets\[0\]\.weight: must be a positive number, got -1", dataset_mixture=negative)
    typo = {**MIXTURE, "datasets": [{**entries[0], "wieght": 1}]}
    _bad(tmp_path, at + r"\.datasets\[0\]: unknown key\(s\) \['wieght'\]", dataset_mixture=typo)
    twice = {**MIXTURE, "datasets": [entries[0], entries[0]]}
    _bad(tmp_path, at + r"\.datasets: each entry needs its own name; \['vqa'\]", dataset_mixture=twice)
    wrong_type = {**MIXTURE, "datasets": [{**entries[0], "labels": "no"}]}
    _bad(tmp_path, at + r"\.datasets\[0\]: labels: expected true or false", dataset_mixture=wrong_type)
    split_tasks = {**MIXTURE, "datasets": [{"dataset": "gqa", "tasks": ["train"]}]}
    _bad(tmp_path, r"\.datasets\[0\]\.tasks: only shapes-world entries take tasks", dataset_mixture=split_tasks)
    _bad(tmp_path, r"\.datasets: at least one dataset", dataset_mixture={"datasets": []})
    _bad(
        tmp_path,
        r"recipe\.yaml:\d+: dataset_split: a recipe with dataset_mixture sets it per entry",
        dataset_split="val",
    )
    with pytest.raises(ConfigError, match=r"command line: dataset_labels: a recipe with dataset_mixture"):
        parse_rl_config(["--config", str(_recipe(tmp_path)), "--dataset_labels", "false"])


def test_weights_decide_the_draws_and_every_example_is_drawn(tmp_path, world, model):
    _, checked = _checked(tmp_path, world, model)
    mixture = checked.mixture
    drawn = Counter(entry_of(ex) for ex in checked.examples)
    for entry in mixture.entries:
        assert {ex.id for ex in entry.examples} <= {ex.id for ex in checked.examples}  # each example at least once
        assert drawn[entry.entry.name] == entry.rows
        assert abs(entry.rows / len(checked.examples) - entry.entry.weight) < 0.03, (entry.entry.name, entry.rows)
        counts = Counter(ex.id for ex in checked.examples if entry_of(ex) == entry.entry.name).values()
        assert max(counts) - min(counts) <= 1  # repeats spread evenly
    assert {ex.task for ex in mixture.entry("ground").examples} == {"grounding"}
    # the order is the seed's, and another seed gives another
    _, same = _checked(tmp_path, world, model)
    other = {**MIXTURE, "seed": 4}
    _, moved = _checked(tmp_path, world, model, dataset_mixture=other)
    ids = [ex.id for ex in checked.examples]
    assert ids == [ex.id for ex in same.examples] and ids != [ex.id for ex in moved.examples]
    assert drawn == Counter(entry_of(ex) for ex in moved.examples)  # the seed picks which examples repeat


def test_each_entry_gets_its_prompt_template(tmp_path, world, model):
    from vprl.train.recipe.data import build_prompts

    entries = [*MIXTURE["datasets"][:2], {**MIXTURE["datasets"][2], "prompt": {"include_guidelines": False}}]
    _, checked = _checked(tmp_path, world, model, dataset_mixture={**MIXTURE, "datasets": entries})
    assert set(checked.prompts) == {"vqa", "itm", "ground"}
    assert checked.prompts["ground"].task == "grounding" and not checked.prompts["ground"].include_guidelines
    for p in build_prompts(checked.examples, checked.prompts):
        want = "-> ImagePatch:" if entry_of(p.example) == "ground" else "-> str:"
        assert p.prompt.endswith(want) and p.prompt.startswith(f"# {p.example.query}")
    bad = [*MIXTURE["datasets"][:2], {**MIXTURE["datasets"][2], "prompt": {"layuot": "bare"}}]
    with pytest.raises(ConfigError, match=r"dataset_mixture\.datasets\[2\]\.prompt: unknown key\(s\) \['layuot'\]"):
        _checked(tmp_path, world, model, dataset_mixture={**MIXTURE, "datasets": bad})
    mixed = [{"name": "both", "dataset": "shapes", "tasks": ["train", "refcoco"]}]
    with pytest.raises(ConfigError, match=r"holds tasks \['grounding', 'vqa'\]; give each task its own entry"):
        _checked(tmp_path, world, model, dataset_mixture={"datasets": mixed})
    with pytest.raises(ConfigError, match=r"prompt_task: a recipe with dataset_mixture sets the task per entry"):
        _checked(tmp_path, world, model, prompt_task="vqa")


def _entries(**by_name):
    return {**MIXTURE, "datasets": [{**e, **by_name.get(e["name"], {})} for e in MIXTURE["datasets"]]}


def test_reward_scopes_and_label_free_entries_are_checked(tmp_path, world, model):
    rewards = ["correctness", {"name": "executes", "weight": 0.1}]
    scoped = _entries(itm={"labels": False, "rewards": ["executes"]})
    _, checked = _checked(tmp_path, world, model, rewards=rewards, dataset_mixture=scoped)
    assert checked.reward_scopes == {"correctness": {"vqa", "ground"}, "executes": {"vqa", "itm", "ground"}}
    assert not any(ex.answers for ex in checked.mixture.entry("itm").examples)
    _, everywhere = _checked(tmp_path, world, model, rewards=rewards)
    assert everywhere.reward_scopes is None  # every reward scores every entry
    reading = _entries(itm={"labels": False})
    with pytest.raises(
        ConfigError, match=r"datasets\[1\]\.rewards: entry 'itm' has labels: false, but \['correctness'\]"
    ):
        _checked(tmp_path, world, model, rewards=rewards, dataset_mixture=reading)
    with pytest.raises(
        ConfigError, match=r"datasets\[0\]\.rewards: \['unit_test'\] are not among the recipe's rewards"
    ):
        _checked(tmp_path, world, model, dataset_mixture=_entries(vqa={"rewards": ["unit_test"]}))
    idle = _entries(**{n: {"rewards": ["correctness"]} for n in ("vqa", "itm", "ground")})
    with pytest.raises(ConfigError, match=r"rewards \['executes'\] score no entry"):
        _checked(tmp_path, world, model, rewards=rewards, dataset_mixture=idle)


def _example(i: int, entry: str, labelled: bool) -> Example:
    return Example(
        id=f"x{i}",
        dataset="gqa",
        task="vqa",
        query="What color is the circle?",
        image="img.png",
        answers=("red",) if labelled else (),
        meta={ENTRY_META: entry},
    )


def test_a_scoped_reward_never_sees_the_other_entries():
    config = RewardConfig((RewardSpec("correctness"), RewardSpec("executes", 0.5)))
    scopes = {"correctness": frozenset({"a"}), "executes": frozenset({"a", "b"})}
    composer = build_rewards(config, None, scopes, entry_of)
    examples = [_example(0, "a", True), _example(1, "b", False), _example(2, "a", True), _example(3, "b", False)]
    results = [ExecutionResult(f"x{i}", "k", "ok", a) for i, a in enumerate(("red", "red", "blue", "blue"))]
    batch = composer(examples, results, ["p"] * 4)  # correctness on a label-free example would raise
    assert batch.components["correctness"] == [1.0, None, 0.0, None]
    assert batch.components["executes"] == [1.0] * 4
    assert batch.totals == [1.5, 0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match=r"scoped to mixture entries, but \['y'\] belong to none"):
        composer(
            [Example(id="y", dataset="gqa", task="vqa", query="q", image="i", answers=("a",))], results[:1], ["p"]
        )


class _Evidence:
    """A detailed reward: 1.0 per program, with one evidence row naming the example."""

    def __call__(self, examples, results, programs):
        return self.detailed(examples, results, programs)[0]

    def detailed(self, examples, results, programs):
        return [1.0] * len(examples), [[{"example": ex.id}] for ex in examples]


def test_item1_a_scoped_reward_keeps_its_evidence():
    from vprl.rewards.registry import register, reward_names

    if "item1_evidence" not in reward_names():
        register("item1_evidence", _Evidence)
    config = RewardConfig((RewardSpec("item1_evidence"), RewardSpec("executes")))
    scopes = {"item1_evidence": frozenset({"b"}), "executes": frozenset({"a", "b"})}
    composer = build_rewards(config, None, scopes, entry_of)
    examples = [_example(0, "a", True), _example(1, "b", False)]
    results = [ExecutionResult(f"x{i}", "k", "ok", "red") for i in range(2)]
    batch = composer(examples, results, ["p"] * 2)
    assert batch.components["item1_evidence"] == [None, 1.0]
    assert batch.details["item1_evidence"] == [[], [{"example": "x1"}]]  # the viewer's rows survive the scope
    with pytest.raises(ValueError, match=r"rewards \['executes'\] have no scope"):
        build_rewards(config, None, {"item1_evidence": frozenset({"b"})}, entry_of)


def test_metrics_rows_hold_each_tasks_reward_and_accuracy(tmp_path):
    from vprl.train.online.callbacks import MetricsRecorder
    from vprl.train.rollouts.log import RolloutRow
    from vprl.train.runs.folder import MetricsLog

    examples = {ex.id: ex for ex in [_example(0, "a", True), _example(1, "b", False)]}
    rows = [
        RolloutRow(step=1, example_id="x0", prompt_hash="h", program="p", status="ok", answer="red", total=1.0),
        RolloutRow(step=1, example_id="x0", prompt_hash="h", program="p", status="runtime_error", total=-0.5),
        RolloutRow(step=1, example_id="x1", prompt_hash="h", program="p", status="ok", answer="red", total=0.25),
    ]
    rollouts = SimpleNamespace(recent=rows)
    recorder = MetricsRecorder(MetricsLog(tmp_path), rollouts, examples)
    state = SimpleNamespace(is_world_process_zero=True, global_step=1)
    recorder.on_step_end(None, state, None)
    recorder.on_step_end(None, state, None)  # the same rows again (a step inside a generation window)
    recorder.on_log(None, state, None, logs={"loss": 0.1})
    state.global_step = 2
    recorder.on_step_end(None, state, None)
    recorder.on_log(None, state, None, logs={"loss": 0.2})
    first, second = (json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert first["task/a/samples"] == 2 and first["task/a/reward"] == 0.25 and first["task/a/accuracy"] == 0.5
    assert first["task/a/exception_rate"] == 0.5 and first["task/b/reward"] == 0.25
    assert "task/b/accuracy" not in first  # no labels: no accuracy
    assert not any(k.startswith("task/") for k in second)  # nothing new since the last row


def test_grpo_trains_on_a_mixture_and_records_it(tmp_path, world):
    from vprl.train.rl import main
    from vprl.train.rollouts.log import RolloutLog

    policy = build_policy(tmp_path / "policy", world)
    recipe = _recipe(
        tmp_path,
        dataset_root=str(world),
        model_name_or_path=str(policy),
        max_steps=2,
        per_device_train_batch_size=16,
        dataset_mixture={**MIXTURE, "datasets": [MIXTURE["datasets"][0], MIXTURE["datasets"][2]]},
    )
    main(["--config", str(recipe)])
    run = tmp_path / "run"
    manifest = json.loads((run / "manifest.json").read_text())
    record = manifest["dataset"]
    assert record["dataset"] == "mixture" and [e["name"] for e in record["mixture"]["datasets"]] == ["vqa", "ground"]
    assert [e["task"] for e in record["mixture"]["datasets"]] == ["vqa", "grounding"]
    assert record["rows"] == sum(e["rows"] for e in record["mixture"]["datasets"])
    assert set(manifest["prompt"]) == {"vqa", "ground"} and manifest["prompt"]["ground"]["task"] == "grounding"
    hashes = manifest["prompt_hashes"]
    assert hashes["vqa"] != hashes["ground"]
    rows = RolloutLog.in_run(run).read()
    assert rows and {r.prompt_hash for r in rows} <= set(hashes.values())
    assert {r.task for r in rows} <= {"vqa", "grounding"}
    # metrics.jsonl: per step, what each entry's rollouts earned, counting exactly the rows recorded
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in logged] == [1, 2]
    assert {k.split("/")[1] for m in logged for k in m if k.startswith("task/")} == {"vqa", "ground"}
    for m in logged:
        for entry, task in (("vqa", "vqa"), ("ground", "grounding")):
            mine = [r for r in rows if r.step == m["step"] and r.task == task]
            assert m.get(f"task/{entry}/samples", 0) == len(mine)
            if mine:
                failed = sum(r.status != "ok" for r in mine) / len(mine)
                totals = [r.total for r in mine if r.total is not None]  # masked programs are left out
                assert m[f"task/{entry}/exception_rate"] == pytest.approx(failed)
                assert m[f"task/{entry}/reward"] == pytest.approx(sum(totals) / len(totals))


def test_item1_per_entry_rewards_reach_the_trainer(tmp_path, world, monkeypatch):
    """configs/transfer/adapt_itm_anchored.yaml's shape: correctness scores the labelled entry only,
    a label-free reward the captions; what trl's reward functions hand the trainer, per entry, is
    each entry's own rewards (a plain composer runs correctness on the captions and raises)."""
    import vprl.train.online.run as online
    from vprl.rewards.trl_adapter import TrlRewardAdapter
    from vprl.train.rl import main

    received: list[tuple[str, list[str], list[float | None]]] = []

    class Recording(TrlRewardAdapter):
        @property
        def reward_funcs(self):
            def recorded(fn):
                async def reward(prompts, completions, **kwargs):
                    values = await fn(prompts, completions, **kwargs)
                    received.append((fn.__name__, list(kwargs[self.id_column]), list(values)))
                    return values

                reward.__name__ = fn.__name__
                return reward

            return [recorded(fn) for fn in super().reward_funcs]

    monkeypatch.setattr(online, "TrlRewardAdapter", Recording)
    # Every program is `return 'yes'`, whatever the CPU: it runs, and its correctness varies by question.
    policy = build_fixed_policy(tmp_path / "policy", world)
    entries = [
        {**MIXTURE["datasets"][0], "rewards": ["correctness"]},
        {**MIXTURE["datasets"][1], "weight": 0.5, "labels": False, "rewards": ["executes"]},
    ]
    values = dict(
        rewards=["correctness", {"name": "executes", "weight": 0.5}],
        dataset_mixture={**MIXTURE, "datasets": entries},
        max_steps=2,
        per_device_train_batch_size=16,
    )
    _, checked = _checked(tmp_path, world, policy, **values)
    owner = {ex.id: entry_of(ex) for ex in checked.examples}
    main(["--config", str(_recipe(tmp_path, dataset_root=str(world), model_name_or_path=str(policy), **values))])
    by_name: dict[str, dict[str, list]] = {}
    for name, ids, got in received:
        for example_id, value in zip(ids, got, strict=True):
            by_name.setdefault(name, {}).setdefault(owner[example_id], []).append(value)
    assert set(by_name) == {"total", "correctness", "executes"}
    assert sum(name == "total" for name, _, _ in received) == 2  # one batch per step
    total, correctness, executes = by_name["total"], by_name["correctness"], by_name["executes"]
    assert set(total) == {"vqa", "itm"}, "both entries were drawn"
    # the labelled entry: correctness alone (executes is not named for it)
    assert set(correctness["vqa"]) <= {0.0, 1.0} and set(executes["vqa"]) == {None}
    assert total["vqa"] == correctness["vqa"]
    # the captions: executes alone, at its weight; correctness says nothing there
    assert set(correctness["itm"]) == {None} and set(executes["itm"]) == {1.0}
    assert set(total["itm"]) == {0.5}
