"""Running one generated program: extract, normalise, compile, call, and turn the result into JSON.

This is the part of execution that is the same in-process and inside the sandbox. The sandbox
adds isolation and limits around `execute_program`; `run_in_process` is the debugging path.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import inspect
import io
import math
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

from vprl.executor.api import API_OBJECTS, ImagePatch, VideoSegment, bind_client, program_globals
from vprl.executor.api.context import ToolClient
from vprl.executor.api.errors import nearest_names
from vprl.executor.limits import MAX_ERROR, MAX_SNIPPET, MAX_STDOUT
from vprl.executor.tools.errors import ToolError, ToolUnavailable

ENTRY = "execute_command"
MAX_STR = 10_000  # longest string in an answer
MAX_NODES = 10_000  # most values in an answer
MAX_DEPTH = 20
PROGRAM_FILE = "<program>"
MAX_LINE = 1_000_000  # a line number past this is not one of a program's (a forged request)
# Taken at import: a program may rebind `sys._getframe` for its whole process before it calls a tool.
_getframe = sys._getframe


class BadReturn(Exception):
    """The program returned something that is not plain data (a generator, a file, a function)."""


@dataclass(frozen=True)
class Outcome:
    status: str  # ok | syntax_error | runtime_error | bad_return | infra_error
    answer: Any = None
    error: str | None = None


def extract_program(text: str) -> str:
    """Pull the program out of an LLM reply: drop markdown fences and prose around the code, keep
    from the first `def execute_command` (with any helper defs and imports before it) to the end
    of its body."""
    fenced = re.findall(r"```(?:python|py)?\n(.*?)```", text, flags=re.S)
    if fenced:
        text = next((block for block in fenced if f"def {ENTRY}" in block), fenced[0])
    lines = text.replace("\r\n", "\n").split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(f"def {ENTRY}")), None)
    if start is None:
        return text.strip("\n")
    # Keep imports and helper functions written just before the entry point.
    head = start
    while head > 0 and (
        lines[head - 1].strip() == ""
        or lines[head - 1][:1] in (" ", "\t")
        or lines[head - 1].startswith(("def ", "import ", "from ", "@"))
    ):
        head -= 1
    end = start + 1
    while end < len(lines) and (lines[end].strip() == "" or lines[end][:1] in (" ", "\t", "#")):
        end += 1
    return "\n".join(lines[head:end]).strip("\n") + "\n"


@contextlib.contextmanager
def quiet_compiler():
    """Without the `SyntaxWarning`s (`"is" with a literal`, a tuple called for a missing comma) that
    the compiler prints for sampled code: thousands a run, on the console of whoever trains. The
    program's outcome says what went wrong."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # invalid escape sequences before 3.12
        yield


def parse_program(source: str) -> ast.Module:
    with quiet_compiler():
        return ast.parse(source)


