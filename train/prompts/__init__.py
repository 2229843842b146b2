"""The prompt builder: the API listing rendered from `executor.api`, in-context examples, the
instruction and guidelines, self-debugging and context blocks, and model framing."""

from train.prompts.examples import ExampleSet, IncontextExample, load_examples, read_examples, write_examples
from train.prompts.framing import STOP_SEQUENCES, completion_to_program, encode_prompt, frame_prompt
from train.prompts.prompt_config import LAYOUTS, SIGNATURES, PromptConfig
from train.prompts.render import render_api
from train.prompts.template import PreviousAttempt, PromptTemplate, build_prompt, prompt_hash

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
    "write_examples",
]
