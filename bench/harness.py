"""What every benchmark shares: timing a call, the spread of repeated runs, and the rows of
the whole-process benchmarks (``bench.weights``, ``bench.checkpoint``).

* :func:`timed`: wall clock and CPU seconds of one call (``gc`` collected first);
* :class:`Spread`: the runs of one measurement, shown as ``median (min-max, n)``;
* whole processes: a :class:`Row` is a command as a user runs it, on an input, into an empty
  folder; :func:`run_row` runs it once, warm (:func:`prepare`) and measured by
  ``bench.procmem`` (wall time, peak memory of the process tree), into a :class:`Run`;
  :func:`rounds` repeats the rows in alternating order into one :class:`Result` per row; the
  tables (:func:`runs_table`, :func:`steps_table`) and :func:`verdict` make the report.
"""

from __future__ import annotations

import gc
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import attrs

from bench.procmem import Measure, measure

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


# --- one call, and repeated measurements -----------------------------------------------------


@attrs.frozen
class Times:
    wall: float
    """Wall-clock seconds."""
    cpu: float
    """CPU seconds (user + system) of this process and of the child processes it waited for
    (steadier than wall clock on a shared machine)."""


def timed(fn: Callable[[], T]) -> tuple[Times, T]:
    """The times of one call of ``fn`` (after a garbage collection), and what it returned."""
    gc.collect()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu += after.ru_utime - children.ru_utime + after.ru_stime - children.ru_stime
    return Times(wall, cpu), value


MIN_RUNS = 5
"""Fewer runs than this are flagged in the report (a median of 1-2 runs says little)."""


@attrs.frozen
class Spread:
    """The runs of one measurement."""

    runs: tuple[float, ...]

    @classmethod
    def of(cls, runs: Sequence[float]) -> "Spread":
        return cls(tuple(runs))

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def low(self) -> float:
        return min(self.runs)

    @property
    def high(self) -> float:
        return max(self.runs)

    def show(self, fmt: str = ".2f", unit: str = "") -> str:
        """``1.23 (1.20-1.31, n=5)``; ``n=2!`` when there were fewer than :data:`MIN_RUNS`."""
        n = f"n={len(self.runs)}" + ("!" if len(self.runs) < MIN_RUNS else "")
        return (f"{self.median:{fmt}}{unit} ({self.low:{fmt}}-{self.high:{fmt}}{unit}, {n})")


def load_average() -> str:
    """The machine's load averages (1, 5, 15 minutes): the machine is shared."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- whole processes: rows, runs, results ----------------------------------------------------


@attrs.frozen
class Row:
    """One way to process the input, as a user runs it."""

    argv: Callable[[Path, Path], list[str]]
    """(input, empty output folder) -> the command."""
    onnx: str | None = None
    """The ONNX file it writes, to check (None: it writes none, or none the checker takes)."""

    def command(self, names: tuple[str, str], scripts: Mapping[str, str] | None = None) -> str:
        """The command as the tables show it: the input and the output folder called
        ``names``, ``sys.executable`` called ``python``, an inline script by its name in
        ``scripts``."""
        scripts = scripts or {}
        argv = self.argv(Path(names[0]), Path(names[1]))
        return " ".join("python" if a == sys.executable else scripts.get(a, a) for a in argv)


@attrs.frozen
class Run:
    """One measured run of a row."""

    measure: Measure
    steps: dict[str, float]
    """rewrite's step timings (``-v``), seconds by step text (paths replaced by names)."""
    output_bytes: int
    checker: str | None = None
    """The checker on the run's ONNX output (``passed`` or ``FAILED: ...``); None: not run."""
    note: str = ""
    """A line of the run's output the report shows (the benchmark says which)."""


@attrs.define
class Result:
    """The runs of one row on one input."""

    runs: list[Run] = attrs.Factory(list)
    failed: str | None = None
    """The last line of the log of the run that failed (a failed row is not run again)."""

    @property
    def checker(self) -> str | None:
        """``passed`` when every checked output passed, else the first failure; None when
        no output was checked."""
        found = [run.checker for run in self.runs if run.checker is not None]
        return next((c for c in found if c != "passed"), "passed") if found else None

    def wall(self) -> list[float]:
        return [run.measure.seconds for run in self.runs]

    def median(self) -> float:
        return statistics.median(self.wall())

    def peak(self, field: str) -> float:
        return max(getattr(run.measure, field) for run in self.runs)

    def step(self, text: str) -> float | None:
        """Median seconds of one step over the runs that printed it."""
        found = [run.steps[text] for run in self.runs if text in run.steps]
        return statistics.median(found) if found else None

    def steps(self) -> dict[str, float]:
        """Median seconds of each step, in the order the runs printed them."""
        names = dict.fromkeys(name for run in self.runs for name in run.steps)
        return {name: self.step(name) for name in names}  # type: ignore[misc]


STEP = re.compile(r"^(?P<text>\S.*?):\s+(?:done in\s+)?(?P<seconds>\d+(?:\.\d+)?)s\s*$", re.M)


def parse_steps(log: str, paths: Mapping[Path, str]) -> dict[str, float]:
    """Step timings from rewrite's ``-v`` output, each of ``paths`` replaced by its name."""
    steps: dict[str, float] = {}
    for match in STEP.finditer(log):
        text = match["text"]
        for path, name in paths.items():
            text = text.replace(str(path), name)
        steps[text] = steps.get(text, 0.0) + float(match["seconds"])
    return steps


