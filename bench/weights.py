"""Weights benchmark: ``rewrite`` on a 1.24B-parameter bf16 Llama ``.pt2`` vs a file copy and
the plain torch path, side by side in one run (issue 22).

    nice .venv/bin/python -m bench.weights [--sizes 0.5gb 1.2gb 2.5gb] [--repeats 3]
        [--plain-repeats 2] [--rows cp apply explain plain apply-no-optimize] [--rebuild]
    .venv/bin/python -m bench.weights --quick        # tiny models, checks the harness itself

The models are built by ``bench.weights_model`` into ``bench/out/`` (once; ``--rebuild``).
The largest of ``--sizes`` gets every row; the others get ``apply`` and ``explain`` only, for
the memory growth. Every run is a fresh process of the same Python, environment and working
folder (the bench's own niceness is inherited), writing into an empty folder; before each
run, pending writes are flushed (``sync``), the memory freed by the cleanup is left to settle
(:data:`SETTLE_SECONDS`) and the ``.pt2`` is read once, so every row starts with the model in
page cache (the rows are "warm", not cold).
Rounds alternate the order of the rows. Rows:

* ``cp``: ``cp --reflink=never MODEL.pt2 DIR/``, the floor for reading and writing its bytes;
* ``apply``: ``rewrite -v apply rules/llama.rules MODEL.pt2 -o DIR/model.onnx``;
* ``apply-no-optimize``: the same with ``--no-optimize`` (not run unless named in ``--rows``);
* ``explain``: ``rewrite -v explain rules/llama.rules MODEL.pt2`` (the tree to /dev/null);
* ``plain``: a script as a user writes it: ``torch.export.load`` (after importing
  ``transformers.modeling_outputs``: the program returns its ``CausalLMOutputWithPast``),
  ``torch.onnx.export(program, dynamo=True)`` with its defaults, ``save(external_data=True)``.

Per row: wall time (min / median / max of the runs), the peak ``RssAnon`` and ``RssFile`` of
the process tree sampled every 20 ms from /proc (``bench.procmem``; the largest of the runs),
the kernel's ``ru_maxrss``, the output's size (all files written), and for each ``.onnx``
output ``onnx.checker.check_model(path, full_check=True)`` once (path-based: works past 2 GB).
``-v`` makes rewrite print the time of each of its steps; their medians are shown, and the
steps named ``--weight-steps`` (default: those with "weights" in their name; if there is none,
as before issue 22, the outer "reading ..." and "writing ..." steps, grouping included) make
"the weights part" of ``apply`` compared with ``cp`` (a step nested in another is printed
too: the default never picks both).

Targets (issue 22), each printed met or MISSED: plain / apply >= 4x (median wall); apply's
weights part <= 2x cp; peak RssAnon of apply <= 1.0 GB, of explain <= 600 MB with a median
wall <= 3 s; apply's peak RssAnon flat in model size: its highest over the sizes <= 1.2x its
lowest (before issue 22, a model under 2 GB was written with embedded weights, one over 2 GB
with external data: two paths, both measured, as a user meets them). The table is printed and
written to ``bench/out/weights.md``. Memory in MB of 2**20 bytes (1.0 GB = 1024 MB), files in
GB of 10**9 bytes.
Exit 1 if a run failed or the checker rejected an output (a missed target is not a failure).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import attrs

from bench.procmem import Measure, measure
from bench.weights_model import OUT, ROOT, SIZES

RULES = "rules/llama.rules"
WARM_IMPORTS = "import torch, transformers.modeling_outputs, onnx, onnxscript, rewrite.cli.main"
PLAIN_SCRIPT = """\
import contextlib, io, logging, sys
import torch
import transformers.modeling_outputs  # the program returns a CausalLMOutputWithPast
for name in ("torch.onnx", "onnxscript"):
    logging.getLogger(name).setLevel(logging.ERROR)
program = torch.export.load(sys.argv[1])
with contextlib.redirect_stdout(io.StringIO()):
    onnx_program = torch.onnx.export(program, dynamo=True, verbose=False)
