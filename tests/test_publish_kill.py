"""Killed at any moment, nothing lost: a real writer process is held at each step of
publishing and killed with SIGKILL (as the OOM killer or a power cut would); a reader then
finds the old pair or the new pair, loadable in onnxruntime and equal to its eager model,
never a mix, and the next run on that output leaves exactly the model and its data.

Two writers whose publishing overlaps (the first held inside its critical section) are
serialized by the folder lock and leave one whole pair; a writer still staging its files is
not disturbed by another run's cleaning.

The writers are forked from the test process (the models are lowered before, so the child
only writes files) and report each step of :func:`rewrite.files.outputs.publish` on a pipe.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from pathlib import Path
from typing import Iterator

import onnx_ir as ir
import pytest

import rewrite
from rewrite.files import outputs
from rewrite.backends.onnx import save as save_module
from tests.test_output_pairs import _is_pair_of, _listing, pairs  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
MODULARIZE = ROOT / "rules" / "modularize.rules"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork, flock, SIGKILL")


@pytest.fixture(scope="module")
def lowered(pairs) -> list[tuple[ir.Model, tuple]]:
    """The two models of ``pairs`` (different weights), lowered (``.pt2`` weights mapped),
    and their eager triples: a model beside the other's data computes something else."""
    made = []
    for pt2, triple in pairs:
        model = rewrite.apply(MODULARIZE, pt2).to_onnx()  # checked: the checksum thread
        # does not follow a fork
        made.append((model, triple))
    return made


FILE_CHANGES = ("replace", "rename", "link", "unlink", "rmdir")
"""The calls of ``os`` that change the output's folder: a writer can be held before each."""


