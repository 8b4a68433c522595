"""Progress and the function tree: the backend reports, the CLI draws."""

from __future__ import annotations

import io
import re

from rich.console import Console

import rewrite
from rewrite.backends.onnx import lower
from rewrite.cli.render import function_tree
from rewrite.cli.steps import Steps
from tests.onnx_fixtures import MODULARIZE


def test_the_backend_reports_through_the_progress_it_is_given(shared_program):
    heard = []

    class Recorder:
        def step(self, text):
            heard.append(("step", text))
            return Steps(None).step(text)

        def update(self, text):
            heard.append(("update", text))

        def note(self, text):
            heard.append(("note", text))

    lower(rewrite.apply(MODULARIZE, shared_program), progress=Recorder())
    steps = [text for kind, text in heard if kind == "step"]
    assert any(text.startswith("outlining") for text in steps)
    assert any(kind == "update" and "outlining groups" in text for kind, text in heard)


def test_steps_print_each_step_time_and_notes():
    buffer = io.StringIO()
    steps = Steps(Console(file=buffer, width=200))
    with steps.step("exporting"):
        steps.update("exporting: half way")
    steps.note("2 functions")
    lines = buffer.getvalue().splitlines()
    assert re.fullmatch(r"exporting: done in \d+\.\ds", lines[0]), lines
    assert lines[1:] == ["2 functions"]


def test_function_tree_shows_calls_and_runs(shared_lowered):
    _, lowering = shared_lowered
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(function_tree(lowering.model))
    text = console.export_text()
    assert text.startswith(f"functions: {len(lowering.model.functions)} functions")
    assert " x" in text and "runs" in text
