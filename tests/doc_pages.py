"""The pages (README.md and docs/*.md) as tests read them: their fenced blocks, and a working
copy per page in which their examples run.

What a page may contain, and how the tests take it (tests/test_docs.py runs the examples,
tests/test_docs_static.py checks the rest):

- ```` ```python ```` blocks run in page order, in one namespace per page, in the page's
  working copy: a folder that holds ``rules/`` (the shipped rules, as from the repository
  root) and ``demo-out/gpt2.pt2`` (built as ``make demo`` builds it); the namespace starts
  with ``program``, that demo program loaded. A ``# ...`` comment right after a ``print(...)``
  line is what it prints (the comments after one print, in order; a ``# ...`` line stands for
  any number of lines).
- ```` ```console ```` blocks: each ``$`` line is run by ``sh`` in a fresh copy of the working
  copy made after the page's Python blocks ran (blocks are independent of each other; lines
  of one block run in order), with ``.venv/bin`` on ``PATH``. Its stdout and stderr together
  must read as the lines under it: timings (``1.2s``) are normalized, a ``...`` line stands
  for any number of lines and ``...`` inside a line for any text, the shipped rules' folder
  prints as ``/path/to/rewrite/rules``. A command ending in ``# exit N`` must exit with N,
  any other with 0. A console block right under a ``<!-- output of torch X.Y -->`` line shows
  what that torch release prints (counts that follow torch's decompositions): on another
  release its commands must still exit as shown, their output is not compared.
- A ``.rules`` file a console block names, that no command of the block writes and that is
  not shipped, is the plain block just above the console block (written into the working
  copy before any console block runs).
- Plain blocks (no language) are rules (each statement line parses), a command synopsis
  (``rewrite ...`` lines: the subcommands and options exist), or commands to run by hand
  (``make TARGET``, ``python -m MODULE --flags``: the target, the module and its flags exist).
  Inline code spans that are such commands are checked the same way.

The working copy of a page is built once per test run and shared by the xdist workers (a file
lock in the run's temporary folder), so the page's models are exported once.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import shutil
import sys
import traceback
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [Path("README.md"), *sorted(p.relative_to(ROOT) for p in (ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
TIME = re.compile(r"\b\d+\.\d+s\b")
SHIPPED_FOLDER = "/path/to/rewrite/rules"


class Block:
    """One fenced block of a page."""

    def __init__(self, page: Path, index: int, lang: str, text: str, line: int):
        self.page = page
        """The page, relative to the repository root."""
        self.index = index
        """Its position among the page's fenced blocks."""
        self.lang = lang
        """The fence's language: ``python``, ``console`` or ``""``."""
        self.text = text
        """Its body."""
        self.line = line
        """The page line of the body's first line (1-based)."""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def read(page: Path) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


def blocks(page: Path) -> list[Block]:
    text = read(page)
    return [Block(page, k, m[1], m[2], text.count("\n", 0, m.start(2)) + 1)
            for k, m in enumerate(FENCE.finditer(text))]


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """A console block's ``$`` commands, each with the lines shown under it."""
    found = []
    for chunk in re.split(r"(?m)^\$ ", block.text)[1:]:
        command, *expected = chunk.rstrip("\n").split("\n")
        found.append((command, expected))
    return found


OUTPUT_OF = re.compile(r"<!-- output of torch (\d+\.\d+) -->\n+```console\n$")


def output_release(block: Block) -> str | None:
    """The torch release whose output the console block shows, when the page says so."""
    text = read(block.page)
    start = sum(len(line) for line in text.splitlines(keepends=True)[:block.line - 1])
    said = OUTPUT_OF.search(text[max(0, start - 200):start])
    return said[1] if said else None


def expected_exit(command: str) -> int:
    said = re.search(r"#\s*exit (\d+)\s*$", command)
    return int(said[1]) if said else 0


def rules_files_above(page: Path) -> dict[str, str]:
    """``name.rules`` -> the plain block just above the first console block that uses it."""
    found: dict[str, str] = {}
    listed = blocks(page)
    for k, block in enumerate(listed):
        if block.lang != "console" or not k or listed[k - 1].lang != "":
            continue
        above = listed[k - 1].text
        for command, _ in commands(block):
            for name in re.findall(r"(\S+\.rules)\b", command):
                writes = re.search(rf">\s*{re.escape(name)}\b", block.text) or \
                    re.search(rf"-o\s+{re.escape(name)}\b", block.text)
                if not writes and not (ROOT / "rules" / Path(name).name).exists() \
                        and not name.startswith("rules/"):
                    found.setdefault(name, above)
    return found


