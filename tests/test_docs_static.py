"""The pages match the code without running models: their rules parse, their commands name
subcommands, options, make targets and modules that exist, their links and anchors resolve.

(tests/test_docs.py runs the pages' Python and console examples; conventions:
tests/doc_pages.py.)
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

import rewrite
from rewrite.cli.args import build_parser
from tests import doc_pages
from tests.doc_pages import ROOT

RULE_KEYWORDS = ("include", "group", "flat", "tag", "split", "on")
BLOCKS = doc_pages.all_blocks()
PLAIN = [b for b in BLOCKS if b.lang == ""]
RESULTS = Path("bench/RESULTS.md")


def code_lines(block: doc_pages.Block) -> list[str]:
    return [line for line in block.text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def kind(block: doc_pages.Block) -> str | None:
    """What a plain block is: rules, a ``rewrite`` synopsis, or commands to run by hand."""
    lines = code_lines(block)
    if all(line.split(" ", 1)[0] in RULE_KEYWORDS for line in lines):
        return "rules"
    if all(line.startswith("rewrite ") or line.startswith(" ") for line in lines):
        return "synopsis"
    if all(re.match(r"(nice )?(make |python |\.venv/bin/python )", line) for line in lines):
        return "commands"
    return None


def prose(page: Path) -> str:
    """The page without its fenced blocks."""
    return doc_pages.FENCE.sub("", doc_pages.read(page))


def spans(page: Path) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(page))


AS_FILES = {text for page in doc_pages.PAGES for text in doc_pages.rules_files_above(page).values()}
"""Rules blocks a console block uses as a file (tested there: some are wrong on purpose)."""
RULE_LINES = [(b.id, line.split("  #")[0].strip()) for b in PLAIN
              if kind(b) == "rules" and b.text not in AS_FILES for line in code_lines(b)]
SYNOPSIS = [line.split("  #")[0].strip() for b in PLAIN if kind(b) == "synopsis"
            for line in code_lines(b) if line.startswith("rewrite ")] + \
    [s for page in doc_pages.PAGES for s in spans(page) if re.match(r"rewrite (-\w+ )*[a-z]", s)]
BY_HAND = [line.split("  #")[0].strip() for b in PLAIN if kind(b) == "commands"
           for line in code_lines(b)] + \
    [s for page in [*doc_pages.PAGES, RESULTS] for s in spans(page)
     if re.match(r"(nice )?(make [a-z]|(\.venv/bin/)?python -m )", s)]
CONSOLE_COMMANDS = [command for b in BLOCKS if b.lang == "console"
                    for command, _ in doc_pages.commands(b) if command.startswith("rewrite ")]


def test_the_readme_is_short():
    assert len(doc_pages.read(Path("README.md")).splitlines()) <= 250


def test_pages_have_examples():
    assert len(RULE_LINES) >= 30 and len(SYNOPSIS) >= 15 and len(BY_HAND) >= 15
    assert len(CONSOLE_COMMANDS) >= 20


CONTRIBUTOR_PAGES = {Path("docs/ARCHITECTURE.md"), Path("docs/MATRIX.md")}
"""Pages for contributors, with pictures of the code (trees, tables) in plain blocks: their
examples run and their links resolve, but their blocks need not be examples."""


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.page not in CONTRIBUTOR_PAGES],
                         ids=lambda b: b.id)
def test_every_block_is_one_the_tests_take(block):
    """A block the tests would neither run nor check is a block that can go stale."""
    assert block.lang in ("python", "console", ""), block.lang
    if block.lang == "":
        assert kind(block), "a plain block must be rules, a rewrite synopsis or make / " \
            "python -m commands; show output under a $ command in a console block"


@pytest.mark.parametrize("line", [line for _, line in RULE_LINES],
                         ids=[where for where, _ in RULE_LINES])
def test_rule_lines_parse(line):
    rewrite.parse_rules(line, base=ROOT / "rules")


def _subparsers():
    parser = build_parser()
    (action,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return parser, action.choices


@pytest.mark.parametrize("line", SYNOPSIS)
def test_synopsis_names_commands_and_options_that_exist(line):
    parser, commands = _subparsers()
    words = line.split()[1:]
    while words and words[0].startswith("-"):
        assert words.pop(0) in parser._option_string_actions, line
    if not words:
        return
    names = words[0].split("|")
    for name in names:
        assert name in commands, f"{line}: no command {name!r}"
    for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", " ".join(words[1:])):
        for name in names:
            assert option in commands[name]._option_string_actions \
                or option in parser._option_string_actions, f"{line}: {name} has no {option}"


@pytest.mark.parametrize("command", CONSOLE_COMMANDS)
def test_console_commands_parse(command):
    argv = shlex.split(command, comments=True)[1:]  # as sh reads it
    if any(word in ("|", ">") for word in argv):
        argv = argv[:min(argv.index(w) for w in ("|", ">") if w in argv)]
    args = build_parser().parse_args(argv)
    assert args.command in _subparsers()[1]


def _makefile_targets() -> set[str]:
    return set(re.findall(r"(?m)^([\w-]+):", (ROOT / "Makefile").read_text()))


def _flag_defined(module: str, flag: str) -> bool:
    """``flag`` is a quoted string in the module's package (where its arguments are declared)."""
    package = ROOT / module.split(".")[0]
    return any(f'"{flag}"' in p.read_text(encoding="utf-8") for p in package.rglob("*.py"))


@pytest.mark.parametrize("line", BY_HAND)
def test_commands_to_run_by_hand_exist(line):
    words = line.split()
    if words[0] == "nice":
        words.pop(0)
    if words[0] == "make":
        assert words[1] in _makefile_targets(), f"{line}: no make target {words[1]!r}"
        return
    assert words[1] == "-m", line
    module = words[2]
    assert importlib.util.find_spec(module) is not None, f"{line}: no module {module!r}"
    if (ROOT / module.split(".")[0]).is_dir() and module.split(".")[0] != "rewrite":
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", " ".join(words[3:])):
            assert _flag_defined(module, flag), f"{line}: {module} has no {flag}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"(?m)^#+ (.+)$", doc_pages.FENCE.sub("", path.read_text())):
        slug, k = _slug(heading), 1
        while slug in found:
            slug, k = f"{_slug(heading)}-{k}", k + 1
        found.add(slug)
    return found


LINKS = [(page, target) for page in [*doc_pages.PAGES, RESULTS]
         for target in re.findall(r"\]\(([^)\s]+)\)", prose(page))
         if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page, target", LINKS, ids=[f"{p}->{t}" for p, t in LINKS])
def test_links_resolve(page, target):
    path, _, anchor = target.partition("#")
    where = (ROOT / page).parent / path if path else ROOT / page
    assert where.exists(), f"{page}: {target}: no such file"
    if anchor:
        assert anchor in _anchors(where), f"{page}: {target}: no heading with that anchor"


def test_every_shipped_rules_file_is_listed():
    listed = doc_pages.read(Path("docs/rules.md"))
    for path in (ROOT / "rules").glob("*.rules"):
        assert f"`{path.name}`" in listed, path.name
