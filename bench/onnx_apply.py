"""``rewrite apply`` on a 48-block GPT-2 ``.pt2`` vs a plain ``torch.onnx.export``, same run.

    .venv/bin/python -m bench.onnx_apply [--blocks 48] [--repeats 5] [--ort-runs 1600]

1. Builds a random-weight GPT-2 (``--blocks`` blocks, width 64: ``tools.models.bench_gpt2``)
   and saves its ``.pt2`` in ``bench/out/``. Every weight is perturbed, as in a trained
   model: transformers initializes biases to zero and norms to one, and torch.onnx's optimizer
   then drops every bias of the flat graph, a fold on weight *values* that a function shared
   by all blocks cannot make (the biases are its inputs); with zero biases the flat model ran
   about 1.05x faster in onnxruntime for that reason alone (48 Gemms without their bias).
2. Export time, after a warm-up, ``--repeats`` rounds (at least 5: median, min and max are
   shown), the two sides in alternating order, each a whole process as a user runs it (both
   pay for starting Python and importing torch), with the same process settings on both sides:
   * ``rewrite apply rules/gpt2.rules X.pt2 -o Y.onnx`` (load, group, torch.onnx.export
     without its optimizer, outline, optimize each distinct function once, write);
   * plain: a script that runs ``torch.export.load`` + ``torch.onnx.export(program,
     dynamo=True)`` (defaults: optimize=True) + ``save``.
   Both run with the ``rewrite`` command's process settings (``rewrite/cli/process.py``: the
   collector tuned, the teardown skipped), and again both with Python's defaults. Target
   (issue 12): rewrite apply at least 5x faster. Wall time and the processes' CPU time are
   both shown. Also, with the program already in memory (no load, nothing written),
   ``rewrite.apply(rules, program).to_onnx()`` vs ``torch.onnx.export(program)``: warm (in
   this process, after one call of each: rewrite keeps torchlib's registry, torch.onnx.export
   rebuilds it on every call) and cold (the first call of each in a fresh process).
3. onnxruntime latency of the grouped model vs the flat one (CPU, 1 thread, default graph
   optimizations), measured by ``bench.ort_latency``: ``--ort-runs`` rounds over 16 sets of
   fresh sessions, each set created in a shuffled order, each round running grouped, flat and
   a control copy of flat once in a shuffled order; the ratio is the median of the rounds'
   ratios; the outputs must agree. Target: grouped <= 1.02x flat. Also the graphs onnxruntime
   actually runs (it inlines functions before optimizing): node counts, and whether they are
   identical up to value names. The same for the model ``rewrite apply --no-body-node-names``
   writes (function bodies' nodes unnamed: onnxruntime then leaves the nodes it inlines
   unnamed instead of naming them ``_inlfunc_<function>_<node>``).
4. Nodes per function now vs before lowering step 1 (the flat program exported with the
   optimizer, then outlined; see ``sizes_before``).

Medians everywhere; prints a table of times and ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

import numpy as np

from bench.harness import Spread

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
RULES = ROOT / "rules" / "gpt2.rules"


def build(blocks: int, seq: int) -> tuple[Path, np.ndarray]:
    """Save the GPT-2 program (``tools.models.bench_gpt2``) in ``bench/out/``; returns its
    path and an input for onnxruntime."""
    import torch

    from tools.models import bench_gpt2

    model, args, kwargs = bench_gpt2(blocks, seq)
    program = torch.export.export(model, args, kwargs=kwargs)
    path = OUT / f"gpt2-{blocks}.pt2"
    torch.export.save(program, str(path))
    return path, args[0].numpy()


PLAIN_SCRIPT = """
import contextlib, io, logging, sys
import torch
for name in ("torch.onnx", "onnxscript"):
    logging.getLogger(name).setLevel(logging.ERROR)
