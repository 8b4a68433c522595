"""Peak memory of ``rewrite apply`` vs a plain ``torch.onnx.export`` of the same program.

    .venv/bin/python -m bench.memory [--layers 20 --width 1024]

Builds a wide random-weight GPT-2 (about 1 GB of float32 weights with the defaults), saves it
as a .pt2 once (bench/out/), then runs each job in a fresh process and reads its peak RSS:

* load: ``torch.export.load`` only (the floor both jobs share);
* torch.onnx.export: load, export and save with defaults (optimize=True; one file under 2 GB);
* rewrite apply: ``rewrite apply rules/gpt2.rules model.pt2 -o out.onnx`` in-process.

Target: rewrite apply's peak RSS at most 1.3x that of torch.onnx.export.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"

_PRELUDE = (
    "import resource, json, sys, time, warnings; warnings.filterwarnings('ignore');"
    " t0 = time.perf_counter()\n"
)
_REPORT = (
    "\nprint('RESULT ' + json.dumps({'rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss"
    " / 1024, 'seconds': time.perf_counter() - t0}))\n"
)

JOBS = {
    "load": "import torch\nep = torch.export.load({pt2!r})\n",
    "torch.onnx.export": (
        "import torch\nep = torch.export.load({pt2!r})\n"
        "prog = torch.onnx.export(ep, dynamo=True, verbose=False)\n"
        "prog.save({out!r})\n"
    ),
    "rewrite apply": (
        "from rewrite.cli.main import main\n"
        "rc = main(['-q', 'apply', {rules!r}, {pt2!r}, '-o', {out!r}])\n"
        "assert rc == 0, rc\n"
    ),
}


def build_model(layers: int, width: int) -> Path:
    path = OUT / f"gpt2_wide_perturbed_{layers}x{width}.pt2"
    if path.exists():
        return path
    import torch

    sys.path.insert(0, str(ROOT))
    from tools import models

    OUT.mkdir(parents=True, exist_ok=True)
    model = models.gpt2(n_layer=layers, n_embd=width, n_head=16, vocab=1000, positions=128)
    program = models.export(model)
    torch.export.save(program, str(path))
    return path


def run_job(name: str, pt2: Path) -> dict:
    out = OUT / f"memory_{name.replace(' ', '_').replace('.', '_')}.onnx"
    code = _PRELUDE + JOBS[name].format(pt2=str(pt2), out=str(out),
                                        rules=str(ROOT / "rules/gpt2.rules")) + _REPORT
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args(argv)
    pt2 = build_model(args.layers, args.width)
    size_mb = pt2.stat().st_size / 2**20
    results = {name: run_job(name, pt2) for name in JOBS}
    base = results["torch.onnx.export"]["rss_mb"]
    print(f"\nPeak RSS, GPT-2 {args.layers} layers x {args.width} wide ({size_mb:.0f} MB .pt2)")
    print(f"{'job':<20} {'peak RSS MB':>12} {'seconds':>9} {'vs torch.onnx.export':>22}")
    for name, r in results.items():
        print(f"{name:<20} {r['rss_mb']:>12.0f} {r['seconds']:>9.1f} {r['rss_mb'] / base:>21.2f}x")
    ratio = results["rewrite apply"]["rss_mb"] / base
    print(f"target: rewrite apply <= 1.30x torch.onnx.export -> "
          f"{'met' if ratio <= 1.3 else 'NOT met'} ({ratio:.2f}x)")
    return {"results": results, "ratio": ratio}


if __name__ == "__main__":
    main()
