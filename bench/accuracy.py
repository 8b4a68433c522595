"""Each model's error against eager fp32 over several prompts (issue 39's accuracy target).

    flock /work/bench.lock nice .venv/bin/python -m bench.accuracy [--size 180m-fp32]
        [--prompts 12] [--steps 64] [--rows builder-int4 export-int4 NAME=FOLDER ...]

``bench.genai`` reports each model's mean |logit - eager fp32| on one prompt (random ids,
seed 0). Two int4 models with the same weights bit for bit (the builder's and rewrite's, at
the same block size and symmetry) differ there by parts in 10,000: how each graph's float32
rounding falls through onnxruntime's int8 activations (accuracy level 4), which one prompt
cannot tell from a systematic difference. This runs the same measurement
(:func:`bench.genai.decode`: the same feeding code, the eager continuation fed step by step,
the error over the prefill's last row and every step) on ``--prompts`` prompts (seeds 0 to
N-1; seed 0 is bench.genai's), in one process: eager once per prompt, then each row's
folder, as ``bench.genai`` wrote it (``bench/out/genai/SIZE/ROW``) or ``NAME=FOLDER``.

Reported per prompt: each row's error and its ratio to the first row's; over the prompts:
the mean error, the ratio of the means, the range of the per-prompt ratios and on how many
prompts the row's error is at most the first row's; the target (issue 39): each row's mean
error at most the first row's (the builder's). To stdout and
``bench/out/accuracy-SIZE.md``.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path

from bench.genai import PROMPT, STEPS, checkpoint_folder, decode, eager_model, eager_reference
from bench.harness import load_average, verdict
from bench.weights_model import OUT, SIZES

ROWS = ("builder-int4", "export-int4")


def folders(size: str, rows: list[str]) -> dict[str, Path]:
    """Each row's model folder: ``NAME=FOLDER``, or bench.genai's output for ``NAME``."""
    found = {}
    for row in rows:
        name, _, folder = row.partition("=")
        found[name] = Path(folder) if folder else OUT / "genai" / size / name
        if not (found[name] / "model.onnx").is_file():
            sys.exit(f"{found[name]}: no model.onnx (run python -m bench.genai --sizes {size} "
                     "--precisions int4 first, or give NAME=FOLDER)")
    return found


def errors(checkpoint: Path, models: dict[str, Path], prompts: int, steps: int,
           prompt: int = PROMPT) -> dict[str, list[float]]:
    """Each model's mean |logit - eager fp32| on each prompt (seeds 0 to ``prompts`` - 1)."""
    model = eager_model(checkpoint)
    found: dict[str, list[float]] = {name: [] for name in models}
    for seed in range(prompts):
        ref = eager_reference(model, prompt, steps, seed)
        for name, folder in models.items():
            found[name].append(decode(folder, ref)["mean_abs"])
        print(f"prompt {seed}: " + ", ".join(f"{name} {values[-1]:.5f}"
                                             for name, values in found.items()),
              file=sys.stderr, flush=True)
    return found


def report(found: dict[str, list[float]], command: str, header: str) -> str:
    """The per-prompt table and the summary over the prompts (module docstring)."""
    names = list(found)
    first = found[names[0]]
    lines = [header, "", f"`{command}`", "",
             "| prompt | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i, base in enumerate(first):
        cells = [f"{found[names[0]][i]:.5f}"] + [
            f"{found[n][i]:.5f} ({found[n][i] / base:.4f}x)" for n in names[1:]]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    lines += ["", "| row | mean error | ratio of the means | per-prompt ratios | prompts at "
              f"most {names[0]}'s |", "|---|---|---|---|---|"]
    for name in names:
        ratios = [v / b for v, b in zip(found[name], first)]
        at_most = sum(v <= b for v, b in zip(found[name], first))
        lines.append(f"| {name} | {statistics.mean(found[name]):.5f} | "
                     f"{statistics.mean(found[name]) / statistics.mean(first):.5f}x | "
                     f"{min(ratios):.4f}-{max(ratios):.4f} | {at_most} of {len(first)} |")
    lines += ["", "| criterion | measured | target | verdict |", "|---|---|---|---|"]
    for name in names[1:]:
        ratio = statistics.mean(found[name]) / statistics.mean(first)
        lines.append(f"| {name}'s mean error / {names[0]}'s (issue 39) | {ratio:.5f}x | "
                     f"<= 1x | {verdict(ratio <= 1)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), default="180m-fp32")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--rows", nargs="+", default=list(ROWS),
                        help="bench.genai rows or NAME=FOLDER; ratios are to the first")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.steps < 1:
        parser.error("--prompts and --steps must be at least 1")
    models = folders(args.size, args.rows)
    command = "python -m bench.accuracy " + " ".join(
        argv if argv is not None else sys.argv[1:])
    started, before = datetime.datetime.now(datetime.timezone.utc), load_average()
    found = errors(checkpoint_folder(args.size), models, args.prompts, args.steps)
    header = (f"### {args.size}: mean |logit - eager fp32| over {args.prompts} prompts of "
              f"{PROMPT} tokens, {args.steps} steps ({started:%Y-%m-%d %H:%M} UTC, load "
              f"average {before} before, {load_average()} after)")
    text = report(found, command.strip(), header)
    print(text)
    (OUT / f"accuracy-{args.size}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
