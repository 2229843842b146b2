"""The recipe's GQA sample (`dataset_sample: gqa_train`) is drawn once for all training processes:
the first to arrive parses the questions file, the others read what it drew."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_loaders_sampling import write_gqa

from vprl.train.recipe.data import load_examples
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.sections import DataArgs

REPO = Path(__file__).resolve().parents[1]
RANKS = 4
# One training process: load the recipe's examples, counting every parse of a GQA questions file.
RANK = """
import json, sys
from pathlib import Path
import vprl.data.loaders.gqa as gqa
from vprl.train.recipe.data import load_examples
from vprl.train.recipe.sections import DataArgs

parses = Path(sys.argv[2])
original = gqa.load_json
def counted(path, expected):
    with parses.open("a") as f:
        f.write(str(path) + "\\n")
    return original(path, expected)
gqa.load_json = counted
args = DataArgs(dataset="gqa", dataset_root=sys.argv[1], dataset_split="train", dataset_sample="gqa_train",
                dataset_sample_cache=sys.argv[3], dataset_options={})
print(json.dumps([ex.to_json() for ex in load_examples(args)]))
"""


@pytest.fixture
def gqa_root(tmp_path):
    root = tmp_path / "gqa"
    root.mkdir()
    write_gqa(root / "train_balanced_questions.json", {f"family{g:02d}": 14 for g in range(30)} | {"small": 3})
    return root


def _args(root: Path, cache: Path | None, **extra) -> DataArgs:
    settings = dict(
        dataset_split="train",
        dataset_sample="gqa_train",
        dataset_sample_cache=str(cache) if cache else None,
        dataset_options={},
    )
    return DataArgs(dataset="gqa", dataset_root=str(root), **{**settings, **extra})


def test_gqa_train_file_is_parsed_once_for_all_ranks(tmp_path, gqa_root):
    parses = tmp_path / "parses.txt"
    cache = tmp_path / "cache"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(gqa_root), str(parses), str(cache)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(RANKS)
    ]
    outputs = [rank.communicate(timeout=240) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), [err[-2000:] for _, err in outputs]
    drawn = [json.loads(out) for out, _ in outputs]
    assert len(parses.read_text().splitlines()) == 1  # not once per rank
    uncached = [ex.to_json() for ex in load_examples(_args(gqa_root, None))]
    assert len(uncached) == 30 * 10 + 3
    assert all(d == json.loads(json.dumps(uncached)) for d in drawn)


def test_gqa_sample_cache_is_drawn_again_when_the_file_or_the_seed_changes(tmp_path, gqa_root):
    cache = tmp_path / "cache"
    first = load_examples(_args(gqa_root, cache))
    assert load_examples(_args(gqa_root, cache)) == first
    other_seed = load_examples(_args(gqa_root, cache, dataset_sample_seed=1))
    assert {ex.id for ex in other_seed} != {ex.id for ex in first}
    # a new download of the file (other questions, same name) is not served the old sample
    write_gqa(gqa_root / "train_balanced_questions.json", {f"other{g:02d}": 12 for g in range(5)})
    redrawn = load_examples(_args(gqa_root, cache))
    assert {ex.group for ex in redrawn} == {f"other{g:02d}" for g in range(5)}
    assert len(list(cache.glob("sample-*.jsonl"))) == 3


def test_gqa_sample_cache_that_holds_another_key_is_replaced(tmp_path, gqa_root):
    cache = tmp_path / "cache"
    first = load_examples(_args(gqa_root, cache))
    (stored,) = cache.glob("sample-*.jsonl")
    lines = stored.read_text().splitlines()
    header = json.loads(lines[0])
    header["key"]["seed"] = "tampered"
    stored.write_text("\n".join([json.dumps(header), *lines[1:2]]) + "\n")  # one example left, wrong key
    assert load_examples(_args(gqa_root, cache)) == first
    assert len(stored.read_text().splitlines()) == len(first) + 1


def test_gqa_sample_cache_checks_the_sampled_images_when_asked(tmp_path, gqa_root):
    cache = tmp_path / "cache"
    load_examples(_args(gqa_root, cache))  # cached without the check
    with pytest.raises(ConfigError, match="image file"):
        load_examples(_args(gqa_root, cache, dataset_options={"check_images": True}))
