"""Checkpoint benchmark: a Hugging Face checkpoint folder to ONNX, rewrite vs onnxruntime-genai's
model builder vs a file copy, side by side in one run (issue 31).

    nice .venv/bin/python -m bench.checkpoint [--size 2.5gb] [--rows cp builder script export]
        [--repeats 1] [--rebuild] [--keep]
    .venv/bin/python -m bench.checkpoint --quick     # a tiny checkpoint, checks the harness

The checkpoint is built here (never downloaded) into ``bench/out/``, once (``--rebuild``): the
Llama of ``bench.weights_model`` (``2.5gb``: Llama-3.2-1B-shaped, 1.24B parameters, bf16, random
normal weights, tied embeddings) saved by ``save_pretrained`` in 3 shards, with a word-level
tokenizer made with ``tokenizers`` (the builder loads one). Every row is a fresh process of the
same Python, writing into an empty folder; before each, pending writes are flushed, freed
memory settles and the shards are read once (``bench.harness.prepare``: warm page cache, and
every row writes into memory the host took back, as explained there). Rows:

* ``cp``: ``cp -r --reflink=never DIR OUT/``, the floor for reading and writing the bytes;
* ``cp+sync``: the same, then ``sync`` of the copies (durable, as rewrite's output is);
* ``builder``: ``python -m onnxruntime_genai.models.builder -i DIR -o OUT -p bf16 -e cpu``
  (decode-ready: KV cache inputs and outputs; a flat graph); ``builder+sync``: the same, then
  ``sync`` of its outputs (durable, as rewrite's output is);
* ``script``: ``from_pretrained`` + ``rewrite.export(model, (ids,), {"use_cache": False},
  rules="llama", output=OUT/model.onnx)`` (no KV cache), reporting its steps;
* ``export``: ``rewrite -v export DIR -o OUT/model.onnx --cache kv`` (skipped, and said so,
  where this checkout has no ``export`` command);
* ``export-whole``: the same with ``--trace whole`` (torch.export traces every layer);
* ``export-nofile``: ``rewrite.export(DIR, cache="kv")`` with no output: everything but
  writing, so that ``export`` minus it is what writing the weights costs the run (they are
  written while torch.export runs: the step after lowering is only a wait);
* ``export-static``: ``rewrite -v export DIR -o OUT/model.onnx --cache static --context 2048
  --static batch=1,seq=128`` (issue 41: a fixed cache, every shape static);
  ``export-static-2seq``: the same with ``--static batch=1,seq=128,seq=1`` (a prefill and a
  decode model over one data file);
* ``export-int4`` and ``builder-int4`` (issue 39): ``rewrite -v export DIR -o OUT/model.onnx
  --cache kv --precision int4 --block-size 32`` (checked against eager before writing) and
  ``python -m onnxruntime_genai.models.builder -i DIR -o OUT -p int4 -e cpu --extra_options
  block_size=32 is_symmetric=true`` (not checked, not synced); ``export-int4-noverify``:
  ``export-int4`` with ``--no-verify``.

Per row: wall time (min / median / max), peak ``RssAnon`` / ``RssFile`` of the process tree
(``bench.procmem``), ``ru_maxrss``, output size, the checker on rewrite's outputs
(path-based, full check), and rewrite's steps (``writing weights`` is the weights step) and its
note on how many weights went file to file. Targets (issue 31), each printed met or MISSED:
``export`` whole process faster than ``builder``; its peak RssAnon at most half the builder's;
what writing the weights adds to its run at most 1.5x ``cp`` (the writing itself, in the
background and after lowering, and the script's, for information); issue 41: each static row
at most ``export``'s median wall time and peak RssAnon. The load
average before and after the run is printed (the machine is shared). The table goes to stdout
and ``bench/out/checkpoint.md``; MB are 2**20 bytes, GB 10**9. Exit 1 if a row failed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import attrs

from bench.harness import (Result, Row, Run, load_average, rounds, run_row, runs_table,
                           steps_table, verdict)
from bench.weights_model import OUT, ROOT, SIZES, Size, random_model

SHARDS = 3
SCRIPT = """\
import sys, time
start = time.perf_counter()
import torch, transformers
from rich.console import Console
import rewrite
from rewrite.cli.steps import Steps
print(f"imports: {time.perf_counter() - start:.2f}s", file=sys.stderr)
start = time.perf_counter()
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
print(f"from_pretrained: {time.perf_counter() - start:.2f}s", file=sys.stderr)
start = time.perf_counter()
rewrite.export(model, (torch.zeros(1, 8, dtype=torch.long),), {"use_cache": False},
               rules="llama", output=sys.argv[2], progress=Steps(Console(stderr=True)))