onnx_program.save(sys.argv[2], external_data=True)
"""
CHECK_SCRIPT = "import onnx, sys; onnx.checker.check_model(sys.argv[1], full_check=True)"
STEP = re.compile(r"^(?P<text>\S.*?):\s+(?:done in\s+)?(?P<seconds>\d+(?:\.\d+)?)s\s*$", re.M)
WEIGHT_STEPS = r"\bweights\b"
OUTER_STEPS = r"^(reading|loading|writing) "
GROWTH_ROWS = ("apply", "explain")
ENV = {**os.environ, "COLUMNS": "400"}  # rich wraps rewrite's -v lines at 80 columns in a pipe
APPLY_MB, EXPLAIN_MB, EXPLAIN_S, SPEEDUP, COPY_RATIO, GROWTH = 1024, 600, 3.0, 4.0, 2.0, 1.2


@attrs.frozen
class Row:
    """One way to process the model, as a user runs it."""

    argv: Callable[[Path, Path], list[str]]
    """(model, empty output folder) -> the command (its stdout goes to /dev/null)."""
    onnx: str | None = None
    """The ONNX file it writes, checked once (None: it writes none)."""

    @property
    def command(self) -> str:
        """The command as the table shows it."""
        argv = self.argv(Path("MODEL.pt2"), Path("DIR"))
        return " ".join("python" if arg == sys.executable else "PLAIN_SCRIPT" if "\n" in arg
                        else arg for arg in argv)


def _rewrite(*args: str) -> list[str]:
    return [sys.executable, "-m", "rewrite", "-v", *args]


ROWS = {
    "cp": Row(lambda model, out: ["cp", "--reflink=never", str(model), str(out / model.name)]),
    "apply": Row(lambda model, out: _rewrite("apply", RULES, str(model), "-o",
                                             str(out / "model.onnx")), "model.onnx"),
    "apply-no-optimize": Row(
        lambda model, out: _rewrite("apply", RULES, str(model), "-o", str(out / "model.onnx"),
                                    "--no-optimize"), "model.onnx"),
    "explain": Row(lambda model, out: _rewrite("explain", RULES, str(model))),
    "plain": Row(lambda model, out: [sys.executable, "-c", PLAIN_SCRIPT, str(model),
                                     str(out / "model.onnx")], "model.onnx"),
}


@attrs.frozen
class Run:
    """One measured run of a row."""

    measure: Measure
    steps: dict[str, float]
    """rewrite's step timings (``-v``), seconds by step text (the model's path elided)."""
    output_bytes: int


@attrs.define
class Result:
    """The runs of one row on one model."""

    runs: list[Run] = attrs.Factory(list)
    failed: str | None = None
    checker: str | None = None

    def wall(self) -> list[float]:
        return [run.measure.seconds for run in self.runs]

    def peak(self, field: str) -> float:
        return max(getattr(run.measure, field) for run in self.runs)

    def steps(self) -> dict[str, float]:
        """Median seconds of each step, in the order the runs printed them."""
        names = dict.fromkeys(name for run in self.runs for name in run.steps)
        return {name: statistics.median(run.steps.get(name, 0.0) for run in self.runs)
                for name in names}


def parse_steps(log: str, model: Path, out: Path) -> dict[str, float]:
    """Step timings from rewrite's ``-v`` output, the paths replaced by MODEL.pt2 / DIR."""
    steps: dict[str, float] = {}
    for match in STEP.finditer(log):
        text = match["text"].replace(str(model), "MODEL.pt2").replace(str(out), "DIR")
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


def _size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def run_row(name: str, model: Path, work: Path) -> tuple[Run | None, str]:
    """One run of a row into an empty folder: (the run or None if it failed, its log)."""
    out, log = work / name, work / f"{name}.log"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    prepare([model])
    result = measure(ROWS[name].argv(model, out), stderr=log, cwd=ROOT, env=ENV)
    text = log.read_text(errors="replace")
    if result.returncode != 0:
        return None, text
    return Run(result, parse_steps(text, model, out), _size(out)), text


