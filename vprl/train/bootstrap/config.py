"""The tiny policy's bootstrap recipe (`BootstrapConfig`) and its cache key: what makes a cached
policy the one a config asks for (`vprl.train.bootstrap.fit` builds it)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields

from vprl.rewards.feedback import PARTS
from vprl.train.bootstrap.repair_pairs import REPAIR_FEEDBACK, REPAIR_FORMAT
from vprl.train.policy.tiny import TinyModelConfig

VERSION = 1  # bump when the recipe changes so cached policies are rebuilt
TASKS = ("vqa", "itm", "grounding")
# Keys added after policies were cached: at these values they stay out of the cache key, so the
# quickstart's policy keeps its key (and its documented figures).
LATER_KEYS = {
    "tasks": ["vqa"],
    "world_winoground": 4,
    "world_sugarcrepe": 1,
    "world_refcoco": 4,
    "repair_share": 0.0,
    "repair_noun_share": 0.0,
    "relabel_share": 0.0,
    "init_seed": -1,
    "noun_weight": 1.0,
    "repair_feedback": list(REPAIR_FEEDBACK.show),
}


# The names the cache key has always used for settings since renamed (docs/configs.md): a policy
# built before the renaming is still found.
KEY_NAMES = {
    "tool_stack": "tools",
    "num_generations": "eval_samples",
    "temperature": "eval_temperature",
    "top_p": "eval_top_p",
    "max_completion_length": "eval_max_new_tokens",
}


@dataclass(frozen=True)
class BootstrapConfig(TinyModelConfig):
    """The tiny policy's recipe: the model's sizes (`TinyModelConfig`'s fields), then these."""

    out: str = field(default="runs/tiny_policy", metadata={"help": "folder of the policy (cached by this recipe)"})
    seed: int = field(default=0, metadata={"help": "seed of the world, the mixture and (unless init_seed) training"})
    init_seed: int = field(
        default=-1,
        metadata={
            "help": "seed of the initial weights and of SFT's order and dropout (-1: `seed`'s); world and mixture keep `seed`"
        },
    )
    # the world trained on (its validation questions are the evaluation's)
    world_train: int = field(default=1100, metadata={"help": "training images of the shapes world"})
    world_val: int = field(default=150, metadata={"help": "validation images of the shapes world"})
    world_winoground: int = field(default=4, metadata={"help": "Winoground-style examples of the world"})
    world_sugarcrepe: int = field(default=1, metadata={"help": "SugarCREPE-style entries per category"})
    world_refcoco: int = field(default=4, metadata={"help": "RefCOCO-style images of the world"})
    tasks: list[str] = field(
        default_factory=lambda: ["vqa"],
        metadata={"help": "tasks whose programs the policy learns: vqa, and itm / grounding (weak, for mixtures)"},
    )
    # the mixture
    weak_share: float = field(
        default=0.6, metadata={"help": "share of training families whose greedy program is wrong"}
    )
    gold_strong: float = field(default=0.85, metadata={"help": "P(gold program) in a strong family"})
    gold_weak: float = field(default=0.3, metadata={"help": "P(gold program) in a weak family"})
    dominant: float = field(
        default=0.75, metadata={"help": "share of a weak family's mistakes that are its dominant one"}
    )
    copies: int = field(default=2, metadata={"help": "target programs drawn per training question"})
    relabel_share: float = field(
        default=0.0,
        metadata={"help": "share of the question pairs with shape and colour words permuted in both (relabel.py)"},
    )
    repair_share: float = field(
        default=0.0, metadata={"help": "share of the pairs that are repair examples (repair_pairs.py)"}
    )
    repair_noun_share: float = field(
        default=0.0,
        metadata={"help": "share of the repair examples whose wrong program names another shape (wrong_noun)"},
    )
    repair_feedback: list[str] = field(
        default_factory=lambda: list(REPAIR_FEEDBACK.show),
        metadata={"help": "what the repair examples' feedback shows (vprl.rewards.feedback.PARTS, no verdict)"},
    )
    # supervised training
    epochs: float = field(default=3.0, metadata={"help": "passes over the mixture"})
    max_steps: int = field(default=-1, metadata={"help": "stop after this many steps (-1: epochs decide)"})
    batch_size: int = field(default=16, metadata={"help": "sequences per step"})
    learning_rate: float = field(default=5e-3, metadata={"help": "peak learning rate"})
    noun_weight: float = field(
        default=1.0, metadata={"help": "loss weight of the target programs' shape and colour words (noun_weight.py)"}
    )
    warmup_steps: float = field(default=0.05, metadata={"help": "warm-up: steps, or a ratio of all steps below 1"})
    # evaluation: greedy and sampled programs on `eval_val` questions of the training families on new
    # images and `eval_heldout` of the held-out families
    tool_stack: str = field(
        default="shapes", metadata={"help": "tools of the evaluation: oracle | shapes | a tool-stack YAML"}
    )
    eval_val: int = field(default=80, metadata={"help": "training-family questions on new images"})
    eval_heldout: int = field(default=50, metadata={"help": "held-out-family questions"})
    num_generations: int = field(default=8, metadata={"help": "programs sampled per question"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass"})
    # the longest shapes-world program is about 90 tokens
    max_completion_length: int = field(default=160, metadata={"help": "program length limit in tokens"})
    # how it runs (not in the cache key)
    executor_slots: int = field(default=2, metadata={"help": "programs run in parallel (not in the cache key)"})
    threads: int = field(default=2, metadata={"help": "torch CPU threads (not in the cache key)"})
    executor_sandbox: str = field(
        default="auto",
        metadata={
            "help": "auto (full where namespaces work, else restricted) | full | restricted | none (debugging only)"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # the sizes
        for name in ("weak_share", "gold_strong", "gold_weak", "dominant", "relabel_share"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"BootstrapConfig.{name} must be in [0, 1], got {value}")
        if not 0 <= self.repair_share < 1:
            raise ValueError(f"BootstrapConfig.repair_share must be in [0, 1), got {self.repair_share}")
        if not 0 <= self.repair_noun_share <= 1:
            raise ValueError(f"BootstrapConfig.repair_noun_share must be in [0, 1], got {self.repair_noun_share}")
        for name in (
            "world_train",
            "world_val",
            "copies",
            "batch_size",
            "threads",
            "num_generations",
            "executor_slots",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"BootstrapConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.noun_weight <= 0:
            raise ValueError(f"BootstrapConfig.noun_weight must be > 0, got {self.noun_weight}")
        if self.init_seed < -1:
            raise ValueError(f"BootstrapConfig.init_seed must be -1 (the seed's) or >= 0, got {self.init_seed}")
        for name in ("world_winoground", "world_sugarcrepe", "world_refcoco"):
            if getattr(self, name) < 0:
                raise ValueError(f"BootstrapConfig.{name} must be >= 0, got {getattr(self, name)}")
        shown = [p for p in self.repair_feedback if p not in PARTS or p == "verdict"]
        if shown:
            raise ValueError(
                f"BootstrapConfig.repair_feedback: {shown} not among {[p for p in PARTS if p != 'verdict']}"
                " (the repair examples are judged by unit tests, never a label)"
            )
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or "vqa" not in self.tasks:
            raise ValueError(f"BootstrapConfig.tasks: {list(self.tasks)} must hold vqa and only {', '.join(TASKS)}")

    @property
    def training_seed(self) -> int:
        """The initial weights' and SFT's seed: `init_seed`, or `seed` where it is -1 (every policy
        built before `init_seed` existed), so a seed's world can be trained from other weights."""
        return self.seed if self.init_seed == -1 else self.init_seed

    def model_config(self) -> TinyModelConfig:
        return TinyModelConfig(**{f.name: getattr(self, f.name) for f in fields(TinyModelConfig)})

    def key(self) -> str:
        """Hash of everything that changes the policy (not where it is written, nor how many
        sandbox slots evaluate it, nor in which sandbox)."""
        data = {
            KEY_NAMES.get(k, k): v
            for k, v in asdict(self).items()
            if k not in ("out", "executor_slots", "threads", "executor_sandbox")
        }
        data = {k: v for k, v in data.items() if not (k in LATER_KEYS and v == LATER_KEYS[k])}
        if self.repair_share > 0:  # the repair examples' text is part of the policy
            data["repair_format"] = REPAIR_FORMAT
        return hashlib.sha256(json.dumps({"v": VERSION, **data}, sort_keys=True).encode()).hexdigest()[:16]
