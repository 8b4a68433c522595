"""onnxruntime latency of one model vs another, with a control, free of order and layout bias.

    .venv/bin/python -m bench.ort_latency CANDIDATE.onnx BASELINE.onnx [--sessions 16] [--runs 1600]

Measured on CPU, one thread, default graph optimizations. What this design removes, each
found by measuring (bench/RESULTS.md, issue 11):

* A session's memory layout moves its latency by +-2-3% (two sessions of the same file differ
  that much), and the layout depends on the order the sessions were created in: a model
  created first or last in a fixed order came out 2-4% faster than the same model created in
  between. So ``--sessions`` fresh *sets* of sessions are made one after the other, each set
  holding one session of the candidate, of the baseline and of a second copy of the baseline
  (the control), created in a shuffled order; a set is released before the next is made.
* Run order: a model run right after itself finds warm caches. Each round runs the three
  sessions once each, in a shuffled order.

The ratio reported is the median over all rounds of (candidate / baseline), and the same for
the control (baseline copy / baseline): the control is the noise floor of the machine and of
the design. Per-set ratios (the median of each set's rounds) show the layout spread.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import attrs
import numpy as np

from tools.feeds import feeds

SIDES = ("candidate", "baseline", "control")


@attrs.frozen
class Latency:
    """Medians in seconds; ratios candidate / baseline and control / baseline."""

    candidate: float
    baseline: float
    ratio: float
    control: float
    set_ratios: tuple[float, ...]
    set_controls: tuple[float, ...]

    @property
    def spread(self) -> float:
        """Standard deviation of the per-set ratios (the layout spread)."""
        return statistics.pstdev(self.set_ratios)


def _session(path: Path, dump: Path | None = None, optimize: bool = True):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if dump is not None:
        options.optimized_model_filepath = str(dump)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def dump_optimized(path: Path) -> Path:
    """Write the graph onnxruntime runs for ``path`` (after inlining functions and
    optimizing) next to it, as ``*.ort-optimized.onnx``."""
    target = path.with_suffix(".ort-optimized.onnx")
    _session(path, target)
    return target


def compare(candidate: Path, baseline: Path, feeds: dict[str, np.ndarray], *,
            sessions: int = 16, runs: int = 1600, seed: int = 0, optimize: bool = True) -> Latency:
    """Latency of ``candidate`` vs ``baseline`` (see the module docstring): ``runs`` rounds in
    all, spread over ``sessions`` sets of fresh sessions. Outputs must agree within 1e-4.
    ``optimize=False`` runs the graphs as they are (onnxruntime's optimizations off)."""
    paths = {"candidate": candidate, "baseline": baseline, "control": baseline}
    rng = random.Random(seed)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    ratios: dict[str, list[float]] = {"candidate": [], "control": []}
    set_ratios: dict[str, list[float]] = {"candidate": [], "control": []}
    rounds = max(1, runs // sessions)
    for _ in range(sessions):
        order = list(SIDES)
        rng.shuffle(order)
        live = {side: _session(paths[side], optimize=optimize) for side in order}
        inputs = {side: {i.name: feeds[i.name] for i in s.get_inputs()} for side, s in live.items()}
        outputs = {side: s.run(None, inputs[side]) for side, s in live.items()}
        for a, b in zip(outputs["candidate"], outputs["baseline"]):
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
        for side, s in live.items():  # warm-up
            for _ in range(5):
                s.run(None, inputs[side])
        these: dict[str, list[float]] = {"candidate": [], "control": []}
        for _ in range(rounds):
            rng.shuffle(order)
            took = {}
            for side in order:
                start = time.perf_counter()
                live[side].run(None, inputs[side])
                took[side] = time.perf_counter() - start
            for side in SIDES:
                times[side].append(took[side])
            for side in these:
                these[side].append(took[side] / took["baseline"])
        for side in these:
            ratios[side].extend(these[side])
            set_ratios[side].append(statistics.median(these[side]))
        del live
    return Latency(candidate=statistics.median(times["candidate"]),
                   baseline=statistics.median(times["baseline"]),
                   ratio=statistics.median(ratios["candidate"]),
                   control=statistics.median(ratios["control"]),
                   set_ratios=tuple(set_ratios["candidate"]),
                   set_controls=tuple(set_ratios["control"]))


def with_node_names(path: Path, length: int) -> Path:
    """A copy of ``path`` whose nodes are named ``n000...`` with ``length`` characters."""
    import onnx

    model = onnx.load(str(path))
    for index, node in enumerate(model.graph.node):
        node.name = f"n{index:0{length - 1}d}"
    target = path.with_suffix(f".names{length}.onnx")
    onnx.save(model, str(target))
    return target


def name_length_cost(path: Path, feeds: dict[str, np.ndarray], runs: int = 1600) -> Latency:
    """onnxruntime's per-run cost of node names longer than 15 characters (the small-string
    limit of libstdc++): the graph in ``path`` with 16-character node names vs the same graph
    with 15-character names, optimizations off (the graph runs as it is)."""
    return compare(with_node_names(path, 16), with_node_names(path, 15), feeds, runs=runs,
                   optimize=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("candidate", type=Path)
    parser.add_argument("baseline", type=Path)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--runs", type=int, default=1600)
    args = parser.parse_args(argv)
    result = compare(args.candidate, args.baseline, feeds(args.baseline),
                     sessions=args.sessions, runs=args.runs)
    print(f"candidate {result.candidate * 1e3:.3f} ms, baseline {result.baseline * 1e3:.3f} ms: "
          f"{result.ratio:.3f}x (control {result.control:.3f}x); per session set "
          + " ".join(f"{r:.3f}" for r in result.set_ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