print(f"rewrite.export: {time.perf_counter() - start:.2f}s", file=sys.stderr)
"""
NO_FILE = """\
import gc, os, sys
gc.disable()  # the collector set as the rewrite command sets it (rewrite.cli.process)
from rich.console import Console
import rewrite
from rewrite.cli.process import THRESHOLDS
from rewrite.cli.steps import Steps
gc.freeze(); gc.set_threshold(*THRESHOLDS); gc.enable()
rewrite.export(sys.argv[1], cache="kv", progress=Steps(Console(stderr=True)))
gc.freeze(); sys.stderr.flush(); os._exit(0)
"""
WEIGHTS_STEP = "writing weights"
EARLY_STEP = "writing weights while exporting (background, synced)"
NOTE = re.compile(r"weights: .*copied file to file")
EARLY = re.compile(r"weights: .* written while exporting, in (?P<seconds>\d+(?:\.\d+)?)s")
ENV = {**os.environ, "COLUMNS": "400", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
COPY_RATIO, MEMORY_RATIO = 1.5, 0.5
TRACED_ONCE_RATIO = 0.6
"""Issue 40: `export` (each distinct layer traced once) at most this fraction of the
builder's wall time, the builder's output synced."""


STATIC = ("--cache", "static", "--context", "2048", "--static")
"""The fixed cache of issue 41's rows; each row gives ``--static``'s sizes."""


def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


ROWS = {
    "cp": Row(lambda d, o: ["cp", "-r", "--reflink=never", str(d), str(o / d.name)]),
    "cp+sync": Row(lambda d, o: ["sh", "-c", 'cp -r --reflink=never "$0" "$1" && sync "$1"/*',
                                 str(d), str(o / d.name)]),
    "builder": Row(lambda d, o: _python("-m", "onnxruntime_genai.models.builder", "-i", str(d),
                                        "-o", str(o), "-p", "bf16", "-e", "cpu",
                                        "-c", str(o / "cache_dir"))),
    "builder+sync": Row(lambda d, o: ["sh", "-c", '"$0" "$@" && sync "$6"/*', sys.executable,
                                      "-m", "onnxruntime_genai.models.builder", "-i", str(d),
                                      "-o", str(o), "-p", "bf16", "-e", "cpu", "-c",
                                      str(o / "cache_dir")]),
    "script": Row(lambda d, o: _python("-c", SCRIPT, str(d), str(o / "model.onnx")),
                  "model.onnx"),
    "export": Row(lambda d, o: _python("-m", "rewrite", "-v", "export", str(d), "-o",
                                       str(o / "model.onnx"), "--cache", "kv"), "model.onnx"),
    "export-whole": Row(lambda d, o: _python("-m", "rewrite", "-v", "export", str(d), "-o",
                                             str(o / "model.onnx"), "--cache", "kv",
                                             "--trace", "whole"), "model.onnx"),
    "export-nofile": Row(lambda d, o: _python("-c", NO_FILE, str(d))),
    "export-static": Row(lambda d, o: _python("-m", "rewrite", "-v", "export", str(d), "-o",
                                              str(o / "model.onnx"), *STATIC,
                                              "batch=1,seq=128"), "model.onnx"),
    "export-static-2seq": Row(lambda d, o: _python(
        "-m", "rewrite", "-v", "export", str(d), "-o", str(o / "model.onnx"), *STATIC,
        "batch=1,seq=128,seq=1"), "model.onnx"),
    "export-int4": Row(lambda d, o: _python("-m", "rewrite", "-v", "export", str(d), "-o",
                                            str(o / "model.onnx"), "--cache", "kv",
                                            "--precision", "int4", "--block-size", "32"),
                       "model.onnx"),
    "export-int4-noverify": Row(lambda d, o: _python(
        "-m", "rewrite", "-v", "export", str(d), "-o", str(o / "model.onnx"), "--cache", "kv",
        "--precision", "int4", "--block-size", "32", "--no-verify"), "model.onnx"),
    "builder-int4": Row(lambda d, o: _python(
        "-m", "onnxruntime_genai.models.builder", "-i", str(d), "-o", str(o), "-p", "int4",
        "-e", "cpu", "-c", str(o / "cache_dir"), "--extra_options", "block_size=32",
        "is_symmetric=true")),
}
NAMES = ("DIR", "OUT")
"""How the tables show the checkpoint folder and the output folder."""
SCRIPTS = {SCRIPT: "SCRIPT", NO_FILE: "NO_FILE"}


def folder_of(size: Size, out: Path = OUT) -> Path:
    return out / f"checkpoint-{size.stem()}"


def build(size: Size, folder: Path) -> None:
    """Save a random model of ``size`` and a tokenizer into ``folder`` (via a temporary one)."""
    model = random_model(size)
    model.config.use_cache = True  # as a checkpoint on a hub says it
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(partial, max_shard_size=total * 5 // (4 * SHARDS))  # 3 of 2.5gb
    _tokenizer(size.vocab).save_pretrained(partial)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)


def _tokenizer(vocab: int):
    """A word-level tokenizer over ``vocab`` made-up words (``t0`` is every special token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="t0", eos_token="t0",
                                   unk_token="t0", pad_token="t0")


