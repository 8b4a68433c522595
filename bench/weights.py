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
(:data:`bench.harness.SETTLE_SECONDS`) and the ``.pt2`` is read once, so every row starts with
the model in page cache (the rows are "warm", not cold).
Rounds alternate the order of the rows (``bench.harness``). Rows:

* ``cp``: ``cp --reflink=never MODEL.pt2 DIR/``, the floor for reading and writing its bytes;
* ``apply``: ``rewrite -v apply rules/llama.rules MODEL.pt2 -o DIR/model.onnx``;
* ``apply-no-optimize``: the same with ``--no-optimize`` (not run unless named in ``--rows``);
* ``explain``: ``rewrite -v explain rules/llama.rules MODEL.pt2`` (the tree to a file);
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
from pathlib import Path
from typing import Mapping

import attrs

from bench.harness import (Result, Row, check, load_average, rounds, run_row, runs_table,
                           steps_table, verdict)
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
WEIGHT_STEPS = r"\bweights\b"
OUTER_STEPS = r"^(reading|loading|writing) "
GROWTH_ROWS = ("apply", "explain")
ENV = {**os.environ, "COLUMNS": "400"}  # rich wraps rewrite's -v lines at 80 columns in a pipe
APPLY_MB, EXPLAIN_MB, EXPLAIN_S, SPEEDUP, COPY_RATIO, GROWTH = 1024, 600, 3.0, 4.0, 2.0, 1.2


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


NAMES = ("MODEL.pt2", "DIR")
"""How the tables show the model and the output folder."""
SCRIPTS = {PLAIN_SCRIPT: "PLAIN_SCRIPT"}


def row_command(name: str) -> str:
    """Row ``name``'s command as the tables show it."""
    return ROWS[name].command(NAMES, SCRIPTS)


def bench_model(size: str, model: Path, rows: list[str], repeats: dict[str, int],
                work: Path, keep: bool) -> dict[str, Result]:
    """Every row on one model, in rounds of alternating order; then the checker."""
    results = {name: Result() for name in rows}
    rounds(rows, repeats, lambda name: run_row(ROWS[name], model, work / name, names=NAMES,
                                               inputs=[model], env=ENV),
           results, f"{size} ",
           lambda run: f"{run.measure.seconds:.2f}s, RssAnon {run.measure.anon_mb:.0f} MB, "
           f"RssFile {run.measure.file_mb:.0f} MB")
    check_and_clean(results, {name: ROWS[name].onnx for name in rows}, work, keep)
    return results


def check_and_clean(results: Mapping[str, Result], onnx: Mapping[str, str | None], work: Path,
                    keep: bool) -> None:
    """The checker on each row's ONNX output (``work/ROW/onnx[ROW]``, what its last run
    wrote), then the rows' folders removed unless ``keep``."""
    for name, result in results.items():
        if onnx[name] and result.runs:
            result.runs[-1] = attrs.evolve(result.runs[-1],
                                           checker=check(work / name / onnx[name]))
    if not keep:
        for name in results:
            shutil.rmtree(work / name, ignore_errors=True)


# --- the report ------------------------------------------------------------------------------


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

    load = load_average()
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
        *runs_table(results, {name: row_command(name) for name in ROWS}), "",
        *steps_table(results), "",
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
