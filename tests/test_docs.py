"""The pages, executed: README.md's and docs/*.md's Python blocks run, and each console block
prints what the page shows (conventions: tests/doc_pages.py).

One test per page for its Python blocks (they build the page's working copy, once per run,
shared by the xdist workers) and one per console block (in a copy of it), so the examples of
a page run side by side. A plain ``rewrite ...`` command runs through the command's ``main``
in the test's process (tests/test_cli_process.py covers the ``rewrite`` script as a process);
the others in ``sh``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import doc_pages

PYTHON_PAGES = [page for page in doc_pages.PAGES
                if any(b.lang == "python" for b in doc_pages.blocks(page))]
CONSOLE = [b for b in doc_pages.all_blocks() if b.lang == "console"]
SLOW_PAGES = {Path("docs/checkpoints.md")}
"""Pages whose examples export several checkpoints (~30 s of the fast tier): the slow tier."""


def _tiered(values: list, page_of) -> list:
    return [pytest.param(v, marks=pytest.mark.slow) if page_of(v) in SLOW_PAGES else v
            for v in values]


def skip_reason(page: Path) -> str | None:
    if "annotate(" in doc_pages.read(page) and not hasattr(torch.fx.traceback, "annotate"):
        return (f"{page} tags with torch.fx.traceback.annotate, which torch "
                f"{torch.__version__} does not have (2.10 and later do; docs/MATRIX.md)")
    return None


def page_copy(page: Path, tmp_path_factory) -> Path:
    """The page's working copy, its Python blocks run; skips or fails as they did."""
    reason = skip_reason(page)
    if reason:
        pytest.skip(reason)
    folder, status = doc_pages.working_copy(page, tmp_path_factory)
    if status != "ok":
        pytest.fail(f"{page}: its Python blocks failed:\n{status}", pytrace=False)
    return folder


def test_pages_have_examples():
    assert len(CONSOLE) >= 20 and len(PYTHON_PAGES) >= 5
    assert sum(bool(expected) for b in CONSOLE for _, expected in doc_pages.commands(b)) >= 15


@pytest.mark.parametrize("page", _tiered(PYTHON_PAGES, lambda page: page), ids=str)
def test_python_blocks_run(page, tmp_path_factory):
    page_copy(page, tmp_path_factory)


def run_in_process(argv: list[str], folder: Path) -> tuple[int, str]:
    """``rewrite ARGV`` through the command's ``main`` in this process (the code the
    ``rewrite`` script runs, without starting Python and importing torch again): its exit
    code and its stdout and stderr together."""
    from rewrite.cli.main import main

    out = io.StringIO()
    with doc_pages.working_directory(folder), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: usage errors, --help, --version
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
    return code, out.getvalue()


def run_in_shell(command: str, folder: Path) -> tuple[int, str]:
    env = {**os.environ, "COLUMNS": "200",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["sh", "-c", command], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    return proc.returncode, proc.stdout


def run(command: str, folder: Path) -> tuple[int, str]:
    """A plain ``rewrite ...`` command runs in this process; anything else (pipes,
    redirections, other programs) in ``sh``."""
    shell = re.search(r"[|&;<>$`\\]", command.split("#")[0])
    if command.startswith("rewrite ") and not shell:
        return run_in_process(shlex.split(command, comments=True)[1:], folder)
    return run_in_shell(command, folder)


@pytest.mark.parametrize("block", _tiered(CONSOLE, lambda block: block.page),
                         ids=lambda b: b.id)
def test_console_block_prints_what_the_page_shows(block, tmp_path_factory, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(page_copy(block.page, tmp_path_factory), folder, symlinks=True)
    release = doc_pages.output_release(block)
    compared = release is None or torch.__version__.startswith(f"{release}.")
    wrong = []
    for command, expected in doc_pages.commands(block):
        code, output = run(command, folder)
        got = doc_pages.normalized(output)
        want = [doc_pages.TIME.sub("0.0s", line) for line in expected]
        if code != doc_pages.expected_exit(command) or (
                compared and not doc_pages.matches(want, got)):
            wrong.append(f"$ {command}  (exit {code})\n" + "\n".join(got))
    assert not wrong, f"{block.id}:\n" + "\n\n".join(wrong)
