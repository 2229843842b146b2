"""The tiny code policy of the embedded default: a BPE tokenizer trained here on shapes-world
program text and a Llama-architecture causal LM of about a million parameters.

Nothing is downloaded. The tokenizer is a byte-level BPE with `<|bos|>`, `<|eos|>` and `<|pad|>`;
its post-processor puts `<|bos|>` in front of every encoded text (the way CodeLlama's does), so
`vprl.train.prompts.encode_prompt` gives exactly one BOS and trl's SFT/GRPO tokenization agrees with
generation. The model is `LlamaForCausalLM` with random weights sized by `TinyModelConfig`;
`vprl.train.bootstrap` turns it into an imperfect code policy by supervised training.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>")


@dataclass(frozen=True)
class TinyModelConfig:
    """Sizes of the tiny Llama. The defaults (those of `vprl.train.bootstrap`) give about 0.9M parameters
    with the ~550-token vocabulary the shapes world trains: in a 2-core, few-minute budget a model
    of width 128 learns to copy noun phrases from the question, while width 192 (1.9M) does not yet."""

    # BPE target; the trained vocabulary comes out smaller on the shapes world
    vocab_size: int = field(default=1024, metadata={"help": "tokenizer vocabulary target (>= 300)"})
    hidden_size: int = field(default=128, metadata={"help": "model width"})
    num_layers: int = field(default=4, metadata={"help": "transformer layers"})
    num_heads: int = field(default=4, metadata={"help": "attention heads (must divide hidden_size)"})
    intermediate_size: int = field(default=384, metadata={"help": "MLP width"})
    context: int = field(default=512, metadata={"help": "positions (prompt plus program)"})

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "context"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TinyModelConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"TinyModelConfig.hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads})"
            )
        if self.vocab_size < 300:
            raise ValueError(f"TinyModelConfig.vocab_size must be >= 300 (256 bytes + merges), got {self.vocab_size}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024, context: int = 512):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts`, adding `<|bos|>` to every
    encoded text (never EOS: a prompt must not end the sequence; trl appends EOS to completions)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(texts)
    if not texts:
        raise ValueError("train_tokenizer needs at least one text")
    tok = Tokenizer(models.BPE(unk_token=None))
    # Words and the runs between them are separate pieces (no GPT-2 style leading space on a
    # word): "circle" in the query and in `find("circle")` is then the same token, so copying a
    # noun phrase from the question into the program is matching equal tokens, which a tiny model
    # learns in a few hundred steps. Runs of punctuation merge into single tokens; a newline is a
    # piece of its own, so the prompt (ending with the signature's ":") and its completion (starting
    # with "\n") tokenize the same apart as together.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\w+|\n|[^\w\n]+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        padding_side="left",  # generation pads on the left; trl's collators pad on their own
        model_max_length=context,
        clean_up_tokenization_spaces=False,
    )


def build_model(tokenizer, config: TinyModelConfig, seed: int = 0):
    """A randomly initialised `LlamaForCausalLM` for `tokenizer` (its vocabulary and special ids)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    llama = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.context,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    model = LlamaForCausalLM(llama)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def load_policy(path: str | Path):
    """(model, tokenizer) saved by `vprl.train.bootstrap` (or any `save_pretrained` directory)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path}: no model here (config.json missing); build it with python -m vprl.train.bootstrap"
        )
    return AutoModelForCausalLM.from_pretrained(str(path)), AutoTokenizer.from_pretrained(str(path))
