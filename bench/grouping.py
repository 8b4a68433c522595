"""Grouping time (the group tree only) on GPT-2 exports of growing depth, next to
``torch.export.unflatten``'s time (a module hierarchy built): not like for like.

    .venv/bin/python -m bench.grouping                  # 12, 24, 48 blocks (~2 min)
    .venv/bin/python -m bench.grouping --blocks 48 --repeats 7

For each depth, one random-weight GPT-2 (``transformers``, ``return_dict=False``) is exported
once; then, on that same program and in the same run, interleaved and repeated (each repeat
goes over every depth):

* **rewrite**: read the program into the IR, match ``rules/gpt2.rules`` and build the group tree
  (``rewrite.apply``: frontend + grouping; no lowering);
* **unflatten**: ``torch.export.unflatten(program)``, which rebuilds the module hierarchy.

These do not do the same work: grouping decides which node goes in which group (a tree of
numpy columns), unflatten builds runnable submodules with their code. The ratio says how
small grouping's share of a lowering is, not that rewrite builds modules faster: the
like-for-like figure is ``bench.fx_vs_unflatten`` (``apply().to_fx()``, a module hierarchy
too). Medians of the repeats (at least 5; min and max shown), in CPU time of this process
(``time.process_time``: other processes on a shared machine do not count; the collector
runs between repeats, not inside them); the table gives time per node and the ratio (target:
grouping at least 20x under unflatten's time, and its time per node flat as the graph grows).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings

import torch

import rewrite
from bench.harness import timed
from tools import models


def export_gpt2(blocks: int) -> torch.export.ExportedProgram:
    return models.export(models.gpt2(n_layer=blocks))


def _progress(message: str) -> None:
    """Progress on a terminal only (reports that capture the output stay clean)."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def measure(programs: dict[int, torch.export.ExportedProgram], rules, repeats: int
            ) -> list[tuple[int, dict]]:
    """Medians per depth; every repeat times every depth, so machine load hits all alike."""
    ours: dict[int, list[float]] = {b: [] for b in programs}
    theirs: dict[int, list[float]] = {b: [] for b in programs}
    for _ in range(repeats):
        for blocks, program in programs.items():
            ours[blocks].append(timed(lambda: rewrite.apply(rules, program))[0].cpu)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs[blocks].append(timed(lambda: torch.export.unflatten(program))[0].cpu)
    rows = []
    for blocks, program in programs.items():
        result = rewrite.apply(rules, program)
        rows.append((blocks, {
            "nodes": len(result.tree.graph.nodes),
            "groups": sum(1 for _ in result.tree.groups()),
            "rewrite": statistics.median(ours[blocks]),
            "unflatten": statistics.median(theirs[blocks]),
            "low": min(ours[blocks]), "high": max(ours[blocks]),
        }))
    return rows


def report(rows: list[tuple[int, dict]]) -> str:
    lines = [
        f"{'blocks':>6} {'nodes':>6} {'groups':>6} | {'rewrite ms':>10} {'us/node':>8} | "
        f"{'unflatten ms':>12} {'us/node':>8} | {'unflatten / grouping':>20} | "
        f"{'grouping ms min-max':>19}",
    ]
    lines.append("-" * len(lines[0]))
    for blocks, r in rows:
        n = r["nodes"]
        lines.append(
            f"{blocks:>6} {n:>6} {r['groups']:>6} | {r['rewrite'] * 1e3:>10.2f} "
            f"{r['rewrite'] / n * 1e6:>8.2f} | {r['unflatten'] * 1e3:>12.1f} "
            f"{r['unflatten'] / n * 1e6:>8.1f} | {r['unflatten'] / r['rewrite']:>19.1f}x | "
            f"{r['low'] * 1e3:>8.2f}-{r['high'] * 1e3:<10.2f}"
        )
    if len(rows) > 1:
        (_, a), (_, b) = rows[0], rows[-1]
        growth = (b["rewrite"] / b["nodes"]) / (a["rewrite"] / a["nodes"])
        lines.append(f"rewrite time per node, {a['nodes']} -> {b['nodes']} nodes: {growth:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[12, 24, 48])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    rules = rewrite.load_rules("gpt2")
    programs = {}
    for blocks in args.blocks:
        _progress(f"exporting a {blocks}-block GPT-2...")
        programs[blocks] = export_gpt2(blocks)
    rows = measure(programs, rules, args.repeats)
    print(f"GPT-2 exports, rules/gpt2.rules; median CPU time of {args.repeats} interleaved "
          "repeats; grouping (group tree only) next to unflatten (modules built): not like "
          "for like, see bench.fx_vs_unflatten")
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
