"""`--help` of every command line says what each option is for: no option is bare (or only its
default), and the commands built from config dataclasses list `--config`."""

from __future__ import annotations

import re

import pytest
from test_bad_input import run_main

COMMANDS = [
    ("vprl/train/rl.py", []),
    ("vprl.train.prepare_unit_tests", []),
    ("vprl.train.recipe", []),
    ("vprl.train.evaluation", []),
    ("vprl.train.quickstart", []),
    ("vprl.train.bootstrap", []),
    ("vprl.train.ace", []),
    ("vprl.train.ace", ["from-run"]),
    ("vprl.train.ace", ["stanic"]),
    ("vprl.train.export", []),
    ("vprl.executor.run", []),
    ("vprl.executor.serve", []),
    ("vprl.data.shapes", []),
    ("vprl.train.view", []),
    ("vprl.train.integrations.verl_data", []),
]
CONFIG_COMMANDS = {
    "vprl/train/rl.py",
    "vprl.train.prepare_unit_tests",
    "vprl.train.evaluation",
    "vprl.train.quickstart",
    "vprl.train.bootstrap",
}


def option_texts(help_text: str) -> dict[str, str]:
    """Each option of an argparse help (`  --name ...  text`, text continued on deeper-indented lines)
    and its text without the `(default: ...)` argparse appends."""
    options: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        if re.match(r"^  -", line):
            invocation, _, text = line.strip().partition("  ")
            current = invocation.split(",")[0].split()[0]
            options[current] = text.strip()
        elif current and line.startswith("    ") and line.strip():
            options[current] += " " + line.strip()
        else:
            current = None
    return {name: re.sub(r"\(default: .*?\)", "", text, flags=re.S).strip() for name, text in options.items()}


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import:RuntimeWarning")
@pytest.mark.parametrize(("command", "sub"), COMMANDS, ids=[" ".join([c, *s]) for c, s in COMMANDS])
def test_every_option_has_help(command, sub, monkeypatch, capsys):
    assert run_main(command, [*sub, "--help"], monkeypatch) == 0
    out = capsys.readouterr().out
    options = option_texts(out)
    bare = sorted(name for name, text in options.items() if not text)
    assert not bare, f"{command} {' '.join(sub)}: options without help: {bare}"
    if command in CONFIG_COMMANDS:
        assert "--config" in options and len(options) > 5, out[:500]
    if command != "vprl.train.recipe":
        assert options, out[:500]


def test_the_parser_of_help_texts_finds_a_bare_option():
    text = "options:\n  -h, --help  show this\n  --lora_r LORA_R\n  --seed SEED  the seed (default: 0)\n"
    assert option_texts(text) == {"-h": "show this", "--lora_r": "", "--seed": "the seed"}
