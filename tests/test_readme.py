"""The README, executed: its Python snippets run and its console examples print what it shows.

One session folder plays the reader's working copy: ``demo-out/gpt2.pt2`` built as
``examples/demo.py`` builds it (``make demo``), then every ```` ```python ```` block in README
order (they save ``gpt2.pt2``, ``llama.pt2``, ``staged.pt2``, ... there), then every
```` ```console ```` block, each ``$`` line run by ``sh`` in that folder with ``.venv/bin`` on
``PATH``. A command's stdout and stderr, together, must read as the lines the README prints
under it: timings (``1.2s``) are normalized, and a ``...`` line stands for any number of lines.
A rules file a console block uses and no command writes is the plain block just above it;
the shipped rules' folder prints as ``/path/to/rewrite/rules``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FENCED = list(re.finditer(r"```(\w*)\n(.*?)```", README, re.S))
BLOCKS = [(m[1], m[2]) for m in FENCED]
TIME = re.compile(r"\b\d+\.\d+s\b")


def console_examples() -> list[tuple[int, str, list[str], str | None]]:
    """Per ``$`` command: (block index, command, expected lines, the plain block above)."""
    found = []
    for k, (lang, body) in enumerate(BLOCKS):
        if lang != "console":
            continue
        above = BLOCKS[k - 1][1] if k and BLOCKS[k - 1][0] == "" else None
        for chunk in re.split(r"(?m)^\$ ", body)[1:]:
            command, *expected = chunk.rstrip("\n").split("\n")
            found.append((k, command, expected, above))
    return found


EXAMPLES = console_examples()


@contextlib.contextmanager
def working_directory(folder: Path):
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def build_demo_model(folder: Path) -> Path:
    """``demo-out/gpt2.pt2`` as ``make demo`` saves it."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from demo import build_gpt2
    finally:
        sys.path.remove(str(ROOT / "examples"))
    model, ids, kwargs = build_gpt2(4)
    path = folder / "demo-out" / "gpt2.pt2"
    path.parent.mkdir()
    torch.export.save(torch.export.export(model, (ids,), kwargs=kwargs), str(path))
    return path


@pytest.fixture(scope="module")
def reader(tmp_path_factory) -> Path:
    """The reader's folder, with every Python snippet run in it (in one namespace, README
    order; the first API sketch gets the demo's program as ``program``)."""
    if not hasattr(torch.fx.traceback, "annotate"):  # torch 2.9: not there (docs/MATRIX.md)
        pytest.skip("the README's tagging example uses torch.fx.traceback.annotate, which "
                    f"torch {torch.__version__} does not have (2.10 and later do)")
    folder = tmp_path_factory.mktemp("readme")
    (folder / "rules").symlink_to(ROOT / "rules")  # the examples run from the repository root
    demo = build_demo_model(folder)
    namespace = {"program": torch.export.load(str(demo))}
    with working_directory(folder):
        for found in FENCED:
            if found[1] == "python":  # compiled at its README line, for tracebacks
                line = README.count("\n", 0, found.start(2))
                exec(compile("\n" * line + found[2], str(ROOT / "README.md"), "exec"),
                     namespace)  # noqa: S102
    return folder


def test_the_python_snippets_ran(reader):
    made = {p.name for p in reader.iterdir()}
    assert {"gpt2.pt2", "llama.pt2", "bert.pt2", "staged.pt2", "flat.onnx", "gpt2.onnx",
            "gpt2-flat.onnx"} <= made


def matches(expected: list[str], got: list[str]) -> bool:
    """``got`` reads as ``expected``, where a ``...`` line stands for any lines."""
    if not expected:
        return not got
    if expected[0].strip() == "...":
        return any(matches(expected[1:], got[k:]) for k in range(len(got) + 1))
    return bool(got) and expected[0] == got[0] and matches(expected[1:], got[1:])


def normalized(text: str) -> list[str]:
    """Timings as 0.0s; the shipped rules' folder as the README writes it."""
    shipped = str(resources.files("rewrite.library"))
    return [TIME.sub("0.0s", line.rstrip()).replace(shipped, "/path/to/rewrite/rules")
            for line in text.splitlines()]


def test_the_readme_has_console_examples():
    assert len(EXAMPLES) >= 12
    assert sum(bool(expected) for _, _, expected, _ in EXAMPLES) >= 5


@pytest.mark.slow  # every console example, each a process
def test_console_examples_print_what_the_readme_shows(reader):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "COLUMNS": "200"}
    wrong = []
    for _, command, expected, above in EXAMPLES:
        for name in re.findall(r"(\S+\.rules)\b", command):
            if not (reader / name).exists() and above is not None \
                    and not (ROOT / "rules" / name).exists() and f"> {name}" not in command:
                (reader / name).write_text(above)
        proc = subprocess.run(["sh", "-c", command], cwd=reader, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        got = normalized(proc.stdout)
        want = [TIME.sub("0.0s", line) for line in expected]
        said = re.search(r"# exit (\d+)$", command)  # a command shown failing says so
        expected_code = 1 if command.startswith("rewrite check typo") else \
            int(said[1]) if said else 0
        if proc.returncode != expected_code or not matches(want, got):
            wrong.append(f"$ {command}  (exit {proc.returncode})\n" + "\n".join(got))
    assert not wrong, "\n\n".join(wrong)
