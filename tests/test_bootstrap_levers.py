"""The bootstrap's levers on whether its policy copies its question's nouns: relabelled pairs
(`relabel.py`: shape and colour words permuted in a pair's question and program alike give the
right program of the permuted question), the initial weights' own seed (`init_seed`), a heavier
loss on the programs' nouns (`noun_weight.py`), and the figure that reads the copy
(`noun_copy.py`). Each is out of the cache key at its default."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from vprl.data.records import Example
from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.scene import COLORS, SHAPES
from vprl.train.bootstrap.fit import BootstrapConfig, main
from vprl.train.bootstrap.noun_copy import noun_copy
from vprl.train.bootstrap.noun_weight import noun_token_ids, noun_weighted_loss
from vprl.train.bootstrap.pairs import SFTPair, body
from vprl.train.bootstrap.relabel import permutation, relabel_pairs, relabel_text
from vprl.train.policy.tiny import TinyModelConfig, build_model, train_tokenizer
from vprl.train.prompts import PromptConfig, build_prompt


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


TINY = [
    "--world_train", "20", "--world_val", "4", "--copies", "1", "--max_steps", "1", "--batch_size", "4",
    "--vocab_size", "1024", "--hidden_size", "16", "--num_layers", "1", "--num_heads", "2",
    "--intermediate_size", "32", "--context", "256", "--eval_val", "2", "--eval_heldout", "0",
    "--num_generations", "2", "--max_completion_length", "8", "--tool_stack", "oracle", "--threads", "1",
]  # fmt: skip


def test_bootstrap_records_its_relabelled_pairs_and_its_noun_copy(tmp_path):
    summary = main(["--out", str(tmp_path / "policy"), "--seed", "2", *TINY, "--relabel_share", "1.0"])
    assert summary["relabelled_pairs"] == summary["sft_pairs"] > 0
    plain = main(["--out", str(tmp_path / "plain"), "--seed", "2", *TINY])
    assert "relabelled_pairs" not in plain
    copy = plain["noun_copy"]["val"]["shape"]
    assert copy["questions"] >= 1 and 0 <= copy["p_right"] <= 1 and 0 <= copy["argmax_right"] <= 1


def test_init_seed_changes_the_weights_and_nothing_of_the_data(tmp_path):
    """`init_seed` equal to the seed is the seed's own policy, weight for weight; another one trains
    other weights on the same world and the same mixture."""
    runs = {name: main(["--out", str(tmp_path / name), "--seed", "2", *TINY, *more]) for name, more in (
        ("own", []), ("same", ["--init_seed", "2"]), ("other", ["--init_seed", "5"]))}  # fmt: skip
    weights = {name: load_file(str(tmp_path / name / "model.safetensors")) for name in runs}
    assert weights["own"].keys() == weights["other"].keys()
    assert all(torch.equal(weights["own"][k], weights["same"][k]) for k in weights["own"])
    assert not all(torch.equal(weights["own"][k], weights["other"][k]) for k in weights["own"])
    assert (
        runs["own"]["mixture"] == runs["other"]["mixture"] and runs["own"]["sft_pairs"] == runs["other"]["sft_pairs"]
    )
    assert BootstrapConfig(init_seed=-1).key() == BootstrapConfig().key() != BootstrapConfig(init_seed=0).key()
    with pytest.raises(ValueError, match="init_seed"):
        BootstrapConfig(init_seed=-2)


QUESTIONS = {
    "Is the star red?": 'def execute_command(image):\n    return bool_to_yesno(ImagePatch(image).exists("red star"))\n',
    "How many circles are there?": 'def execute_command(image):\n    return str(len(ImagePatch(image).find("circles")))\n',
    "Is the hexagon above the square?": 'def execute_command(image):\n    a = ImagePatch(image).find("hexagon")[0]\n',
    "What color is the large blue object?": 'def execute_command(image):\n    return ImagePatch(image).find("blue object")\n',
}


class _Policy(torch.nn.Module):
    """Next-token logits from the text so far: a copier favours the first shape and the first colour
    of the question's line, a recaller always "triangle" and "green"."""

    def __init__(self, tokenizer, copies: bool):
        super().__init__()
        self.tokenizer, self.copies = tokenizer, copies

    def forward(self, input_ids, attention_mask=None):
        question = self.tokenizer.decode(input_ids[0], skip_special_tokens=True).split("\n")[0]
        logits = torch.zeros(1, input_ids.shape[1], len(self.tokenizer))
        for words, recalled in ((SHAPES, "triangle"), (COLORS, "green")):
            word = min((w for w in words if w in question), key=question.find, default=recalled)
            logits[0, -1, self.tokenizer.convert_tokens_to_ids(word if self.copies else recalled)] = 4.0
        return SimpleNamespace(logits=logits)


