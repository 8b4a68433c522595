"""The README matches the code: its rules parse and its commands are accepted by the CLI.

(``test_readme.py`` runs the Python snippets and the console examples and compares what
they print.)
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import rewrite
from rewrite.cli.args import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, re.S)
RULE_LINES = [
    line.split("  #")[0].strip()
    for lang, body in BLOCKS if lang == ""
    for line in body.splitlines()
    if line.split(" ", 1)[0] in ("include", "group", "flat", "tag", "split")
]
COMMANDS = [
    line[2:] for lang, body in BLOCKS if lang == "console"
    for line in body.splitlines() if line.startswith("$ rewrite ")
]


def test_readme_has_examples():
    assert len(RULE_LINES) >= 15 and len(COMMANDS) >= 8


@pytest.mark.parametrize("line", RULE_LINES)
def test_rule_examples_parse(line):
    rewrite.parse_rules(line, base=ROOT / "rules")


@pytest.mark.parametrize("command", COMMANDS)
def test_commands_parse(command):
    argv = shlex.split(command)[1:]
    args = build_parser().parse_args(argv)
    assert args.command in ("check", "explain", "apply", "suggest", "export")


def test_every_shipped_rules_file_is_listed():
    shipped = {p.stem for p in (ROOT / "rules").glob("*.rules")}
    for name in shipped:
        assert f"`{name}.rules`" in README or f"`{name}`" in README, name
