"""Relabelled pairs (`vprl/train/bootstrap/relabel.py`): shape and colour words permuted in a pair's
question and program alike give the right program of the permuted question, drawn apart from the
rest of the mixture and out of the cache key at 0."""

import numpy as np
import pytest

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.scene import COLORS, SHAPES
from vprl.train.bootstrap.fit import BootstrapConfig, main
from vprl.train.bootstrap.pairs import SFTPair
from vprl.train.bootstrap.relabel import permutation, relabel_pairs, relabel_text


def test_permutation_maps_shapes_to_shapes_and_colours_to_colours_one_to_one():
    for seed in range(20):
        mapping = permutation(np.random.default_rng(seed))
        assert sorted(mapping[s] for s in SHAPES) == sorted(SHAPES)
        assert sorted(mapping[c] for c in COLORS) == sorted(COLORS)
    assert len({tuple(permutation(np.random.default_rng(s)).items()) for s in range(20)}) > 15


def test_relabel_swaps_words_at_once_keeps_plurals_and_leaves_other_words():
    swap = {w: w for w in SHAPES + COLORS} | {"star": "circle", "circle": "star", "red": "cyan", "cyan": "red"}
    text = '# Is the red star left of the cyan circles? start predicate\nfind("red stars")'
    assert (
        relabel_text(text, swap) == '# Is the cyan circle left of the red stars? start predicate\nfind("cyan circles")'
    )


@pytest.fixture(scope="module")
def world_gold(tmp_path_factory):
    root = tmp_path_factory.mktemp("relabel") / "world"
    build_dataset(
        BuildConfig(out=str(root), train=150, val=2, winoground=0, sugarcrepe=0, refcoco=0, seed=4, workers=1)
    )
    return load_gold_programs(root)["vqa"]


def test_a_relabelled_world_question_gets_the_worlds_own_program_for_it(world_gold):
    """Where the permuted question is a question of the world too, the permuted program is the
    world's gold program for it, character for character: a relabelled pair is a right pair."""
    rng = np.random.default_rng(0)
    checked = 0
    for query, program in world_gold.items():
        for _ in range(6):
            mapping = permutation(rng)
            other = relabel_text(query, mapping)
            if other != query and other in world_gold:
                assert relabel_text(program, mapping) == world_gold[other], (query, other)
                checked += 1
    assert checked >= 50, checked


def test_relabel_pairs_keeps_the_mixture_and_changes_about_its_share():
    pairs = [
        SFTPair(str(i), "fam", "gold", f"# Is the star red? {i}\ndef f():", '\n    return find("red star")\n')
        for i in range(400)
    ]
    same, n = relabel_pairs(pairs, 0.0, np.random.default_rng(0))
    assert same == pairs and n == 0
    out, n = relabel_pairs(pairs, 0.5, np.random.default_rng(0))
    assert len(out) == 400 and 160 < n < 240
    assert [(p.example_id, p.family, p.kind) for p in out] == [(p.example_id, p.family, p.kind) for p in pairs]
    changed = [o for o, p in zip(out, pairs, strict=True) if o != p]
    assert n - 20 < len(changed) <= n  # a permutation can map star and red to themselves
    for o in changed:  # question and program moved together
        shape, colour = o.completion.split('"')[1].split()[::-1]
        assert o.prompt.startswith(f"# Is the {shape} {colour}?")
    with pytest.raises(ValueError, match="relabel share"):
        relabel_pairs(pairs, 1.5, np.random.default_rng(0))


def test_relabel_share_stays_out_of_the_cache_key_at_zero_and_is_checked():
    assert BootstrapConfig(relabel_share=0.0).key() == BootstrapConfig().key()
    assert BootstrapConfig(relabel_share=0.5).key() != BootstrapConfig().key()
    with pytest.raises(ValueError, match="relabel_share"):
        BootstrapConfig(relabel_share=1.2)


def test_bootstrap_records_its_relabelled_pairs(tmp_path):
    tiny = [
        "--world_train", "20", "--world_val", "4", "--copies", "1", "--max_steps", "1", "--batch_size", "4",
        "--vocab_size", "400", "--hidden_size", "16", "--num_layers", "1", "--num_heads", "2",
        "--intermediate_size", "32", "--context", "256", "--eval_val", "2", "--eval_heldout", "0",
        "--num_generations", "2", "--max_completion_length", "8", "--tool_stack", "oracle", "--threads", "1",
    ]  # fmt: skip
    summary = main(["--out", str(tmp_path / "policy"), "--seed", "2", *tiny, "--relabel_share", "1.0"])
    assert summary["relabelled_pairs"] == summary["sft_pairs"] > 0
    assert "relabelled_pairs" not in main(["--out", str(tmp_path / "plain"), "--seed", "2", *tiny])