def program_key(source: str) -> str:
    """Key for dedup and caching: the AST round-trip (formatting and comments ignored, names kept)."""
    try:
        canonical = ast.unparse(parse_program(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        canonical = source.strip()
    return hashlib.sha1(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def line_map(ran: str, written: str) -> dict[int, int]:
    """Lines of `ran` -> the lines of the same code in `written`, for two sources of one program_key
    (one AST, other comments or layout). Walking both trees in step pairs their nodes; a line maps
    to the line of the outermost node that starts on it. Empty when the trees do not pair up."""
    try:
        pairs = zip(ast.walk(parse_program(ran)), ast.walk(parse_program(written)), strict=True)
        out: dict[int, int] = {}
        for a, b in pairs:
            if type(a) is not type(b):
                return {}
            if isinstance(getattr(a, "lineno", None), int) and isinstance(getattr(b, "lineno", None), int):
                out.setdefault(a.lineno, b.lineno)
        return out
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # zip(strict=True) raises ValueError
        return {}


def describe_error(exc: BaseException, source: str = "") -> str:
    """`Type: message (line N: code)`, short; never raises, even for hostile exceptions."""
    try:
        name = type(exc).__name__
        if isinstance(exc, NameError) and getattr(exc, "name", None):
            near = nearest_names(exc.name, list(API_OBJECTS) + dir(builtins))
            message = f"name {exc.name!r} is not defined" + (f"; did you mean {', '.join(near)}?" if near else "")
        else:
            message = str(exc)
    except Exception:  # a program's exception whose __str__ itself raises
        name, message = "Exception", "<error message could not be printed>"
    where = ""
    try:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == PROGRAM_FILE]
        if frames:
            lineno = frames[-1].lineno or 0
            lines = source.splitlines()
            code = lines[lineno - 1].strip()[:MAX_SNIPPET] if 0 < lineno <= len(lines) else ""
            where = f" (line {lineno}: {code})" if code else f" (line {lineno})"
        elif isinstance(exc, SyntaxError) and exc.lineno:
            where = f" (line {exc.lineno})"
    except Exception as tb_exc:  # a traceback we cannot walk still leaves a usable message
        where = f" (traceback unavailable: {type(tb_exc).__name__})"
    text = f"{name}: {message}{where}"
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "..."


def to_plain(value: Any) -> Any:
    """Convert a program's return value to exact built-in JSON types with caps.

    Subclasses of str/int/float are copied to the base type (a `str` subclass with a rigged
    `__eq__` must not reach the reward); an ImagePatch becomes `{"box": [l, lo, r, u]}`, a
    VideoSegment `{"segment": [start, end]}` (frames of the video, end excluded: ViperGPT's API
    prompt has a program return one); NaN and infinities become None.
    """
    budget = [MAX_NODES]

    def conv(v: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise BadReturn(f"the return value has more than {MAX_NODES} items")
        if depth > MAX_DEPTH:
            raise BadReturn(f"the return value is nested deeper than {MAX_DEPTH} levels")
        if v is None or type(v) is bool:
            return v
        if isinstance(v, str):
            s = str.__str__(v)
            return s if len(s) <= MAX_STR else s[:MAX_STR]
        if isinstance(v, int):
            return int.__int__(v)
        if isinstance(v, float):
            f = float.__float__(v)
            return f if math.isfinite(f) else None
        if isinstance(v, ImagePatch):
            return {"box": [int(v.left), int(v.lower), int(v.right), int(v.upper)]}
        if isinstance(v, VideoSegment):
            return {"segment": [int(v.start), int(v.end)]}
        if type(v).__module__ == "numpy" and hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
            return conv(v.item(), depth)
        if isinstance(v, (list, tuple)):
            # The base type's iterator: a subclass cannot rig what the reward sees.
            items = list.__iter__(v) if isinstance(v, list) else tuple.__iter__(v)
            return [conv(x, depth + 1) for x in items]
        if type(v) is dict:
            return {
                str.__str__(k) if isinstance(k, str) else str(conv(k, depth + 1)): conv(x, depth + 1)
                for k, x in dict.items(v)
            }
        raise BadReturn(
            f"execute_command returned a {type(v).__name__}, which is not an answer "
            "(return a str, number, bool, ImagePatch or a list of them)"
        )

    return conv(value, 0)


def program_line() -> int | None:
    """The line of the program (1-based, as in its source) running now: that of the innermost frame
    compiled from it, so a call made inside a helper function is the helper's line. The tool
    clients call it when a program's call enters them, for the trace the run viewer shows. None
    when no frame of the program is on the stack."""
    frame = _getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == PROGRAM_FILE:
            return frame.f_lineno
        frame = frame.f_back
    return None


def valid_line(value: Any) -> int | None:
    """A line a request reports, if it can be one (it crossed from the sandbox: the program could
    have written anything there)."""
    return value if type(value) is int and 0 < value <= MAX_LINE else None


def compile_program(source: str):
    if "\x00" in source:
        raise SyntaxError("source code contains a NUL byte")
    with quiet_compiler():
        return compile(source, PROGRAM_FILE, "exec", dont_inherit=True)


# Names the published entry points give the same input: ViperGPT's NExT-QA programs take
# `(video, possible_answers, query)`, Stanić et al.'s `(video, question, possible_answers)`.
_SAME_INPUT = {"query": "question", "question": "query"}


def call_arguments(fn, inputs: dict[str, Any]) -> dict[str, Any]:
    """Match the entry point's parameters to the inputs by name (the published NExT-QA listings
    disagree on the order and on the question's name), with the first parameter taking the visual
    input whatever its name."""
    visual = inputs.get("image", inputs.get("video"))
    kwargs: dict[str, Any] = {}
    for i, (name, param) in enumerate(inspect.signature(fn).parameters.items()):
        if name in inputs:
            kwargs[name] = inputs[name]
        elif _SAME_INPUT.get(name) in inputs:
            kwargs[name] = inputs[_SAME_INPUT[name]]
        elif i == 0 and visual is not None:
            kwargs[name] = visual
        elif param.default is inspect.Parameter.empty and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(
                f"{ENTRY}() has a parameter {name!r} that the task does not provide; available: {sorted(inputs)}"
            )
    return kwargs


def execute_program(source: str, inputs: dict[str, Any]) -> Outcome:
    """Compile and run `source`, call its entry point with `inputs`, and convert the answer.

    Assumes a tool client is bound. Every program failure becomes an Outcome; only
    `ToolUnavailable` (our failure) becomes `infra_error`.
    """
    try:
        code = compile_program(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return Outcome("syntax_error", error=describe_error(exc, source))
    namespace = program_globals()
    namespace["__builtins__"] = dict(builtins.__dict__)  # a copy: a program patching builtins hurts only itself
    try:
        exec(code, namespace)
        fn = namespace.get(ENTRY)
        if not callable(fn):
            return Outcome("syntax_error", error=f"NameError: the program defines no function {ENTRY}()")
        value = fn(**call_arguments(fn, inputs))
        return Outcome("ok", answer=to_plain(value))
    except ToolUnavailable as exc:
        return Outcome("infra_error", error=f"tool unavailable: {exc}"[:MAX_ERROR])
    except BadReturn as exc:
        return Outcome("bad_return", error=str(exc)[:MAX_ERROR])
    except ToolError as exc:
        return Outcome("runtime_error", error=describe_error(exc, source))
    except BaseException as exc:  # noqa: BLE001 — SystemExit/KeyboardInterrupt from a program are its failures
        return Outcome("runtime_error", error=describe_error(exc, source))


def run_in_process(source: str, inputs: dict[str, Any], client: ToolClient, max_stdout: int = MAX_STDOUT):
    """Run a program in this process (no isolation, no time limit): for tests and debugging.

    Returns `(Outcome, stdout, seconds)`.
    """
    out = io.StringIO()
    t0 = time.perf_counter()
    with bind_client(client), contextlib.redirect_stdout(out):
        outcome = execute_program(source, inputs)
    return outcome, out.getvalue()[:max_stdout], time.perf_counter() - t0
