"""How the core engine scales: IR build and grouping on synthetic graphs of 10k to 1M nodes.

    .venv/bin/python -m bench.scaling                       # 10k, 100k, 1M nodes (~4 min)
    .venv/bin/python -m bench.scaling --sizes 10000 100000 --repeats 5

Graphs come from :mod:`tools.synthetic` (transformer-shaped ``torch.fx`` graphs with
``nn_module_stack``, shared-module calls, stackless nodes and tags; no ``torch.export``).
For each size, all measured in the same run, CPU time (``time.process_time``, robust to other
processes on the machine), median of interleaved runs (``--repeats`` for the largest size,
more for smaller ones, up to 5x; per round the bare passes 5 times and each grouping 3 times,
back to back, so both meet warm caches):

* **bare FX pass**: one Python loop over the FX graph's nodes and their input nodes;
* **IR build**: :func:`rewrite.frontends.fx.graph.from_fx_graph` (target: within 10x of the bare
  FX pass). ``Node`` records are built on first access; building all of them is reported
  separately (``nodes``);
* **bare IR pass**: one Python loop over the IR's nodes and their inputs (after the records
  are built, so it is the fastest possible floor);
* **grouping**: :func:`rewrite.grouping.group_graph` (matching, placement, the group table
  and validation) for each rule set below (target: within 3x of the bare IR pass). The
  ``Group`` records of the result are built on first read, like the nodes: reported
  separately (``Group records``);
* **growth**: time per node at the largest size over the smallest (target: at most 1.5x).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import Callable

import torch

from tools.synthetic import synthetic_graph
from rewrite import parse_rules
from rewrite.compile import RuleSet, load_rules
from rewrite.frontends.fx.graph import from_fx_graph
from rewrite.grouping import group_graph
from rewrite.ir import Graph

RULE_SETS: dict[str, Callable[[], RuleSet]] = {
    "modularize": lambda: load_rules("modularize"),
    "transformer": lambda: parse_rules(
        """
        group class *Block
        group class *Attention or class *MLP
        group path embed or path norm as "Edge_{name}"
        group path rope@*
        flat class *Dropout
        tag op aten.matmul* with kind = "mm"
        """,
        "transformer.rules",
    ),
    "split": lambda: parse_rules('split by stage\ngroup class *Block', "split.rules"),
}


BARE_PASSES = 5
"""Bare passes are cheap and their time is the denominator of every ratio: each round runs
them several times back to back (all runs count towards the median)."""

GROUPING_RUNS = 3
"""Grouping runs back to back too (after one collection of garbage per rule set), so that the
grouping and the bare pass it is compared with meet the same (warm) caches."""


def bare_fx_pass(graph: torch.fx.Graph) -> int:
    """The floor for reading an FX graph: visit every node and every input edge."""
    edges = 0
    for node in graph.nodes:
        for _ in node.all_input_nodes:
            edges += 1
    return edges


def bare_ir_pass(graph: Graph) -> int:
    """The floor for reading the IR: visit every node and every input edge."""
    edges = 0
    for node in graph.nodes:
        for _ in node.inputs:
            edges += 1
    return edges


def _progress(message: str) -> None:
    """Progress on a terminal only (reports that capture the output stay clean)."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def _cpu(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def measure(sizes: list[int], repeats: int, rule_sets: dict[str, RuleSet]) -> list[dict]:
    """All timings per graph size (seconds, medians). Every repeat goes over every size, so
    the load of a shared machine hits all sizes alike."""
    graphs, rows = [], []
    for size in sizes:
        _progress(f"building a {size}-node graph...")
        start = time.perf_counter()
        graphs.append(synthetic_graph(size))
        rows.append({"built": time.perf_counter() - start, "nodes": len(graphs[-1].nodes)})
    # the FX graphs live to the end: keep the collector from scanning their millions of
    # objects again and again (between timings; rewrite pauses it inside its own passes)
    gc.collect()
    gc.freeze()
    keys = ["bare_fx", "ir", "bare_ir", *rule_sets]
    times = [{k: [] for k in keys} for _ in sizes]
    irs: list[Graph | None] = [None] * len(sizes)
    # small graphs take milliseconds: repeat them more (about as much work as the largest)
    counts = [min(max(repeats, repeats * max(sizes) // size), 5 * repeats) for size in sizes]
    for repeat in range(max(counts)):
        _progress(f"round {repeat + 1} of {max(counts)}...")
        for k, fx_graph in enumerate(graphs):
            if repeat >= counts[k]:
                continue
            times[k]["bare_fx"].extend(_cpu(lambda: bare_fx_pass(fx_graph))[0]
                                       for _ in range(BARE_PASSES))
            irs[k] = None  # free the previous IR outside the timing
            gc.collect()
            elapsed, graph = _cpu(lambda: from_fx_graph(fx_graph))
            irs[k] = graph
            times[k]["ir"].append(elapsed)
            if repeat == 0:
                rows[k]["materialize"] = _cpu(graph.nodes.materialize)[0]
            else:
                graph.nodes.materialize()
            times[k]["bare_ir"].extend(_cpu(lambda: bare_ir_pass(graph))[0]
                                       for _ in range(BARE_PASSES))
            for name, rules in rule_sets.items():
                gc.collect()
                for _ in range(GROUPING_RUNS):
                    elapsed, tree = _cpu(lambda: group_graph(rules, graph))
                    times[k][name].append(elapsed)
                if repeat == 0:  # the Group records, ids and owners, built on first read
                    rows[k].setdefault("records", {})[name] = _cpu(
                        lambda tree=tree: (tree.root, tree.owner))[0]
                del tree
    for row, graph, timing in zip(rows, irs, times):
        assert graph is not None
        row.update(edges=bare_ir_pass(graph), calls=len(graph.calls))
        row["groups"] = {name: sum(1 for _ in group_graph(rules, graph).groups())
                         for name, rules in rule_sets.items()}
        row.update({k: statistics.median(v) for k, v in timing.items()})
    return rows


def _us(seconds: float, nodes: int) -> str:
    return f"{seconds / nodes * 1e6:7.3f}"


def report(results: list[dict], rule_names: list[str]) -> str:
    lines = []
    head = (f"{'nodes':>9} {'edges':>9} {'calls':>8} | {'bare FX':>7} {'IR':>7} {'ratio':>6}"
            f" {'nodes':>7} | {'bare IR':>7}")
    for name in rule_names:
        head += f" | {name[:11]:>11} {'ratio':>6} {'groups':>7}"
    lines += ["time per node in microseconds (CPU time, median); ratio = time / bare pass",
              head,
              "-" * len(head)]
    for r in results:
        n = r["nodes"]
        line = (f"{n:>9} {r['edges']:>9} {r['calls']:>8} | {_us(r['bare_fx'], n)} "
                f"{_us(r['ir'], n)} {r['ir'] / r['bare_fx']:5.1f}x {_us(r['materialize'], n)}"
                f" | {_us(r['bare_ir'], n)}")
        for name in rule_names:
            line += (f" | {_us(r[name], n):>11} {r[name] / r['bare_ir']:5.1f}x "
                     f"{r['groups'][name]:>7}")
        lines.append(line)
    lines.append("")
    lines.append("Group records (Group objects, ids, owner per node; built on first read, "
                 "paid once by whoever reads them), us per node:")
    for r in results:
        lines.append(f"{r['nodes']:>9}   " + ", ".join(
            f"{name} {_us(r['records'][name], r['nodes']).strip()}" for name in rule_names))
    if len(results) > 1:
        first, last = results[0], results[-1]

        def growth(key: str) -> str:
            per = [r[key] / r["nodes"] for r in (first, last)]
            return f"{per[1] / per[0]:.2f}x"

        lines.append("")
        lines.append(f"growth of time per node, {first['nodes']} -> {last['nodes']} nodes: "
                     f"IR build {growth('ir')}, "
                     + ", ".join(f"{name} {growth(name)}" for name in rule_names))
    lines.append("(IR = from_fx_graph; nodes = building every Node record on first access, "
                 "paid once by whoever reads them; synthetic graphs built in "
                 + ", ".join(f"{r['built']:.0f} s" for r in results) + ")")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rules", nargs="+", choices=list(RULE_SETS), default=list(RULE_SETS))
    args = parser.parse_args(argv)
    rule_sets = {name: RULE_SETS[name]() for name in args.rules}
    results = measure(sorted(args.sizes), args.repeats, rule_sets)
    print(report(results, list(rule_sets)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
