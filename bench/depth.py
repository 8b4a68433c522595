"""Depth benchmark: ``rewrite export`` of Llama-shaped checkpoints of 8, 32 and 80 layers, each
distinct layer traced once (``--trace layers``, the default) vs every layer traced
(``--trace whole``), side by side in one run (issue 40).

    nice .venv/bin/python -m bench.depth [--layers 8 32 80] [--repeats 3] [--rebuild]
    .venv/bin/python -m bench.depth --quick      # 2 and 4 layers, one run: checks the harness

The checkpoints are built here (never downloaded) into ``bench/out/depth/``, once
(``--rebuild``): ``LlamaForCausalLM`` with hidden size 64, 4 heads / 2 KV heads, intermediate
128, a 1,000-word vocabulary, every weight random normal, saved by ``save_pretrained``. Every
row is a fresh process (``rewrite -v export DIR -o OUT/model.onnx``, decode-ready), rows in
alternating order (``bench.harness.rounds``). Per row: wall time, torch.export's own step, and
the graph time: wall minus the weights step (``writing OUT``) and the check against eager
(``checking the written model``), both of which follow the model's size, not its code.

Target (issue 40), printed met or MISSED: with ``--trace layers``, the 80-layer graph time at
most 1.3x the 8-layer one. The table goes to stdout and ``bench/out/depth.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

from bench.harness import Result, Row, load_average, rounds, run_row, verdict

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out" / "depth"
REWRITE = [sys.executable, "-m", "rewrite", "-v", "export"]
ROWS = {
    "layers": Row(lambda d, o: [*REWRITE, str(d), "-o", str(o / "model.onnx")], "model.onnx"),
    "whole": Row(lambda d, o: [*REWRITE, str(d), "-o", str(o / "model.onnx"), "--trace",
                               "whole"], "model.onnx"),
}
TARGET = 1.3


def checkpoint(layers: int, rebuild: bool) -> Path:
    """The random ``layers``-layer checkpoint (built once)."""
    folder = OUT / f"llama-{layers}"
    if (folder / "config.json").is_file() and not rebuild:
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=layers, hidden_size=64, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                         max_position_embeddings=256, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return folder


def graph_seconds(result: Result) -> list[float]:
    """Each run's wall time minus its weights step and its check against eager."""
    found = []
    for run in result.runs:
        aside = sum(seconds for step, seconds in run.steps.items()
                    if step.startswith(("writing OUT", "checking the written model")))
        found.append(run.measure.seconds - aside)
    return found


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def report(results: dict[int, dict[str, Result]]) -> list[str]:
    """The table and the target's verdict."""
    lines = ["| layers | trace | runs | wall s (median) | torch.export s | graph s "
             "(wall - weights - check) | graph / first row's |", "|---|---|---|---|---|---|---|"]
    first: dict[str, float] = {}
    for layers, rows in results.items():
        for name, result in rows.items():
            if not result.runs:
                lines.append(f"| {layers} | {name} | 0 | FAILED: {result.failed} | | | |")
                continue
            graph = _median(graph_seconds(result))
            first.setdefault(name, graph)
            step = next((s for s in result.steps() if s.startswith("exporting ")), None)
            exported = result.step(step) if step else None
            lines.append(f"| {layers} | {name} | {len(result.runs)} | {result.median():.2f} | "
                         f"{exported or 0:.2f} | {graph:.2f} | {graph / first[name]:.2f}x |")
    deepest, shallowest = max(results), min(results)
    ok = [results[k]["layers"].runs for k in (deepest, shallowest)]
    if all(ok):
        ratio = (_median(graph_seconds(results[deepest]["layers"]))
                 / _median(graph_seconds(results[shallowest]["layers"])))
        lines += ["", f"`--trace layers`: {deepest} layers' graph time is {ratio:.2f}x "
                  f"{shallowest} layers' (target at most {TARGET}x): {verdict(ratio <= TARGET)}"]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 32, 80])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.repeats = [2, 4], 1
    before = load_average()
    results: dict[int, dict[str, Result]] = {}
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for layers in args.layers:
        folder = checkpoint(layers, args.rebuild)
        results[layers] = {name: Result() for name in ROWS}
        inputs = sorted(folder.glob("*.safetensors"))

        def run(name: str, folder: Path = folder, inputs: list = inputs, layers: int = layers):
            return run_row(ROWS[name], folder, OUT / f"out-{layers}-{name}",
                           names=("DIR", "OUT"), inputs=inputs, env=env)

        rounds(list(ROWS), dict.fromkeys(ROWS, args.repeats), run, results[layers],
               f"{layers} layers: ", lambda r: f"{r.measure.seconds:.1f}s")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"{stamp}, {platform.machine()}, {os.cpu_count()} cores; load average before "
             f"{before}, after {load_average()}", "", *report(results)]
    text = "\n".join(lines)
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT.parent / "depth.md").write_text(text + "\n")
    return 0 if all(r.runs for rows in results.values() for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
