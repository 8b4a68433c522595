"""Per-body ONNX lowering vs the flat path vs ``torch.onnx.export``, by model depth.

    .venv/bin/python -m bench.onnx_perbody [--blocks 12 48] [--repeats 2]

For each depth, the random-weight GPT-2 of ``bench.onnx_apply`` (width 64, biases drawn), its
program in memory, the same process, after a warm-up, sides in alternating order:

* ``rewrite.apply(rules, program).to_onnx(lowering="per-body")``: each distinct repeated body
  decomposed and translated once (issue 12);
* ``... to_onnx(lowering="flat")``: ``torch.onnx.export(optimize=False)`` of the flat program,
  then the same outlining and optimizing (step 1);
* ``torch.onnx.export(program)`` with its defaults (optimize=True), the plain baseline.

Targets (issue 12): per-body at least 10x faster than the plain export on 48 blocks, and its
time on the deepest model at most 1.5x its time on the shallowest. Medians.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import statistics
import sys
import time

from bench.onnx_apply import RULES, build

SIDES = ("per-body", "flat", "torch.onnx.export")


def _time(side: str, program, rules) -> float:
    import torch

    import rewrite
    from rewrite.backends.onnx.export import quiet_exporter

    gc.collect()
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), quiet_exporter():
        if side == "torch.onnx.export":
            torch.onnx.export(program, dynamo=True, verbose=False, report=False)
        else:
            rewrite.apply(rules, program).to_onnx(lowering=side)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[12, 48])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    import rewrite

    rules = rewrite.load_rules(RULES)
    medians: dict[int, dict[str, float]] = {}
    for blocks in args.blocks:
        path, _ = build(blocks, 32)
        program = torch.export.load(str(path))
        for side in SIDES:  # warm-up
            _time(side, program, rules)
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        for i in range(args.repeats):
            for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
                times[side].append(_time(side, program, rules))
        medians[blocks] = {side: statistics.median(v) for side, v in times.items()}
        print(f"{blocks} blocks: " + ", ".join(
            f"{side} {', '.join(f'{t:.2f}' for t in v)} s" for side, v in times.items()),
            file=sys.stderr)

    print(f"{'blocks':>6} {'per-body s':>11} {'flat s':>8} {'export s':>9} "
          f"{'export/per-body':>16} {'flat/per-body':>14}")
    for blocks, m in medians.items():
        print(f"{blocks:>6} {m['per-body']:>11.2f} {m['flat']:>8.2f} "
              f"{m['torch.onnx.export']:>9.2f} "
              f"{m['torch.onnx.export'] / m['per-body']:>15.1f}x "
              f"{m['flat'] / m['per-body']:>13.1f}x")
    if len(medians) > 1:
        low, high = min(medians), max(medians)
        for side in SIDES:
            growth = medians[high][side] / medians[low][side]
            print(f"{side}: {high} blocks / {low} blocks = {growth:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