SETTLE_SECONDS = 5.0
"""How long a run waits after the cleanup before it starts. This VM's balloon device reports
freed memory to the host (``VIRTIO_BALLOON_F_REPORTING``, ~2 s after it is freed); a page the
host took back costs a fault on the host when it is used again, so writing 2.5 GB into
fresh page cache runs at ~0.45 GB/s with reported pages and ~3 GB/s with pages just freed.
Without the wait, a row that writes soon after the cleanup (``cp``) writes into freed
memory, one that writes after seconds of work (``rewrite``) into reported memory: the wait
gives every row the second."""


def prepare(inputs: list[Path], settle: float = SETTLE_SECONDS) -> None:
    """Before a run: flush pending writes (``sync``), let the memory freed by removing the
    previous outputs be reported (``settle`` s), then read ``inputs`` so that they are in
    page cache (warm, as they are after a download; dropping the cache needs root)."""
    os.sync()
    time.sleep(settle)
    buffer = bytearray(16 * 2**20)
    for path in inputs:
        with open(path, "rb", buffering=0) as file:
            while file.readinto(buffer):
                pass


CHECK_SCRIPT = "import onnx, sys; onnx.checker.check_model(sys.argv[1], full_check=True)"


def check(path: Path) -> str:
    """``passed`` or ``FAILED: <the checker's last line>`` (path-based: works past 2 GB)."""
    proc = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, str(path)], capture_output=True,
                          text=True, cwd=ROOT)
    if proc.returncode == 0:
        return "passed"
    return "FAILED: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:200]


def _size(folder: Path) -> int:
    """Bytes of the files under ``folder`` (a ``cache_dir``, the builder's, does not count)."""
    return sum(path.stat().st_size for path in folder.rglob("*")
               if path.is_file() and "cache_dir" not in path.relative_to(folder).parts)


def run_row(row: Row, source: Path, out: Path, *, names: tuple[str, str], inputs: list[Path],
            env: Mapping[str, str], check_output: bool = False) -> tuple[Run | None, str]:
    """One run of ``row`` on ``source`` into the emptied folder ``out`` (its stderr in
    ``out``.log, its stdout in ``out``.out), after :func:`prepare` of ``inputs``; its output
    checked when ``check_output``. (The run or None if it failed, its stderr.)"""
    log = out.with_name(f"{out.name}.log")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    prepare(inputs)
    result = measure(row.argv(source, out), stderr=log, stdout=log.with_suffix(".out"),
                     cwd=ROOT, env=dict(env))
    text = log.read_text(errors="replace")
    if result.returncode != 0:
        return None, text
    steps = parse_steps(text, {source: names[0], out: names[1]})
    checker = check(out / row.onnx) if check_output and row.onnx else None
    return Run(result, steps, _size(out), checker), text


def rounds(rows: list[str], repeats: Mapping[str, int],
           run: Callable[[str], tuple[Any, str]], results: Mapping[str, Any], label: str,
           describe: Callable[[Any], str]) -> None:
    """Each row run up to ``repeats[row]`` times into ``results[row].runs``, in rounds of
    alternating order; a row that fails keeps the last line of its log in ``failed`` and is
    not run again. Progress lines on stderr, each starting with ``label``."""
    for round_ in range(max(repeats[name] for name in rows)):
        for name in rows if round_ % 2 == 0 else rows[::-1]:
            result = results[name]
            if result.failed is not None or len(result.runs) >= repeats[name]:
                continue
            measured, log = run(name)
            if measured is None:
                result.failed = (log.strip().splitlines() or ["(no output)"])[-1][:200]
                print(f"{label}{name}: FAILED\n{log[-3000:]}", file=sys.stderr, flush=True)
                continue
            result.runs.append(measured)
            print(f"{label}{name} {len(result.runs)}/{repeats[name]}: {describe(measured)}",
                  file=sys.stderr, flush=True)


# --- the report ------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "**MISSED**"


def _mb(mb: float) -> str:
    return f"{mb:,.0f}" if mb >= 10 else f"{mb:.2f}"


def runs_table(results: Mapping[str, Mapping[str, Result]], commands: Mapping[str, str],
               note: str | None = None) -> list[str]:
    """One line per row of each input (``results``: input -> row -> result): the command,
    wall times, peak memory, output size, the checker; ``note``: the header of a last column,
    the last run's :attr:`Run.note`."""
    extra = f" {note} |" if note else ""
    lines = ["| input | row | command | runs | wall s min / median / max | peak RssAnon MB "
             f"| peak RssFile MB | ru_maxrss MB | output MB | checker |{extra}",
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if note else "")]
    for size, rows in results.items():
        for name, result in rows.items():
            command = f"`{commands[name]}`"
            if not result.runs:
                lines.append(f"| {size} | {name} | {command} | 0 | FAILED: {result.failed} "
                             "| | | | | |" + (" |" if note else ""))
                continue
            failed = f" (then FAILED: {result.failed})" if result.failed else ""
            walls = result.wall()
            last = result.runs[-1]
            shown = f" {last.note or '-'} |" if note else ""
            lines.append(
                f"| {size} | {name} | {command} | {len(result.runs)}{failed} | "
                f"{min(walls):.2f} / {statistics.median(walls):.2f} / {max(walls):.2f} | "
                f"{result.peak('anon_mb'):.0f} | {result.peak('file_mb'):.0f} | "
                f"{result.peak('maxrss_mb'):.0f} | {_mb(last.output_bytes / 2**20)} | "
                f"{result.checker or '-'} |{shown}")
    return lines


def steps_table(results: Mapping[str, Mapping[str, Result]]) -> list[str]:
    """The median time of each of rewrite's steps, per input and row."""
    lines = ["| input | row | step (rewrite -v) | median s |", "|---|---|---|---|"]
    for size, rows in results.items():
        for name, result in rows.items():
            lines += [f"| {size} | {name} | {step} | {seconds:.2f} |"
                      for step, seconds in result.steps().items()]
    return lines