def ensure(name: str, rebuild: bool = False) -> Path:
    size = SIZES[name]
    folder = folder_of(size)
    if rebuild or not folder.is_dir():
        print(f"building {folder.name}: {size.describe()} ...", file=sys.stderr, flush=True)
        build(size, folder)
    return folder


def run_one(name: str, folder: Path, work: Path) -> tuple[Run | None, str]:
    """One run of a row, alone with the checkpoint: every earlier output is removed first
    (the page cache holds the checkpoint and nothing another row wrote); rewrite's output
    checked; the weights note and the early writing's time read from its log."""
    for earlier in ROWS:
        shutil.rmtree(work / earlier, ignore_errors=True)
    run, text = run_row(ROWS[name], folder, work / name, names=NAMES,
                        inputs=sorted(folder.iterdir()), env=ENV, check_output=True)
    if run is None:
        return None, text
    note, early = NOTE.search(text), EARLY.search(text)
    steps = {**run.steps, **({EARLY_STEP: float(early["seconds"])} if early else {})}
    return attrs.evolve(run, steps=steps, note=note[0].split("; ")[-1] if note else ""), text


def has_export() -> bool:
    """Whether this checkout's CLI has the ``export`` command."""
    proc = subprocess.run(_python("-m", "rewrite", "export", "--help"), capture_output=True,
                          cwd=ROOT, env=ENV)
    return proc.returncode == 0


def bench(folder: Path, rows: list[str], repeats: int, work: Path, keep: bool
          ) -> dict[str, Result]:
    """Every row, in rounds of alternating order, each run alone (:func:`run_one`); the last
    output is removed unless ``keep``."""
    results = {name: Result() for name in rows}
    rounds(rows, dict.fromkeys(rows, repeats), lambda name: run_one(name, folder, work),
           results, "", lambda run: f"{run.measure.seconds:.2f}s, RssAnon "
           f"{run.measure.anon_mb:.0f} MB {run.note}")
    if not keep:
        for name in rows:
            shutil.rmtree(work / name, ignore_errors=True)
    return results


