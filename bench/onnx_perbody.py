"""Per-body ONNX lowering vs the flat path vs ``torch.onnx.export``, by model depth.

    .venv/bin/python -m bench.onnx_perbody [--blocks 12 48] [--repeats 5] [--sides ...]
    .venv/bin/python -m bench.onnx_perbody --model llama --blocks 32 --hidden 1024
    .venv/bin/python -m bench.onnx_perbody --model llama-static --blocks 8 32 --hidden 256

For each depth, the random-weight GPT-2 of ``bench.onnx_apply`` (width 64, biases drawn), or
with ``--model llama`` a random-weight LlamaModel (``--hidden`` wide, 4x as wide MLP, 16 heads,
4 key/value heads, sequence 32: the headline "realistic depth" figure), or with ``--model
llama-static`` a LlamaForCausalLM with a static KV cache as transformers exports it for
deployment (its cache updates are in-place ops: the per-body path functionalizes the program
first), its program in memory, the same process, after a warm-up, sides in alternating order:

* ``rewrite.apply(rules, program).to_onnx(lowering="per-body")``: each distinct repeated body
  decomposed and translated once (issue 12);
* ``... to_onnx(lowering="flat")``: ``torch.onnx.export(optimize=False)`` of the flat program,
  then the same outlining and optimizing (step 1);
* ``torch.onnx.export(program)`` with its defaults (optimize=True), the plain baseline.

Targets (issue 12): per-body at least 10x faster than the plain export on 48 blocks, and its
time on the deepest model at most 1.5x its time on the shallowest. Medians: of ``--repeats``
runs per side (at least 5; min and max are shown too), and of at least ``--body-repeats`` for
the per-body side (a fraction of a second each; its growth ratio is a ratio of two small
times, where the machine's noise shows). The runs are warm: each side ran once before (its
first call, reported apart: rewrite then keeps torchlib's registry, torch.onnx.export rebuilds
it on every call); the first side to run also pays for what the process imports lazily.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import statistics
import sys
import time

from bench.onnx_apply import OUT, RULES, build
from bench.harness import Spread

LLAMA_RULES = RULES.parent / "llama.rules"

SIDES = ("per-body", "flat", "torch.onnx.export")


def _time(side: str, program, rules) -> float:
    import torch

    import rewrite
    from rewrite.cli.logs import quiet_libraries

    gc.collect()
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), quiet_libraries():
        if side == "torch.onnx.export":
            torch.onnx.export(program, dynamo=True, verbose=False, report=False)
        else:
            rewrite.apply(rules, program).to_onnx(lowering=side)
    return time.perf_counter() - start


def _save(program, name: str):
    import torch

    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.pt2"
    torch.export.save(program, str(path))
    return path


def build_llama(blocks: int, hidden: int):
    """Save a random-weight LlamaModel's program; returns its path."""
    import torch
    from transformers import LlamaModel

    from tools.models import llama_config, perturb

    torch.manual_seed(0)
    model = perturb(LlamaModel(llama_config(blocks, hidden, use_cache=False)).eval())
    ids = torch.randint(0, 1000, (1, 32))
    program = torch.export.export(model, (ids,), kwargs={"return_dict": False,
                                                         "use_cache": False})
    return _save(program, f"llama-{blocks}x{hidden}")


def build_llama_static(blocks: int, hidden: int):
    """Save the program of a random-weight LlamaForCausalLM with a static KV cache, as
    transformers exports it for deployment (``TorchExportableModuleForDecoderOnlyLM``, strict,
    4 new tokens into a 64-token cache: the cache updates are in-place ops); returns its path."""
    import warnings

    import torch
    from transformers import GenerationConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    from tools.models import llama_config, perturb

    torch.manual_seed(0)
    model = perturb(LlamaForCausalLM(llama_config(blocks, hidden, use_cache=True)).eval())
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": 64})
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = wrapper.export(input_ids=torch.randint(0, 1000, (1, 4)),
                                 cache_position=torch.arange(4), strict=True)
    return _save(program, f"llama-static-{blocks}x{hidden}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[12, 48])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--body-repeats", type=int, default=7,
                        help="runs of the per-body side (at least --repeats)")
    parser.add_argument("--model", choices=("gpt2", "llama", "llama-static"), default="gpt2")
    parser.add_argument("--hidden", type=int, default=1024, help="llama: hidden size")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES),
                        help="what to time (the flat path is the slowest to measure)")
    args = parser.parse_args(argv)
    sides = tuple(args.sides)

    import torch

    import rewrite

    rules = rewrite.load_rules(RULES if args.model == "gpt2" else LLAMA_RULES)
    builders = {"llama": build_llama, "llama-static": build_llama_static}
    medians: dict[int, dict[str, float]] = {}
    for blocks in args.blocks:
        path = (builders[args.model](blocks, args.hidden) if args.model in builders
                else build(blocks, 32)[0])
        program = torch.export.load(str(path))
        first = {side: _time(side, program, rules) for side in sides}  # warm-up, reported
        times: dict[str, list[float]] = {side: [] for side in sides}
        for i in range(args.repeats):
            for side in (sides if i % 2 == 0 else sides[::-1]):
                times[side].append(_time(side, program, rules))
        if "per-body" in times:
            for _ in range(args.body_repeats - args.repeats):
                times["per-body"].append(_time("per-body", program, rules))
        medians[blocks] = {side: statistics.median(v) for side, v in times.items()}
        print(f"{blocks} blocks: " + ", ".join(
            f"{side} {', '.join(f'{t:.2f}' for t in v)} s" for side, v in times.items()),
            file=sys.stderr)
        print(f"{blocks} blocks, s: " + "; ".join(
            f"{side} {Spread.of(v).show()}, first call {first[side]:.2f}"
            for side, v in times.items()))

    nan = float("nan")
    print(f"{'blocks':>6} {'per-body s':>11} {'flat s':>8} {'export s':>9} "
          f"{'export/per-body':>16} {'flat/per-body':>14}")
    for blocks, m in medians.items():
        body, flat, plain = (m.get(side, nan) for side in SIDES)
        print(f"{blocks:>6} {body:>11.2f} {flat:>8.2f} {plain:>9.2f} "
              f"{plain / body:>15.1f}x {flat / body:>13.1f}x")
    if len(medians) > 1:
        low, high = min(medians), max(medians)
        for side in sides:
            growth = medians[high][side] / medians[low][side]
            print(f"{side}: {high} blocks / {low} blocks = {growth:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