class Writer:
    """A forked process writing ``model`` to ``out`` with external data. It reports each
    publishing step and each change to the folder (``replace``, ``link``...) on a pipe and,
    at report number ``hold`` (or the step named ``hold``), waits to be released (or killed):
    held before a change, after a step."""

    def __init__(self, model: ir.Model, out: Path, hold: int | str | None,
                 siblings: tuple = ()) -> None:
        steps_r, steps_w = os.pipe()
        go_r, go_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the writer
            os.close(steps_r)
            os.close(go_w)
            code = 1
            try:
                _report_to(steps_w, go_r, hold)
                save_module.write_model(model, out, threshold=0, siblings=siblings)
                code = 0
            finally:
                os._exit(code)
        os.close(steps_w)
        os.close(go_r)
        self.steps, self.go = steps_r, go_w
        self.seen: list[str] = []

    def wait_for(self, step: str | int, timeout: float = 60) -> bool:
        """Read reports until the step named ``step`` (or report number ``step``) arrived
        (True), or ``timeout`` seconds of silence."""
        while (len(self.seen) <= step) if isinstance(step, int) else (step not in self.seen):
            ready, _, _ = select.select([self.steps], [], [], timeout)
            if not ready:
                return False
            chunk = os.read(self.steps, 4096).decode()
            if not chunk:  # the writer ended
                return False
            self.seen += chunk.split()
        return True

    def release(self) -> None:
        os.write(self.go, b"x")

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.end()

    def end(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        os.close(self.steps)
        os.close(self.go)
        return os.waitstatus_to_exitcode(status)


def _report_to(steps: int, go: int, hold: int | str | None) -> None:
    """In the writer: report steps and folder changes on ``steps``; wait on ``go`` at
    ``hold``."""
    count = 0

    def report(what: str) -> None:
        nonlocal count
        os.write(steps, f"{what}\n".encode())
        if hold in (count, what):
            os.read(go, 1)
        count += 1

    def reporting(name: str):
        real = getattr(os, name)

        def call(*args, **kwargs):
            report(name)
            return real(*args, **kwargs)
        return call

    for name in FILE_CHANGES:
        setattr(os, name, reporting(name))
    outputs._reached = report


@contextlib.contextmanager
def writer(model: ir.Model, out: Path, hold: str | int | None,
           siblings: tuple = ()) -> Iterator[Writer]:
    w = Writer(model, out, hold, siblings)
    try:
        yield w
    finally:
        with contextlib.suppress(ChildProcessError, OSError):
            os.kill(w.pid, signal.SIGKILL)
            w.end()


def _found(out: Path, triples: dict[str, tuple]) -> str:
    """What a reader finds at ``out``: "nothing", or which pair (asserting it is one)."""
    if not out.exists():
        return "nothing"
    for name, triple in triples.items():
        if _is_pair_of(out, triple, checker=False):
            return name
    raise AssertionError(f"{out} is no whole pair: {_listing(out.parent)}")


def _reports(model: ir.Model, out: Path, siblings: tuple = ()) -> list[str]:
    """What a writer reports, unheld, publishing over ``out``."""
    with writer(model, out, hold=None, siblings=siblings) as w:
        assert w.wait_for("cleaned"), w.seen
        assert w.end() == 0
    return w.seen


@pytest.mark.parametrize("over", ["pair", "nothing"])
def test_a_writer_killed_at_any_step_leaves_a_whole_pair(lowered, tmp_path, over):
    """Killed before each change to the folder and after each step of publishing."""
    (old_model, old_triple), (new_model, new_triple) = lowered
    triples = {"old": old_triple, "new": new_triple}

    def prepare(folder: Path) -> Path:
        folder.mkdir()
        out = folder / "model.onnx"
        if over == "pair":
            save_module.write_model(old_model, out, threshold=0)
        return out

    reports = _reports(new_model, prepare(tmp_path / "count"))
    assert {*outputs.PUBLISH_STEPS, "replace", "link"} <= {*reports}, reports
    found = []
    for hold, what in enumerate(reports):
        out = prepare(tmp_path / f"{hold}")
        with writer(new_model, out, hold=hold) as w:
            assert w.wait_for(hold) and w.seen == reports[:hold + 1], (hold, w.seen)
            w.kill()
        found.append(_found(out, triples))
        visible = {n for n in _listing(out.parent) if not n.startswith(".")}
        assert visible <= {"model.onnx", "model.onnx.data"}, (hold, what, visible)
        save_module.write_model(old_model, out, threshold=0)  # the next run
        assert _listing(out.parent) == ["model.onnx", "model.onnx.data"], (hold, what)
        assert _is_pair_of(out, old_triple), (hold, what)
    before = "old" if over == "pair" else "nothing"
    switch = found.index("new")
    assert found == [before] * switch + ["new"] * (len(found) - switch), [*zip(reports, found)]
    assert reports[switch - 1: switch + 1] == ["replace", "committed"], reports


def test_overlapping_writers_are_serialized_by_the_lock(lowered, tmp_path):
    """The first writer is held between placing its data and its final model; the second
    waits for the lock, then publishes: the output is the second's whole pair. (Without
    the lock the second publishes meanwhile, and the first's final model then reads the
    second's data: ``tools.mutants no-lock``.)"""
    (first_model, first_triple), (second_model, second_triple) = lowered
    out = tmp_path / "model.onnx"
    with writer(first_model, out, hold="linked") as first:
        assert first.wait_for("linked"), first.seen
        with writer(second_model, out, hold=None) as second:
            assert second.wait_for("staged"), second.seen
            overlapped = second.wait_for("published", timeout=2)
            first.release()
            assert first.end() == 0
            assert second.wait_for("cleaned"), second.seen
            assert second.end() == 0
    found = _found(out, {"first": first_triple, "second": second_triple})
    assert _listing(tmp_path) == ["model.onnx", "model.onnx.data"]
    assert not overlapped and found == "second"


def test_a_writer_still_staging_survives_another_runs_cleaning(lowered, tmp_path):
    (first_model, first_triple), (second_model, second_triple) = lowered
    out = tmp_path / "model.onnx"
    with writer(first_model, out, hold="staged") as first:
        assert first.wait_for("staged"), first.seen
        save_module.write_model(second_model, out, threshold=0)
        assert _is_pair_of(out, second_triple)
        first.release()
        assert first.end() == 0
    assert _listing(tmp_path) == ["model.onnx", "model.onnx.data"]
    assert _is_pair_of(out, first_triple)


def test_leftovers_of_the_rename_aside_scheme_go_with_the_next_run(lowered, tmp_path):
    """The publishing before this one moved the old pair into ``.OUT.old.XXXXXXXX``; a run
    killed then left it there."""
    (model, triple), _ = lowered
    out = tmp_path / "model.onnx"
    aside = tmp_path / ".model.onnx.old.abcd_123"
    aside.mkdir()
    (aside / "0").write_bytes(b"an old model")
    (tmp_path / ".model.onnx.x1y2z3w4").mkdir()  # a killed run's staging folder
    save_module.write_model(model, out, threshold=0)
    assert _listing(tmp_path) == ["model.onnx", "model.onnx.data"]
    assert _is_pair_of(out, triple)


def test_models_sharing_data_killed_at_any_step_each_whole(lowered, tmp_path):
    """``model.onnx`` and ``model_seq1.onnx`` reading one data file (``--static
    seq=A,seq=1``), killed at every step: each is a whole model with its data, old or new;
    both new from the main model's commit on, both old before the sibling's; mixed only
    when killed between the two renames of step 1 (one rename each: no atomic switch of
    two names); the next run leaves exactly the three files."""
    from rewrite.backends.onnx.shared_data import Sibling

    (old_model, old_triple), (new_model, new_triple) = lowered
    triples = {"old": old_triple, "new": new_triple}

    def siblings(model: ir.Model, out: Path) -> tuple:
        return (Sibling(model, out.with_name("model_seq1.onnx")),)

    def prepare(folder: Path) -> Path:
        folder.mkdir()
        out = folder / "model.onnx"
        save_module.write_model(old_model, out, threshold=0,
                                siblings=siblings(old_model, out))
        return out

    out = prepare(tmp_path / "count")
    reports = _reports(new_model, out, siblings(new_model, out))
    found = []
    for hold, what in enumerate(reports):
        out = prepare(tmp_path / f"{hold}")
        with writer(new_model, out, hold=hold, siblings=siblings(new_model, out)) as w:
            assert w.wait_for(hold) and w.seen == reports[:hold + 1], (hold, w.seen)
            w.kill()
        found.append((_found(out, triples), _found(out.with_name("model_seq1.onnx"),
                                                   triples)))
        save_module.write_model(old_model, out, threshold=0,
                                siblings=siblings(old_model, out))  # the next run
        assert _listing(out.parent) == ["model.onnx", "model.onnx.data",
                                        "model_seq1.onnx"], (hold, what)
        assert _is_pair_of(out, old_triple), (hold, what)
    switch = found.index(("new", "new"))
    assert found[:switch - 1] == [("old", "old")] * (switch - 1), [*zip(reports, found)]
    assert found[switch - 1] == ("old", "new"), [*zip(reports, found)]
    assert found[switch:] == [("new", "new")] * (len(found) - switch)
    assert reports[switch - 2: switch + 1] == ["replace", "replace", "committed"], reports