def check(path: Path) -> str:
    """``passed`` or ``FAILED: <the checker's last line>``."""
    proc = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, str(path)], capture_output=True,
                          text=True, cwd=ROOT)
    if proc.returncode == 0:
        return "passed"
    return "FAILED: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:200]


def bench_model(size: str, model: Path, rows: list[str], repeats: dict[str, int],
                work: Path, keep: bool) -> dict[str, Result]:
    """Every row on one model, in rounds of alternating order; then the checker."""
    results = {name: Result() for name in rows}
    rounds(rows, repeats, lambda name: run_row(name, model, work), results, f"{size} ",
           lambda run: f"{run.measure.seconds:.2f}s, RssAnon {run.measure.anon_mb:.0f} MB, "
           f"RssFile {run.measure.file_mb:.0f} MB")
    check_and_clean(results, {name: ROWS[name].onnx for name in rows}, work, keep)
    return results


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


def check_and_clean(results: Mapping[str, Any], onnx: Mapping[str, str | None], work: Path,
                    keep: bool) -> None:
    """The checker on each row's ONNX output (``work/ROW/onnx[ROW]``), then the rows'
    folders removed unless ``keep``."""
    for name, result in results.items():
        if onnx[name] and result.runs:
            result.checker = check(work / name / onnx[name])
    if not keep:
        for name in results:
            shutil.rmtree(work / name, ignore_errors=True)


# --- the report ------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "**MISSED**"


def _mb(mb: float) -> str:
    return f"{mb:,.0f}" if mb >= 10 else f"{mb:.2f}"


def _walls(result: Result) -> str:
    walls = result.wall()
    return f"{min(walls):.2f} / {statistics.median(walls):.2f} / {max(walls):.2f}"


