"""The prompt builder: the API listing rendered from `vprl.executor.api`, in-context examples, the
instruction and guidelines, self-debugging and context blocks, and model framing."""

from vprl.train.prompts.examples import ExampleSet, IncontextExample, load_examples, read_examples, write_examples
from vprl.train.prompts.framing import (
    STOP_SEQUENCES,
    completion_to_program,
    encode_prompt,
    frame_prompt,
    turn_end_ids,
)
from vprl.train.prompts.prompt_config import LAYOUTS, SIGNATURES, PromptConfig
from vprl.train.prompts.render import render_api
from vprl.train.prompts.template import PreviousAttempt, PromptTemplate, build_prompt, prompt_hash

__all__ = [
    "LAYOUTS",
    "SIGNATURES",
    "STOP_SEQUENCES",
    "ExampleSet",
    "IncontextExample",
    "PreviousAttempt",
    "PromptConfig",
    "PromptTemplate",
    "build_prompt",
    "completion_to_program",
    "encode_prompt",
    "frame_prompt",
    "load_examples",
    "prompt_hash",
    "read_examples",
    "render_api",
    "turn_end_ids",
    "write_examples",
]