def targets_table(results: dict[str, Result]) -> list[str]:
    """Each target of issue 31 this run can judge: measured, target, verdict."""
    ok = {name: r for name, r in results.items() if r.runs}
    lines = ["| criterion | measured | target | verdict |", "|---|---|---|---|"]
    if "export" in ok and "builder" in ok:
        mine, theirs = ok["export"], ok["builder"]
        lines.append(f"| `export` / builder, whole process (wall) | {mine.median():.2f} s / "
                     f"{theirs.median():.2f} s = {mine.median() / theirs.median():.2f}x | "
                     f"< 1x | {verdict(mine.median() < theirs.median())} |")
        ratio = mine.peak("anon_mb") / theirs.peak("anon_mb")
        lines.append(f"| `export` / builder, peak RssAnon | {mine.peak('anon_mb'):.0f} MB / "
                     f"{theirs.peak('anon_mb'):.0f} MB = {ratio:.2f}x | <= {MEMORY_RATIO}x | "
                     f"{verdict(ratio <= MEMORY_RATIO)} |")
    if "export" in ok and "builder+sync" in ok:
        mine, theirs = ok["export"], ok["builder+sync"]
        ratio = mine.median() / theirs.median()
        lines.append(f"| `export` / `builder+sync` (its output synced, as rewrite's is; issue "
                     f"40) | {mine.median():.2f} s / {theirs.median():.2f} s = {ratio:.2f}x | "
                     f"<= {TRACED_ONCE_RATIO}x | {verdict(ratio <= TRACED_ONCE_RATIO)} |")
    if "export" in ok and "export-whole" in ok:
        mine, whole = ok["export"], ok["export-whole"]
        lines.append(f"| `export` / `export-whole` (every layer traced; for information) | "
                     f"{mine.median():.2f} s / {whole.median():.2f} s = "
                     f"{mine.median() / whole.median():.2f}x | | |")
    if "export-int4" in ok and "builder-int4" in ok:
        mine, theirs = ok["export-int4"], ok["builder-int4"]
        ratio = mine.peak("anon_mb") / theirs.peak("anon_mb")
        lines.append(f"| `export-int4` / `builder-int4` (issue 39), whole process (wall) | "
                     f"{mine.median():.2f} s / {theirs.median():.2f} s = "
                     f"{mine.median() / theirs.median():.2f}x | < 1x | "
                     f"{verdict(mine.median() < theirs.median())} |")
        lines.append(f"| `export-int4` / `builder-int4`, peak RssAnon | "
                     f"{mine.peak('anon_mb'):.0f} MB / {theirs.peak('anon_mb'):.0f} MB = "
                     f"{ratio:.2f}x | <= {MEMORY_RATIO}x | {verdict(ratio <= MEMORY_RATIO)} |")
    lines += _weights_lines(ok) + _static_lines(ok)
    if "script" in ok and "builder" in ok:
        mine, theirs = ok["script"], ok["builder"]
        lines.append(f"| script / builder (for information; no KV cache) | wall "
                     f"{mine.median() / theirs.median():.2f}x, RssAnon "
                     f"{mine.peak('anon_mb') / theirs.peak('anon_mb'):.2f}x | | |")
    failed = [name for name, r in results.items() if r.failed]
    if failed:
        lines.append(f"| runs that failed | {', '.join(failed)} | none | **MISSED** |")
    return lines


def _static_lines(ok: dict[str, Result]) -> list[str]:
    """Issue 41: each static export at most the ``export`` (``--cache kv``) row's median wall
    time and peak RssAnon."""
    lines = []
    for name in ("export-static", "export-static-2seq"):
        if name not in ok or "export" not in ok:
            continue
        mine, kv = ok[name], ok["export"]
        for what, a, b, unit in (("wall", mine.median(), kv.median(), "{:.2f} s"),
                                 ("peak RssAnon", mine.peak("anon_mb"), kv.peak("anon_mb"),
                                  "{:.0f} MB")):
            lines.append(f"| `{name}` / `export` (--cache kv), {what} | {unit.format(a)} / "
                         f"{unit.format(b)} = {a / b:.2f}x | <= 1x | {verdict(a <= b)} |")
    return lines