def runs_table(results: dict[str, dict[str, Result]]) -> list[str]:
    lines = ["| model | row | command | runs | wall s min / median / max | peak RssAnon MB "
             "| peak RssFile MB | ru_maxrss MB | output MB | checker |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for size, rows in results.items():
        for name, result in rows.items():
            command = f"`{ROWS[name].command}`"
            if not result.runs:
                lines.append(f"| {size} | {name} | {command} | 0 | FAILED: {result.failed} "
                             "| | | | | |")
                continue
            failed = f" (then FAILED: {result.failed})" if result.failed else ""
            lines.append(
                f"| {size} | {name} | {command} | {len(result.runs)}{failed} | "
                f"{_walls(result)} | {result.peak('anon_mb'):.0f} | {result.peak('file_mb'):.0f}"
                f" | {result.peak('maxrss_mb'):.0f} | {_mb(result.runs[-1].output_bytes / 2**20)}"
                f" | {result.checker or '-'} |")
    return lines


def steps_table(results: dict[str, dict[str, Result]]) -> list[str]:
    lines = ["| model | row | step (rewrite -v) | median s |", "|---|---|---|---|"]
    for size, rows in results.items():
        for name, result in rows.items():
            if result.runs:
                lines += [f"| {size} | {name} | {step} | {seconds:.2f} |"
                          for step, seconds in result.steps().items()]
    return lines


def weights_part(steps: dict[str, float], regex: str) -> tuple[dict[str, float], str]:
    """The ``-v`` steps that make apply's weights part, and how they were chosen: the steps
    matching ``regex`` (rewrite's own weights steps); else its outer reading and writing steps
    (the code before issue 22 names no weights step: an upper bound, grouping included)."""
    for pattern, how in ((regex, "the weights steps"),
                         (OUTER_STEPS, "no weights step; the reading and writing steps, "
                                       "grouping included")):
        chosen = {step: s for step, s in steps.items() if re.search(pattern, step)}
        if chosen:
            return chosen, how
    return {}, "rewrite -v printed no reading, writing or weights step"


def targets_table(results: dict[str, dict[str, Result]], weight_steps: str) -> list[str]:
    """Each target of issue 22 that this run's rows can judge: measured, target, verdict."""
    main = results[list(results)[-1]]
    ok = {name: r for name, r in main.items() if r.runs}
    median = {name: statistics.median(r.wall()) for name, r in ok.items()}
    lines = ["| criterion | measured | target | verdict |", "|---|---|---|---|"]
    if "apply" in ok and "plain" in ok:
        ratio = median["plain"] / median["apply"]
        lines.append(f"| plain path / `rewrite apply`, whole processes (median wall) | "
                     f"{median['plain']:.2f} s / {median['apply']:.2f} s = {ratio:.2f}x | "
                     f">= {SPEEDUP:.0f}x | {verdict(ratio >= SPEEDUP)} |")
    if "apply" in ok and "cp" in ok:
        steps, how = weights_part(ok["apply"].steps(), weight_steps)
        total = median["apply"] / median["cp"]
        if steps:
            part = sum(steps.values())
            ratio = part / median["cp"]
            named = "; ".join(f"{step} {s:.2f} s" for step, s in steps.items())
            lines.append(f"| `apply`'s weights part / `cp` ({how}: {named}) | "
                         f"{part:.2f} s / {median['cp']:.2f} s = {ratio:.2f}x | "
                         f"<= {COPY_RATIO:.0f}x | {verdict(ratio <= COPY_RATIO)} |")
            lines.append(f"| `apply` whole process / `cp` (for information) | {total:.2f}x "
                         "| | |")
        else:
            lines.append(f"| `apply` whole process / `cp` ({how}: the total stands in for the "
                         f"weights part) | {median['apply']:.2f} s / {median['cp']:.2f} s = "
                         f"{total:.2f}x | <= {COPY_RATIO:.0f}x | {verdict(total <= COPY_RATIO)} |")
    if "apply" in ok:
        anon = ok["apply"].peak("anon_mb")
        lines.append(f"| `apply` peak RssAnon | {anon:.0f} MB | <= {APPLY_MB} MB | "
                     f"{verdict(anon <= APPLY_MB)} |")
    if "explain" in ok:
        anon = ok["explain"].peak("anon_mb")
        lines.append(f"| `explain` peak RssAnon | {anon:.0f} MB | <= {EXPLAIN_MB} MB | "
                     f"{verdict(anon <= EXPLAIN_MB)} |")
        lines.append(f"| `explain` median wall | {median['explain']:.2f} s | <= {EXPLAIN_S:.0f}"
                     f" s | {verdict(median['explain'] <= EXPLAIN_S)} |")
    for name in GROWTH_ROWS:
        peaks = {size: rows[name].peak("anon_mb") for size, rows in results.items()
                 if name in rows and rows[name].runs}
        if len(peaks) > 1:
            growth = max(peaks.values()) / min(peaks.values())
            each = ", ".join(f"{size} {mb:.0f} MB" for size, mb in peaks.items())
            target = (f"<= {GROWTH}x | {verdict(growth <= GROWTH)}" if name == "apply"
                      else "(for information) |")
            lines.append(f"| `{name}` peak RssAnon across model sizes, highest / lowest "
                         f"({each}) | {growth:.2f}x | {target} |")
    checked = [(size, name, r.checker) for size, rows in results.items()
               for name, r in rows.items() if r.checker and name != "plain"]
    if checked:
        bad = [f"{size} {name}: {c}" for size, name, c in checked if c != "passed"]
        lines.append(f"| `onnx.checker.check_model(path, full_check=True)` of rewrite's "
                     f"outputs | {len(checked) - len(bad)} of {len(checked)} passed"
                     f"{'; ' + '; '.join(bad) if bad else ''} | all | {verdict(not bad)} |")
    failed = [f"{size} {name}" for size, rows in results.items()
              for name, r in rows.items() if r.failed]
    if failed:
        lines.append(f"| runs that failed | {', '.join(failed)} | none | **MISSED** |")
    return lines


def report(results: dict[str, dict[str, Result]], models: dict[str, Path], command: str,
           started: datetime.datetime, weight_steps: str, quick: bool) -> str:
    import torch

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        "# weights benchmark (issue 22)", "",
        f"{started:%Y-%m-%d %H:%M} UTC, `{command}`, {platform.machine()}, {os.cpu_count()} "
        f"cores, Python {platform.python_version()}, torch {torch.__version__}, niceness "
        f"{os.nice(0)}, load average at the end {load}.", "",
        "Models (random normal weights, bf16, built by `bench.weights_model`):", "",
        *(f"- {size}: {SIZES[size].describe()}; `{path.name}` "
          f"{path.stat().st_size / 1e9:.2f} GB (10**9 bytes)" for size, path in models.items()),
        "",
        "PLAIN_SCRIPT: `torch.export.load` + `torch.onnx.export(program, dynamo=True)` + "
        "`save(external_data=True)` (bench/weights.py). "
        "Each run: a fresh process, after `sync`, a 5 s settle of freed memory and a read "
        "of the `.pt2` (page cache warm). "
        "Peaks: the largest over the runs, of the process tree, sampled every 20 ms from "
        "/proc; MB = 2**20 bytes.", "",
        *runs_table(results), "", *steps_table(results), "",
        *(["Quick mode: tiny models, a check of the harness; its verdicts say nothing about "
           "the targets.", ""] if quick else []),
        *targets_table(results, weight_steps), "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES),
                        help="models (default 0.5gb 1.2gb 2.5gb; --quick: tiny2 tiny4); the "
                             "largest gets every row, the others apply and explain")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS),
                        default=["cp", "apply", "explain", "plain"])
    parser.add_argument("--repeats", type=int, help="runs per row (default 3; --quick: 1)")
    parser.add_argument("--plain-repeats", type=int,
                        help="runs of the slow plain row (default 2; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="tiny models: checks the harness")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the models")
    parser.add_argument("--keep-outputs", action="store_true",
                        help="keep what the last run of each row wrote (under OUT/weights/)")
    parser.add_argument("--weight-steps", default=WEIGHT_STEPS, metavar="REGEX",
                        help="rewrite -v steps that make the weights part (default "
                             f"{WEIGHT_STEPS!r}; if none: {OUTER_STEPS!r})")
    parser.add_argument("--out", type=Path, default=OUT, help="models, outputs and weights.md")
    args = parser.parse_args(argv)
    sizes = args.sizes or (["tiny2", "tiny4"] if args.quick else ["0.5gb", "1.2gb", "2.5gb"])
    sizes = sorted(set(sizes), key=lambda size: SIZES[size].parameters)
    repeats = args.repeats or (1 if args.quick else 3)
    plain_repeats = args.plain_repeats or (1 if args.quick else 2)
    command = "python -m bench.weights " + " ".join(argv if argv is not None else sys.argv[1:])
    started = datetime.datetime.now(datetime.timezone.utc)

    build = [sys.executable, "-m", "bench.weights_model", "--out", str(args.out), "--sizes",
             *sizes, *(["--rebuild"] if args.rebuild else [])]
    listed = subprocess.run(build, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    models = dict(zip(sizes, (Path(line) for line in listed.stdout.split())))
    subprocess.run([sys.executable, "-c", WARM_IMPORTS], cwd=ROOT, check=True)  # file caches

    results: dict[str, dict[str, Result]] = {}
    for size in sizes:
        rows = args.rows if size == sizes[-1] else [r for r in args.rows if r in GROWTH_ROWS]
        if rows:
            counts = {name: plain_repeats if name == "plain" else repeats for name in rows}
            results[size] = bench_model(size, models[size], rows, counts,
                                        args.out / "weights" / size, args.keep_outputs)
    text = report(results, models, command.strip(), started, args.weight_steps, args.quick)
    print(text)
    (args.out / "weights.md").write_text(text)
    bad = any(r.failed or (r.checker and r.checker != "passed")
              for rows in results.values() for r in rows.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