program = torch.export.load(sys.argv[1])
with contextlib.redirect_stdout(io.StringIO()):
    torch.onnx.export(program, dynamo=True, verbose=False).save(sys.argv[2])
"""

TUNED = """
import atexit, gc, os, sys
gc.disable()
try:
{imports}
finally:
    gc.freeze()
    gc.set_threshold(*{thresholds})
    gc.enable()
{body}
gc.freeze()
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit({code})
"""
"""A script run with the process settings of ``rewrite/cli/process.py`` (the ``rewrite``
command's): the collector paused while modules import, then frozen, its thresholds raised,
and the interpreter's teardown skipped."""

REWRITE_DEFAULT = """
import sys
from rewrite.cli.main import main
sys.exit(main(sys.argv[1:]))
"""
"""``rewrite`` with Python's default process settings (the collector as it is, a normal exit)."""


def tuned(script: str) -> str:
    """``script`` (its leading imports, then the rest) with the ``rewrite`` command's process
    settings (:data:`TUNED`)."""
    from rewrite.cli.process import THRESHOLDS

    lines = script.strip().splitlines()
    k = next(i for i, line in enumerate(lines) if not line.startswith(("import ", "from ")))
    return TUNED.format(imports="\n".join("    " + line for line in lines[:k]),
                        thresholds=THRESHOLDS, body="\n".join(lines[k:]), code=0)


COLD_SCRIPT = """
import contextlib, io, sys, time
import torch
import rewrite
from rewrite.cli.logs import quiet_libraries
program = torch.export.load(sys.argv[1])
rules = rewrite.load_rules(sys.argv[2])
start = time.perf_counter()
if sys.argv[3] == "rewrite":
    rewrite.apply(rules, program).to_onnx()
else:
    with contextlib.redirect_stdout(io.StringIO()), quiet_libraries():
        torch.onnx.export(program, dynamo=True, verbose=False)
print(time.perf_counter() - start)
"""
"""The first in-memory call of one side in a fresh process (both sides cold: nothing cached,
the same modules imported before the clock starts)."""


def _child_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _process(cmd: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of a whole process, as a user runs it."""
    import subprocess

    start, cpu = time.perf_counter(), _child_cpu()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    elapsed = time.perf_counter() - start, _child_cpu() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}")
    return elapsed


def time_apply(pt2: Path, out: Path, *flags: str, default: bool = False) -> tuple[float, float]:
    """(wall, CPU) seconds of the process ``rewrite apply rules/gpt2.rules X.pt2 -o Y.onnx``
    (``default``: with Python's default process settings instead of the command's)."""
    argv = ["-q", "apply", str(RULES), str(pt2), "-o", str(out), *flags]
    if default:
        return _process([sys.executable, "-c", REWRITE_DEFAULT, *argv])
    return _process([sys.executable, "-m", "rewrite", *argv])


def time_plain(pt2: Path, out: Path, default: bool = False) -> tuple[float, float]:
    """(wall, CPU) seconds of a process that loads the ``.pt2``, exports it with
    ``torch.onnx.export`` (defaults: optimize=True) and saves it; the exporter's log is muted
    like rewrite's. With the ``rewrite`` command's process settings (:func:`tuned`), unless
    ``default``."""
    script = PLAIN_SCRIPT if default else tuned(PLAIN_SCRIPT)
    return _process([sys.executable, "-c", script, str(pt2), str(out)])


def time_cold(pt2: Path, side: str) -> float:
    """Seconds of the first in-memory call of ``side`` (``rewrite`` or ``plain``) in a fresh
    process (:data:`COLD_SCRIPT`)."""
    import subprocess

    proc = subprocess.run([sys.executable, "-c", COLD_SCRIPT, str(pt2), str(RULES), side],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"cold {side} failed:\n{proc.stderr[-2000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def function_sizes(path: Path) -> dict[str, int]:
    """Nodes per function of a saved model (and ``main``: the main graph)."""
    import onnx_ir as ir

    model = ir.load(str(path))
    sizes = {f.name: len(f) for f in model.functions.values()}
    sizes["(main graph)"] = len(model.graph)
    return sizes


def sizes_before(program, rules) -> dict[str, int]:
    """Nodes per function as rewrite made them before lowering step 1: the flat program
    exported with torch.onnx's optimizer, then outlined (assembled from the backend's parts,
    for this comparison only)."""
    import rewrite
    from rewrite.backends.onnx.lowering import export_program, regroup
    from rewrite.backends.onnx.outlining import outline

    exported = export_program(program, optimize=True)
    tree, _ = regroup(rules, rewrite.apply(rules, program).tree, exported.model,
                      exported.program)
    outline(exported.model, tree)
    sizes = {f.name: len(f) for f in exported.model.functions.values()}
    sizes["(main graph)"] = len(exported.model.graph)
    return sizes


def canonical_graph(path: Path) -> tuple:
    """A graph up to value names: ops, attributes, initializer contents, and the data flow."""
    import hashlib

    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    ids = {value.name: f"input{k}" for k, value in enumerate(graph.input)}
    for tensor in graph.initializer:
        data = numpy_helper.to_array(tensor)
        ids[tensor.name] = hashlib.blake2b(
            repr((tensor.data_type, tuple(tensor.dims))).encode() + data.tobytes(),
            digest_size=12).hexdigest()
    nodes = []
    for node in graph.node:
        inputs = tuple(ids.get(name, "?") if name else "" for name in node.input)
        for name in node.output:
            ids[name] = f"v{len(ids)}"
        attrs = tuple(sorted((a.name, a.SerializeToString()) for a in node.attribute))
        nodes.append((node.domain, node.op_type, inputs, attrs))
    return tuple(nodes), tuple(ids[o.name] for o in graph.output)


def time_in_memory(program, rules, api_first: bool) -> tuple[float, float]:
    """Wall seconds of ``rewrite.apply(rules, program).to_onnx()`` and of
    ``torch.onnx.export(program)``, the program already in memory, nothing written."""
    import torch

    import rewrite
    from rewrite.cli.logs import quiet_libraries

    def api() -> float:
        start = time.perf_counter()
        rewrite.apply(rules, program).to_onnx()
        return time.perf_counter() - start

    def plain() -> float:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), quiet_libraries():
            torch.onnx.export(program, dynamo=True, verbose=False)
        return time.perf_counter() - start

    if api_first:
        first = api()
        return first, plain()
    second = plain()
    return api(), second


def ort_latency(grouped: Path, unnamed: Path, flat: Path, ids: np.ndarray, runs: int) -> dict:
    """Latency of grouped vs flat with a flat-vs-flat control (``bench.ort_latency``), the
    same for grouped with unnamed body nodes (``--no-body-node-names``), and the graphs
    onnxruntime runs after inlining functions and optimizing: node counts, and whether they
    are the same up to value names."""
    import onnx

    from bench.ort_latency import compare, dump_optimized, name_length_cost

    dumps = {p: dump_optimized(p) for p in (grouped, flat)}
    latency = compare(grouped, flat, {"input_ids": ids}, runs=runs)
    return {
        "latency": latency,
        "unnamed": compare(unnamed, flat, {"input_ids": ids}, runs=runs),
        "names": name_length_cost(dumps[flat], {"input_ids": ids}, runs=runs),
        "nodes": tuple(len(onnx.load(str(dumps[p])).graph.node) for p in (grouped, flat)),
        "same": canonical_graph(dumps[grouped]) == canonical_graph(dumps[flat]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=48)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ort-runs", type=int, default=1600)
    args = parser.parse_args(argv)

    import onnx_ir as ir
    from rich.console import Console
    from rich.table import Table

    from rewrite.backends.onnx import summarize

    console = Console(highlight=False)
    OUT.mkdir(parents=True, exist_ok=True)
    with console.status(f"building a {args.blocks}-block GPT-2 .pt2"):
        pt2, ids = build(args.blocks, args.seq)
    grouped_path = OUT / f"gpt2-{args.blocks}.grouped.onnx"
    flat_path = OUT / f"gpt2-{args.blocks}.flat.onnx"

    with console.status("warm-up (file caches, the first process)"):
        time_plain(pt2, flat_path)
    import torch

    import rewrite

    program = torch.export.load(str(pt2))
    rules = rewrite.load_rules(RULES)
    with console.status("warm-up (in memory: the torchlib registry)"):
        time_in_memory(program, rules, api_first=True)
    runs: dict[str, list[float]] = {k: [] for k in (
        "apply", "plain", "apply cpu", "plain cpu", "apply default", "plain default",
        "api", "export", "api cold", "export cold")}
    for round_ in range(args.repeats):
        flip = round_ % 2 == 1
        for side in (("apply", "plain") if flip else ("plain", "apply")):
            with console.status(f"round {round_ + 1}/{args.repeats}: {side}"):
                timer = time_apply if side == "apply" else time_plain
                wall, cpu = timer(pt2, grouped_path if side == "apply" else flat_path)
                runs[side].append(wall)
                runs[f"{side} cpu"].append(cpu)
                runs[f"{side} default"].append(timer(
                    pt2, grouped_path if side == "apply" else flat_path, default=True)[0])
        with console.status(f"round {round_ + 1}/{args.repeats}: in memory"):
            api, export_only = time_in_memory(program, rules, api_first=flip)
        runs["api"].append(api)
        runs["export"].append(export_only)
        with console.status(f"round {round_ + 1}/{args.repeats}: first calls, fresh processes"):
            for side in (("rewrite", "plain") if flip else ("plain", "rewrite")):
                runs["api cold" if side == "rewrite" else "export cold"].append(
                    time_cold(pt2, side))
        console.print(f"round {round_ + 1}: " + ", ".join(
            f"{name} {values[-1]:.2f}s" for name, values in runs.items()))
    with console.status("function sizes before lowering step 1 (optimized flat export)"):
        before = sizes_before(program, rules)

    grouped = ir.load(str(grouped_path))
    blocks = [s for fid, s in summarize(grouped).items() if fid[1] == "GPT2Block"]
    assert len(blocks) == 1 and blocks[0].instances == args.blocks, "blocks were not deduplicated"
    nodes_flat = len(ir.load(str(flat_path)).graph)

    unnamed_path = OUT / f"gpt2-{args.blocks}.grouped-unnamed.onnx"
    with console.status("rewrite apply --no-body-node-names"):
        time_apply(pt2, unnamed_path, "--no-body-node-names")
    with console.status(f"onnxruntime: {args.ort_runs} runs per model"):
        latency = ort_latency(grouped_path, unnamed_path, flat_path, ids, args.ort_runs)
    lat = latency["latency"]
    ort_grouped, ort_flat = latency["nodes"]
    same = latency["same"]

    spread = {name: Spread.of(values) for name, values in runs.items()}
    apply_t, plain_t, apply_c, plain_c, api_t, plain_api_t = (
        spread[k].median for k in ("apply", "plain", "apply cpu", "plain cpu", "api", "export"))
    table = Table(title=f"GPT-2, {args.blocks} blocks (width 64, seq {args.seq}): "
                  f"{nodes_flat} flat ONNX nodes -> {len(grouped.functions)} functions, "
                  f"GPT2Block x{blocks[0].instances}")
    for column in ("measure", "rewrite", "baseline", "ratio", "target"):
        table.add_column(column, justify="left" if column == "measure" else "right")

    def verdict(ratio: float, target: float, faster: bool = False) -> str:
        if faster:
            return f">= {target:.0f}x " + ("[green]ok[/green]" if ratio >= target
                                           else "[red]under[/red]")
        return f"<= {target:.2f} " + ("[green]ok[/green]" if ratio <= target else "[red]over[/red]")

    def ratio(baseline: str, ours: str) -> str:
        return f"{spread[baseline].median / spread[ours].median:.2f}x"

    table.add_row("process `rewrite apply X.pt2 -o Y.onnx` vs process load + torch.onnx.export "
                  "+ save, both with the `rewrite` command's process settings (tuned collector, "
                  "no teardown); median s (min-max, runs); ratio = times faster",
                  spread["apply"].show(), spread["plain"].show(), ratio("plain", "apply"),
                  verdict(plain_t / apply_t, 5, faster=True))
    table.add_row("  the same in CPU time of the processes (robust on a busy machine)",
                  spread["apply cpu"].show(), spread["plain cpu"].show(),
                  ratio("plain cpu", "apply cpu"), "")
    table.add_row("  the same, both with Python's default process settings",
                  spread["apply default"].show(), spread["plain default"].show(),
                  ratio("plain default", "apply default"), "")
    table.add_row("API, program in memory, warm (after one call of each): apply().to_onnx() vs "
                  "torch.onnx.export (which rebuilds its registry on every call)",
                  spread["api"].show(), spread["export"].show(), ratio("export", "api"), "")
    table.add_row("  the first call of each, cold (a fresh process per run, same imports)",
                  spread["api cold"].show(), spread["export cold"].show(),
                  ratio("export cold", "api cold"), "")
    table.add_row("onnxruntime latency, grouped vs flat (median ms; median of per-round ratios)",
                  f"{lat.candidate * 1e3:.3f}", f"{lat.baseline * 1e3:.3f}", f"{lat.ratio:.3f}x",
                  verdict(lat.ratio, 1.02))
    table.add_row("  control: flat vs another session of flat, same rounds (the noise floor)",
                  "", "", f"{lat.control:.3f}x", "")
    table.add_row(f"  per session set (layout spread, sd {lat.spread:.3f})", "", "",
                  " ".join(f"{r:.3f}" for r in lat.set_ratios), "")
    unnamed = latency["unnamed"]
    table.add_row("  with --no-body-node-names (function bodies' nodes unnamed) vs flat",
                  f"{unnamed.candidate * 1e3:.3f}", f"{unnamed.baseline * 1e3:.3f}",
                  f"{unnamed.ratio:.3f}x", verdict(unnamed.ratio, 1.02))
    table.add_row("    its control", "", "", f"{unnamed.control:.3f}x", "")
    names = latency["names"]
    table.add_row("  why: flat graph as onnxruntime runs it, node names of 16 vs 15 characters "
                  "(onnxruntime names inlined nodes _inlfunc_<function>_<node>)",
                  f"{names.candidate * 1e3:.3f}", f"{names.baseline * 1e3:.3f}",
                  f"{names.ratio:.3f}x", "")
    console.print(table)
    console.print(f"graphs onnxruntime runs after inlining and optimizing: grouped {ort_grouped} "
                  f"nodes, flat {ort_flat} nodes; identical up to value names: "
                  + ("yes" if same else "[red]no[/red]"))
    console.print("runs (s): " + "; ".join(
        f"{name} {', '.join(f'{t:.2f}' for t in values)}" for name, values in runs.items()))
    after = function_sizes(grouped_path)
    sizes = Table(title="nodes per function: optimized flat export, then outlined (before) vs "
                  "outlined, then each function optimized (now)")
    for column in ("function", "before", "now", "difference"):
        sizes.add_column(column, justify="left" if column == "function" else "right")
    for name in sorted(set(before) | set(after), key=lambda n: (n.startswith("("), n)):
        old, new = before.get(name), after.get(name)
        diff = "" if old is None or new is None else f"{new - old:+d}"
        sizes.add_row(name, "-" if old is None else str(old), "-" if new is None else str(new),
                      diff)
    console.print(sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