def matches(expected: list[str], got: list[str]) -> bool:
    """``got`` reads as ``expected``, where a ``...`` line stands for any lines and ``...``
    inside a line for any text."""
    if not expected:
        return not got
    if expected[0].strip() == "...":
        return any(matches(expected[1:], got[k:]) for k in range(len(got) + 1))
    return bool(got) and same_line(expected[0], got[0]) and matches(expected[1:], got[1:])


def same_line(expected: str, got: str) -> bool:
    if "..." not in expected:
        return expected == got
    return re.fullmatch(".*".join(map(re.escape, expected.split("..."))), got) is not None


def normalized(text: str) -> list[str]:
    """Timings as 0.0s; the shipped rules' folder as the pages write it."""
    shipped = str(resources.files("rewrite.library"))
    return [TIME.sub("0.0s", line.rstrip()).replace(shipped, SHIPPED_FOLDER)
            for line in text.splitlines()]


def printed(code: str) -> list[list[str]]:
    """Per ``print(...)`` line followed by ``# `` comments: the lines it shows."""
    shown: list[list[str]] = []
    lines = code.splitlines()
    for k, line in enumerate(lines):
        if not line.startswith("print("):
            continue
        comments = []
        for after in lines[k + 1:]:
            if not after.startswith("#"):
                break
            comments.append(after[2:] if after.startswith("# ") else after[1:])
        if comments:
            shown.append(comments)
    return shown


# --- the working copy of a page, built once per run -------------------------------------

def shared_folder(tmp_path_factory) -> Path:
    """A folder every xdist worker of this run sees (the run's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return base / "doc-pages"


@contextlib.contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def working_directory(folder: Path):
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def demo_model(shared: Path) -> Path:
    """``demo-out/gpt2.pt2`` as ``make demo`` saves it (built once per run)."""
    path = shared / "demo" / "gpt2.pt2"
    with locked(shared / "demo.lock"):
        if not path.exists():
            import torch

            sys.path.insert(0, str(ROOT / "examples"))
            try:
                from demo import build_gpt2
            finally:
                sys.path.remove(str(ROOT / "examples"))
            model, ids, kwargs = build_gpt2(4)
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            torch.export.save(torch.export.export(model, (ids,), kwargs=kwargs), str(partial))
            partial.rename(path)
    return path


def uses_demo_program(page: Path) -> bool:
    """The page's Python reads ``program`` before a block of its own assigns it."""
    for block in blocks(page):
        if block.lang != "python":
            continue
        for line in block.text.splitlines():
            if re.search(r"\bprogram\b", line.split("#")[0]):
                return not re.match(r"\s*program\s*=", line)
    return False


def run_python(page: Path, folder: Path, demo: Path) -> None:
    """The page's Python blocks, in order, in ``folder``; raises on the first failure or
    on a print that does not show what the page says."""
    import torch

    namespace: dict = {"__name__": "__main__"}
    if uses_demo_program(page):
        namespace["program"] = torch.export.load(str(demo))
    with working_directory(folder):
        for block in blocks(page):
            if block.lang != "python":
                continue
            code = compile("\n" * (block.line - 1) + block.text, str(ROOT / page), "exec")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(code, namespace)  # noqa: S102
            got = normalized(out.getvalue())
            for shown in printed(block.text):
                if not matches(["...", *shown, "..."], got):
                    raise AssertionError(
                        f"{block.id}: the block printed\n" + "\n".join(got)
                        + "\n\nwhich does not show\n" + "\n".join(shown))


def working_copy(page: Path, tmp_path_factory) -> tuple[Path, str]:
    """The page's working copy (built once per run) and ``"ok"``, or the failure's
    traceback."""
    shared = shared_folder(tmp_path_factory)
    slug = re.sub(r"\W", "_", str(page))
    folder, status = shared / slug, shared / f"{slug}.status"
    with locked(shared / f"{slug}.lock"):
        if not status.exists():
            demo = demo_model(shared)
            if folder.exists():
                shutil.rmtree(folder)
            (folder / "demo-out").mkdir(parents=True)
            (folder / "rules").symlink_to(ROOT / "rules")
            shutil.copy(demo, folder / "demo-out" / "gpt2.pt2")
            try:
                run_python(page, folder, demo)
                for name, text in rules_files_above(page).items():
                    (folder / name).write_text(text, encoding="utf-8")
                status.write_text("ok")
            except Exception:  # noqa: BLE001 - reported by every test of the page
                status.write_text(traceback.format_exc())
    return folder, status.read_text()
