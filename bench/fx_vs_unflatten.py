"""rewrite's FX modularize vs torch.export.unflatten on a deep GPT-2 export.

    .venv/bin/python -m bench.fx_vs_unflatten [--layers 48] [--repeats 11]

Exports a random-weight GPT-2 with ``--layers`` blocks once, then times, interleaved in the
same process, medians of ``--repeats`` runs:

* ``rewrite.apply(modularize.rules, program).to_fx()`` (reading the graph, grouping, lowering);
* ``torch.export.unflatten(program)``;
* ``program.module()`` (the flat module, for reference);
* each of the above plus its first forward call (rewrite compiles eagerly; unflatten's
  interpreter modules do not need compiling), so no cost hides behind a lazy first call.

Torch runs single-threaded (``torch.set_num_threads(1)``): forward calls on a busy machine
otherwise measure thread-pool contention. The program is unflattened once before timing: unflatten
removes dead nodes from the program in place, so every timed run then sees the same graph. Outputs
of both results are checked against eager PyTorch. Not a test: run it on a quiet machine; it prints
a ratio table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import torch

import rewrite
from bench.harness import timed
from tools import models

TARGET = 3.0


def _check(module: torch.nn.Module, model, args, kwargs) -> None:
    got = module(*args, **kwargs)[0]
    want = model(*args, **kwargs)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--rules", default="rules/modularize.rules")
    options = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)

    model, args, kwargs = models.gpt2(n_layer=options.layers)
    start = time.perf_counter()
    program = models.export((model, args, kwargs))
    print(f"GPT-2, {options.layers} blocks: exported in {time.perf_counter() - start:.1f}s, "
          f"{len(program.graph.nodes)} nodes; torch {torch.__version__}")
    rules = rewrite.load_rules(options.rules)

    # warm-up (and the one in-place change unflatten makes to the program)
    unflat = torch.export.unflatten(program)
    lowered = rewrite.apply(rules, program).to_fx()
    _check(unflat, model, args, kwargs)
    _check(lowered, model, args, kwargs)
    groups = sum(1 for _ in rewrite.apply(rules, program).tree.groups())
    print(f"{groups} groups; both results match eager PyTorch within 1e-5\n")

    cases: dict[str, Callable[[], Any]] = {
        "rewrite apply().to_fx()": lambda: rewrite.apply(rules, program).to_fx(),
        "torch.export.unflatten": lambda: torch.export.unflatten(program),
        "ExportedProgram.module()": lambda: program.module(),
        "rewrite to_fx() + 1st call": (
            lambda: rewrite.apply(rules, program).to_fx()(*args, **kwargs)
        ),
        "unflatten + 1st call": lambda: torch.export.unflatten(program)(*args, **kwargs),
    }
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(options.repeats):  # interleaved, so load changes hit every case alike
        for name, fn in cases.items():
            times, _ = timed(fn)
            wall[name].append(times.wall)
            cpu[name].append(times.cpu)

    def ratio(table: dict[str, list[float]], name: str) -> float:
        ref = "unflatten + 1st call" if "1st call" in name else "torch.export.unflatten"
        return statistics.median(table[ref]) / statistics.median(table[name])

    print(f"medians of {options.repeats} runs, seconds (wall clock | CPU time of this process)\n")
    print(f"| {'step':<28} | {'wall':>7} | {'wall min':>8} | {'wall max':>8} | {'CPU':>7} | "
          f"{'unflatten/this (wall)':>21} | {'(CPU)':>6} |")
    print(f"|{'-' * 30}|{'-' * 9}|{'-' * 10}|{'-' * 10}|{'-' * 9}|{'-' * 23}|{'-' * 8}|")
    for name in cases:
        print(f"| {name:<28} | {statistics.median(wall[name]):7.3f} | {min(wall[name]):8.3f} | "
              f"{max(wall[name]):8.3f} | {statistics.median(cpu[name]):7.3f} | "
              f"{ratio(wall, name):20.1f}x | {ratio(cpu, name):5.1f}x |")
    speedup = ratio(wall, "rewrite apply().to_fx()")
    verdict = "meets" if speedup >= TARGET else "MISSES"
    print(f"\napply().to_fx() is {speedup:.1f}x faster than unflatten (wall-clock medians, "
          f"{ratio(cpu, 'rewrite apply().to_fx()'):.1f}x in CPU time): {verdict} the "
          f"{TARGET:.0f}x target")
    return 0 if speedup >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