def test_noun_copy_reads_whether_the_policy_copies_its_questions_shape_and_colour():
    texts = [build_prompt(q, PromptConfig(layout="bare")) + body(p) for q, p in QUESTIONS.items()] * 20
    tokenizer = train_tokenizer(texts + [" ".join(SHAPES + COLORS)] * 20, vocab_size=400, context=128)
    examples = [
        Example(id=str(i), dataset="shapes", task="vqa", query=q, image="x.png")
        for i, q in enumerate([*QUESTIONS, "Is the star red?"])
    ]
    favoured = {kind: np.exp(4.0) / (np.exp(4.0) + n - 1) for kind, n in (("shape", 5), ("colour", 8))}
    copier = noun_copy(_Policy(tokenizer, True), tokenizer, examples, QUESTIONS)
    # distinct questions, and only those whose program names a word of the kind
    assert copier["shape"]["questions"] == 3 and copier["colour"]["questions"] == 2
    recaller = noun_copy(_Policy(tokenizer, False), tokenizer, examples, QUESTIONS)
    for kind, n in (("shape", 5), ("colour", 8)):
        assert copier[kind]["p_right"] == pytest.approx(favoured[kind], abs=1e-4)
        assert copier[kind]["argmax_right"] == 1.0
        assert recaller[kind]["p_right"] == pytest.approx((1 - favoured[kind]) / (n - 1), abs=1e-4)
        assert recaller[kind]["argmax_right"] == 0.0
    small = train_tokenizer(["# Is the star red?"] * 5, vocab_size=300, context=64)  # no "hexagon" token
    skipped = noun_copy(_Policy(small, True), small, examples, QUESTIONS)["shape"]
    assert skipped["questions"] == 0 and skipped["p_right"] is None and "hexagon" in skipped["skipped"]


@pytest.fixture(scope="module")
def weighted_batch():
    """A tiny Llama, a tokenizer holding every shape and colour word whole, and a batch of three
    question-program pairs labelled as SFT's completion-only collator labels them."""
    texts = [build_prompt(q, PromptConfig(layout="bare")) + body(p) for q, p in QUESTIONS.items()]
    tokenizer = train_tokenizer(texts * 20 + [" ".join(SHAPES + COLORS)] * 20, vocab_size=400, context=128)
    config = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model = build_model(tokenizer, config, seed=0)
    rows = [tokenizer(t)["input_ids"] for t in texts[:3]]
    width = max(map(len, rows))
    input_ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    labels = input_ids.clone()
    for i, (query, row) in enumerate(zip(QUESTIONS, rows)):
        prompt = len(tokenizer(build_prompt(query, PromptConfig(layout="bare")))["input_ids"])
        labels[i, :prompt] = -100
        labels[i, len(row) :] = -100
    attention = (labels != -100) | (torch.arange(width) < torch.tensor([len(r) for r in rows])[:, None])
    return tokenizer, model, input_ids, labels, attention.long(), [body(p) for p in QUESTIONS.values()]


def test_noun_weight_one_is_the_models_own_loss(weighted_batch):
    tokenizer, model, input_ids, labels, attention, programs = weighted_batch
    out = model(input_ids=input_ids, attention_mask=attention, labels=labels)
    ours = noun_weighted_loss(tokenizer, 1.0, programs)(out, labels)
    assert ours.item() == pytest.approx(out.loss.item(), rel=1e-6)


def test_noun_weight_multiplies_the_nouns_gradient_and_leaves_the_rest(weighted_batch):
    """The training signal: the gradient of the loss with respect to the logits is W times the
    unweighted one at a position whose target is a shape or colour word, the same elsewhere in the
    program, and zero on the prompt."""
    tokenizer, model, input_ids, labels, attention, programs = weighted_batch
    grads = {}
    for weight in (1.0, 4.0):
        logits = model(input_ids=input_ids, attention_mask=attention).logits.detach().requires_grad_(True)
        noun_weighted_loss(tokenizer, weight, programs)(SimpleNamespace(logits=logits), labels).backward()
        grads[weight] = logits.grad[:, :-1]
    target = labels[:, 1:]
    nouns = torch.isin(target, torch.tensor(noun_token_ids(tokenizer, programs)))
    assert nouns.sum() >= 3 and (target != -100).sum() > nouns.sum() * 3
    assert torch.allclose(grads[4.0][nouns], 4 * grads[1.0][nouns], atol=1e-7)
    rest = (target != -100) & ~nouns
    assert torch.allclose(grads[4.0][rest], grads[1.0][rest], atol=1e-7)
    assert grads[1.0][rest].abs().sum() > 0
    assert grads[4.0][target == -100].abs().sum() == 0


def test_noun_weight_names_the_words_the_tokenizer_splits_and_stays_out_of_the_key():
    small = train_tokenizer(["# Is the star red?"] * 5, vocab_size=300, context=64)
    with pytest.raises(ValueError, match="hexagon"):
        noun_token_ids(small, ['find("red hexagon")'])
    assert noun_token_ids(small, ['find("red star")']) == [small.get_vocab()["star"], small.get_vocab()["red"]]
    assert BootstrapConfig(noun_weight=1.0).key() == BootstrapConfig().key() != BootstrapConfig(noun_weight=3).key()
    with pytest.raises(ValueError, match="noun_weight"):
        BootstrapConfig(noun_weight=0)


def test_bootstrap_trains_with_the_weighted_loss(tmp_path):
    plain = main(["--out", str(tmp_path / "plain"), "--seed", "2", *TINY])
    weighted = main(["--out", str(tmp_path / "weighted"), "--seed", "2", *TINY, "--noun_weight", "5"])
    assert weighted["config"]["noun_weight"] == 5 and weighted["mixture"] == plain["mixture"]
    # the same first batch from the same weights: only the loss differs
    assert weighted["training"]["train_loss"] > plain["training"]["train_loss"]