def _weights_lines(ok: dict[str, Result]) -> list[str]:
    """What writing the weights costs ``export`` (the target): the wall time it adds to the
    run (``export`` - ``export-nofile``, the same run without an output) against ``cp``; for
    information, against ``cp+sync`` (a durable copy, as rewrite's output is), and the
    writing itself: while exporting (synced, in the background) and after lowering."""
    lines = []
    if "export" in ok and "export-nofile" in ok:
        cost = ok["export"].median() - ok["export-nofile"].median()
        for base in ("cp", "cp+sync"):
            if base in ok:
                ratio = cost / ok[base].median()
                target = (f"<= {COPY_RATIO}x | {verdict(ratio <= COPY_RATIO)}" if base == "cp"
                          else "(for information) |")
                lines.append(f"| `export` - `export-nofile` (the weights' cost to the run) / "
                             f"`{base}` | {cost:.2f} s / {ok[base].median():.2f} s = "
                             f"{ratio:.2f}x | {target} |")
    for name in ("export", "script"):
        for step, base in ((EARLY_STEP, "cp+sync"), (WEIGHTS_STEP, "cp")):
            seconds = ok[name].step(step) if name in ok else None
            if seconds is not None and base in ok:
                lines.append(f"| `{name}` {step} / `{base}` | {seconds:.2f} s / "
                             f"{ok[base].median():.2f} s = {seconds / ok[base].median():.2f}x"
                             " | (for information) | |")
    return lines


def report(results: dict[str, Result], folder: Path, size: str, command: str,
           started: datetime.datetime, loads: tuple[str, str], skipped: list[str]) -> str:
    import onnxruntime_genai
    import torch

    shards = sorted(folder.glob("*.safetensors"))
    lines = [
        "# checkpoint benchmark (issue 31)", "",
        f"{started:%Y-%m-%d %H:%M} UTC, `{command}`, {platform.machine()}, {os.cpu_count()} "
        f"cores, Python {platform.python_version()}, torch {torch.__version__}, "
        f"onnxruntime-genai {onnxruntime_genai.__version__}, niceness {os.nice(0)}; load "
        f"average before {loads[0]}, after {loads[1]}.", "",
        f"Checkpoint: {SIZES[size].describe()}; {len(shards)} shards, "
        f"{sum(p.stat().st_size for p in shards) / 1e9:.2f} GB (`{folder.name}`). Each run: "
        "a fresh process after `sync`, a 5 s settle of freed memory and a read of the "
        "folder (page cache warm); peaks of "
        "the process tree sampled every 20 ms; SCRIPT: `from_pretrained` + "
        "`rewrite.export(..., rules=\"llama\", output=...)` (bench/checkpoint.py).", "",
        *runs_table({size: results}, {name: ROWS[name].command(NAMES, SCRIPTS) for name in ROWS},
                    note="weights file to file"), "",
        *([f"Not run: {', '.join(skipped)}.", ""] if skipped else []),
        *steps_table({size: results}), "", *targets_table(results), "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), help="default 2.5gb (--quick: tiny4)")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--repeats", type=int, default=1, help="runs per row")
    parser.add_argument("--quick", action="store_true", help="a tiny checkpoint")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the checkpoint")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help="keep the last output of each row")
    args = parser.parse_args(argv)
    size = args.size or ("tiny4" if args.quick else "2.5gb")
    if args.build_only:
        print(ensure(size, args.rebuild))
        return 0
    command = "python -m bench.checkpoint " + " ".join(argv if argv is not None else sys.argv[1:])
    started, before = datetime.datetime.now(datetime.timezone.utc), load_average()
    build = _python("-m", "bench.checkpoint", "--build-only", "--size", size,
                    *(["--rebuild"] if args.rebuild else []))  # its memory is not ours
    folder = Path(subprocess.run(build, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                 check=True).stdout.strip())
    rows, skipped = list(args.rows), []
    if "export" in rows and not has_export():
        rows.remove("export")
        skipped.append("`export` (this checkout has no `rewrite export` command)")
    results = bench(folder, rows, args.repeats, OUT / "checkpoint", args.keep)
    text = report(results, folder, size, command.strip(), started, (before, load_average()),
                  skipped)
    print(text)
    (OUT / "checkpoint.md").write_text(text)
    bad = any(r.failed or (r.checker and r.checker != "passed") for r in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
