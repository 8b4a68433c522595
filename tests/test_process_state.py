"""The library leaves the process as it was: what a program calling rewrite from threads sees.

Two ``rewrite.export`` calls of checkpoint folders in threads of one process write the same
bytes as one after another, while a third thread samples the process's environment, its
logging configuration (every logger's level, handlers, propagation) and transformers'
progress bar: nothing changes during the exports or after, and nothing reaches for the
network (offline through transformers' own ``local_files_only``). A ``Result`` is a value:
lowering it twice gives equal models and leaves it as it was. A ``.pt2``'s file ranges travel
with what was loaded (no registry): the writer finds them through the lowering.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

import onnx_ir as ir
import pytest
import torch

import rewrite
from rewrite.files.mapped import file_ranges
from rewrite.frontends.pt2.program import read_pt2
from tests import checkpoints

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
MODULARIZE = ROOT / "rules" / "modularize.rules"
DAY_NS = 86_400 * 10**9


def _logging_state() -> dict:
    """Every logger's configuration (new loggers made meanwhile count only if configured)."""
    loggers = {"": logging.root}
    loggers.update({name: logger for name, logger in list(logging.root.manager.loggerDict.items())
                    if isinstance(logger, logging.Logger)})
    state = {name: (logger.level, tuple(logger.handlers), logger.propagate, logger.disabled)
             for name, logger in loggers.items()}
    state["<disable>"] = logging.root.manager.disable
    return state


def _process_state() -> tuple[dict, dict, bool]:
    from transformers.utils import logging as transformers_logging

    return dict(os.environ), _logging_state(), transformers_logging.is_progress_bar_enabled()


def _changes(before: tuple[dict, dict, bool], now: tuple[dict, dict, bool]) -> list[str]:
    environ, loggers, bar = now
    changed = [f"os.environ[{k!r}]" for k in environ.keys() | before[0].keys()
               if environ.get(k) != before[0].get(k)]
    default = (logging.NOTSET, (), True, False)
    changed += [f"logger {name!r}: {loggers.get(name)}" for name in loggers.keys() | before[1]
                if loggers.get(name) != before[1].get(name, default)]
    if bar != before[2]:
        changed.append(f"transformers' progress bar: {bar}")
    return changed


def _written(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.parent.iterdir())}


class Sampler(threading.Thread):
    """Samples the process's state until stopped; keeps what differed from ``before``."""

    def __init__(self, before: tuple[dict, dict, bool]) -> None:
        super().__init__(daemon=True)
        self.before, self.seen, self.samples = before, set(), 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.seen.update(_changes(self.before, _process_state()))
            self.samples += 1
            time.sleep(0.001)


@pytest.fixture
def no_network(monkeypatch):
    """Every connection attempt is refused and recorded."""
    tried: list = []

    def refuse(sock, address):
        tried.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return tried


@pytest.mark.slow  # four exports, two of them in threads
def test_exports_in_threads_equal_one_after_another_and_leave_the_process_alone(
        tmp_path, no_network):
    # an fp32 and a bf16 checkpoint (transformers builds each under its own default dtype),
    # older than the process so that their weights are copied file to file meanwhile
    folders = [checkpoints.write("llama", tmp_path / "fp32"),
               checkpoints.write("qwen2", tmp_path / "bf16", dtype=torch.bfloat16)]
    for folder in folders:
        for path in folder.iterdir():
            old = time.time_ns() - DAY_NS
            os.utime(path, ns=(old, old))

    def export(k: int, run: str) -> Path:
        out = tmp_path / run / str(k) / "model.onnx"
        out.parent.mkdir(parents=True)
        rewrite.export(folders[k], output=out, external_data_threshold=0)
        return out

    alone = [_written(export(k, "alone")) for k in range(len(folders))]
    before = _process_state()
    sampler = Sampler(before)
    sampler.start()
    outs: dict[int, Path] = {}
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            outs[k] = export(k, "threads")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(folders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sampler.stop.set()
    sampler.join()
    assert not errors, errors
    assert [_written(outs[k]) for k in range(len(folders))] == alone
    assert sampler.samples > 10
    assert sorted(sampler.seen) == []  # during the exports
    assert _changes(before, _process_state()) == []  # and after
    assert no_network == []


@pytest.fixture(scope="module")
def pt2(tmp_path_factory) -> Path:
    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("pt2") / "two.pt2"
    torch.export.save(torch.export.export(Two().eval(), (torch.randn(2, 64),)), str(path))
    return path


def _program_state(program: torch.export.ExportedProgram) -> tuple:
    return (program.graph_module.code, str(program.graph_signature),
            [(n.name, sorted(n.meta)) for n in program.graph.nodes],
            {k: (id(v), v.data_ptr()) for k, v in program.state_dict.items()})


def test_a_pt2_results_lowerings_are_equal_and_leave_it_as_it_was(pt2):
    result = rewrite.apply(MODULARIZE, pt2)
    program = result.tree.graph.source
    before = _program_state(program), result.explain()
    first, second = (ir.to_proto(result.to_onnx()).SerializeToString() for _ in range(2))
    assert first == second
    assert (_program_state(program), result.explain()) == before


def test_file_ranges_travel_with_the_load_not_a_registry(pt2):
    # each load describes the file it mapped; a tensor's range is found through the load
    # that made it. This file was written after the process started, so the kernel's list
    # of mappings alone does not vouch for it (rewrite.files.file_maps): without its load's
    # record, its weights are not file ranges
    loaded = read_pt2(pt2)
    again = read_pt2(pt2)
    weight = loaded.program.state_dict["a.weight"]
    (mapped,) = loaded.mapped
    where = mapped.file_range(weight)
    assert where is not None and where.path == pt2.resolve()
    with open(pt2, "rb") as f:
        f.seek(where.offset)
        assert f.read(where.length) == weight.detach().numpy().tobytes()
    assert file_ranges([weight], loaded.mapped) == [where]
    assert file_ranges([weight], again.mapped) == [None]  # not in the other load's mapping
    assert file_ranges([weight]) == [None]
    graph = rewrite.apply(MODULARIZE, pt2).tree.graph
    assert [m.path for m in graph.mapped] == [pt2.resolve()]
