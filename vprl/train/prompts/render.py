"""Render the API listing the LLM sees from the real classes and functions in `vprl.executor.api`.

The listing is Python source the model can imitate: `import math`, each class of the variant with
its docstring and the shown members as `def name(self, ...) -> T:` plus docstring (body elided
with `...`), then the module functions. Signatures and docstrings are read with `inspect` on every
call, so editing a docstring in `vprl/executor/api` changes the prompt and nothing can drift.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from vprl.executor.api import API_OBJECTS
from vprl.executor.api.spec import ApiVariant, get_variant

INDENT = "    "
HEADER = "import math\n"

# A numpydoc section header: a title line followed by a line of dashes of the same length.
_SECTION = re.compile(r"^(?P<title>[A-Za-z][A-Za-z ]*)\n-{3,}$", re.M)


def render_api(variant: str | ApiVariant) -> str:
    """The API listing of a variant (a name from `vprl.executor.api.spec.VARIANTS` or an `ApiVariant`)."""
    spec = get_variant(variant) if isinstance(variant, str) else variant
    blocks = [HEADER]
    for class_name, members in spec.classes:
        blocks.append(render_class(_lookup(spec.name, class_name), members, variant_name=spec.name))
    for func_name in spec.functions:
        blocks.append(render_function(_lookup(spec.name, func_name)))
    return "\n\n\n".join(block.rstrip("\n") for block in blocks) + "\n"


def render_class(cls: type, members: tuple[str, ...], *, variant_name: str = "") -> str:
    """`class Name:` with its docstring (Methods section limited to the shown members) and members."""
    lines = [f"class {cls.__name__}:"]
    doc = inspect.getdoc(cls)
    if doc:
        lines.append(_docstring(_class_doc(cls, doc, members), INDENT))
    for name in members:
        try:
            raw = inspect.getattr_static(cls, name)
        except AttributeError:
            raise ValueError(
                f"API variant {variant_name!r} shows {cls.__name__}.{name}, which does not exist in vprl.executor.api"
            ) from None
        lines.append("")
        lines.append(_render_member(name, raw).rstrip("\n"))
    return "\n".join(lines) + "\n"


def render_function(func: Any, indent: str = "", decorator: str | None = None, name: str | None = None) -> str:
    """`def name(params) -> T:` with its docstring and an elided body."""
    lines = [f"{indent}@{decorator}"] if decorator else []
    lines.append(f"{indent}def {name or func.__name__}{format_signature(func)}:")
    doc = inspect.getdoc(func)
    if doc:
        lines.append(_docstring(doc, indent + INDENT))
    lines.append(f"{indent}{INDENT}...")
    return "\n".join(lines) + "\n"


def format_signature(func: Any) -> str:
    """`(a: int, b: str = None) -> bool`, with annotations written as in the source.

    `str(inspect.Parameter)` would quote string annotations (`'int'`) because the API modules use
    postponed evaluation, so the parameters are formatted here.
    """
    sig = inspect.signature(func)
    parts: list[str] = []
    kinds = [p.kind for p in sig.parameters.values()]
    for i, param in enumerate(sig.parameters.values()):
        # A bare `*` goes before the first keyword-only parameter when there is no `*args`.
        earlier = kinds[:i]
        if param.kind is inspect.Parameter.KEYWORD_ONLY and not (
            inspect.Parameter.VAR_POSITIONAL in earlier or inspect.Parameter.KEYWORD_ONLY in earlier
        ):
            parts.append("*")
        text = param.name
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            text = "*" + text
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            text = "**" + text
        if param.annotation is not inspect.Parameter.empty:
            text += f": {_annotation(param.annotation)}"
        if param.default is not inspect.Parameter.empty:
            text += (
                f" = {param.default!r}" if param.annotation is not inspect.Parameter.empty else f"={param.default!r}"
            )
        parts.append(text)
        if param.kind is inspect.Parameter.POSITIONAL_ONLY and (
            i + 1 == len(kinds) or kinds[i + 1] is not inspect.Parameter.POSITIONAL_ONLY
        ):
            parts.append("/")
    out = f"({', '.join(parts)})"
    if sig.return_annotation is not inspect.Signature.empty:
        out += f" -> {_annotation(sig.return_annotation)}"
    return out


def _render_member(name: str, raw: Any) -> str:
    if isinstance(raw, property):
        if raw.fget is None:
            raise ValueError(f"property {name!r} has no getter to render")
        return render_function(raw.fget, INDENT, decorator="property", name=name)
    if isinstance(raw, classmethod):
        return render_function(raw.__func__, INDENT, decorator="classmethod", name=name)
    if isinstance(raw, staticmethod):
        return render_function(raw.__func__, INDENT, decorator="staticmethod", name=name)
    if callable(raw):
        return render_function(raw, INDENT, name=name)
    raise ValueError(f"cannot render API member {name!r} of type {type(raw).__name__}")


def _class_doc(cls: type, doc: str, members: tuple[str, ...]) -> str:
    """Rewrite the docstring's "Methods" section to list exactly the shown methods, so a variant
    that hides a method does not advertise it in the class summary."""
    headers = list(_SECTION.finditer(doc))
    for i, match in enumerate(headers):
        if match.group("title").strip() != "Methods":
            continue
        end = headers[i + 1].start() if i + 1 < len(headers) else len(doc)
        summary = []
        for name in members:
            raw = inspect.getattr_static(cls, name, None)
            if name.startswith("_") or isinstance(raw, property) or raw is None:
                continue
            func = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
            summary.append(f"{name}{_method_summary(func, isinstance(raw, staticmethod))}")
        tail = doc[end:]
        section = match.group(0) + "\n" + "\n".join(summary) + ("\n\n" if tail else "")
        return (doc[: match.start()] + section + tail).rstrip()
    return doc


def _method_summary(func: Any, is_static: bool) -> str:
    """The signature without `self`/`cls`, as the class summary shows it."""
    text = format_signature(func)
    if not is_static:
        text = re.sub(r"^\((self|cls)(, )?", "(", text)
    return text


def _annotation(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    return inspect.formatannotation(annotation)


def _docstring(doc: str, indent: str) -> str:
    """A triple-quoted docstring at `indent` that parses back to `doc`."""
    text = doc.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    if text.startswith('"'):
        text = " " + text  # `""""yes"` would close the string early in the reader's eye
    lines = text.split("\n")
    if len(lines) == 1:
        if text.endswith('"'):
            text = text[:-1] + '\\"'  # a quote right before the closing ones would end the string
        return f'{indent}"""{text}"""'
    body = "\n".join(f"{indent}{line}" if line.strip() else "" for line in lines[1:])
    return f'{indent}"""{lines[0]}\n{body}\n{indent}"""'


def _lookup(variant_name: str, name: str) -> Any:
    try:
        return API_OBJECTS[name]
    except KeyError:
        raise ValueError(
            f"API variant {variant_name!r} shows {name!r}, which is not in vprl.executor.api.API_OBJECTS"
        ) from None
