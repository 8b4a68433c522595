"""The whole benchmark suite, one command, one report.

    make bench            # or: .venv/bin/python -m bench.run [--only NAME ...] [--quick]

Runs every benchmark in its own process, one after the other (never two at once: they time
things), and prints their tables (what they share: ``bench.harness``); the report also goes to
``bench/out/RESULTS.md`` with the date, the machine and the command. Each benchmark measures
rewrite and its real alternative in the same run on the same input and reports ratios of
medians:

=================  =============================================================  ==========
name               what                                                           target
=================  =============================================================  ==========
grouping           IR + match + group vs ``torch.export.unflatten`` (48 blocks)   >= 20x
fx                 ``apply().to_fx()`` vs ``torch.export.unflatten``               >= 3x
onnx_apply         ``rewrite apply`` vs ``torch.onnx.export``; ORT latency         >= 5x, <= 1.02x
onnx_perbody       per-body lowering vs flat vs ``torch.onnx.export``, 12/48       >= 10x, <= 1.5x
onnx_outline       ONNX outlining vs onnx-diagnostic; growth 12/48/192 blocks     >= 10x
scaling            synthetic 10k/100k/1M nodes vs a bare pass; growth             <= 10x, <= 3x,
                                                                                  <= 1.5x
memory             peak RSS of ``rewrite apply`` vs ``torch.onnx.export``, ~1 GB   <= 1.3x
weights            1.24B bf16 Llama ``.pt2``: apply vs cp vs plain path; memory   >= 4x, ...
html_report        ``explain --html``, 48 blocks: page size, opening in Chromium   < 2 MB, < 1 s
checkpoint         1.24B bf16 checkpoint folder: rewrite vs onnxruntime-genai's   < 1x, <= 0.5x,
                   builder vs ``cp``: wall, peak RssAnon, weights step             <= 1.5x
lock               ``rewrite lock`` on the 1.24B Llama ``.pt2``: its cost beyond   reads no
                   grouping, how much of the file it reads                        weight
depth              ``rewrite export`` of 8/32/80-layer checkpoints, each layer    80 layers
                   traced once vs every layer traced: graph time, torch.export    <= 1.3x 8
genai              ``rewrite export`` vs the builder at fp32 and int4 (187M fp32   int4 decode
                   and 1.24B bf16 checkpoints): export wall and RssAnon; prefill,  <= 1x, ...
                   decode ms/token and logits vs eager in onnxruntime; profile
accuracy           ``genai``'s int4 models' error vs eager fp32 over 12 prompts    int4 error
                   (187M; after ``genai``, whose folders it reads)                <= 1x
=================  =============================================================  ==========

``weights`` (issue 22; targets: apply >= 4x the plain path, its weights part <= 2x ``cp``,
peak RssAnon of apply <= 1 GB and of explain <= 600 MB / 3 s, growth 0.5 -> 2.5 GB <= 1.2x)
builds its three models (0.5, 1.2, 2.5 GB of weights) once into bench/out/ (~2 minutes; ~4 GB
of disk, up to ~7.5 GB more while it runs) and needs as much free memory as the heaviest row
takes (``rewrite apply`` before issue 22: ~5x the weights).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"

# name -> (module, full arguments, --quick arguments)
SUITE: dict[str, tuple[str, list[str], list[str]]] = {
    "grouping": ("bench.grouping", [], ["--repeats", "3"]),
    "fx": ("bench.fx_vs_unflatten", ["--repeats", "7"], ["--layers", "12", "--repeats", "3"]),
    "onnx_apply": ("bench.onnx_apply", ["--repeats", "5", "--ort-runs", "1600"],
                   ["--blocks", "12", "--repeats", "1", "--ort-runs", "50"]),
    "onnx_perbody": ("bench.onnx_perbody", [], ["--blocks", "12", "24", "--repeats", "1",
                                                "--body-repeats", "1"]),
    "onnx_outline": ("bench.onnx_outline", ["--repeats", "5"],
                     ["--blocks", "12", "48", "--compare", "12", "--repeats", "1"]),
    "scaling": ("bench.scaling", [], ["--sizes", "10000", "100000"]),
    "memory": ("bench.memory", [], ["--layers", "4", "--width", "512"]),
    "weights": ("bench.weights", [], ["--quick"]),
    "html_report": ("bench.html_report", [], ["--blocks", "12", "--rules", "gpt2", "--loads", "2"]),
    "checkpoint": ("bench.checkpoint", [], ["--quick"]),
    "lock": ("bench.lock", [], ["--quick"]),
    "depth": ("bench.depth", [], ["--quick"]),
    "genai": ("bench.genai", [], ["--quick"]),
    "accuracy": ("bench.accuracy", [], ["--size", "tiny4", "--prompts", "2", "--steps", "8"]),
}


def _machine() -> str:
    cpus = os.cpu_count()
    return f"{platform.machine()}, {cpus} cores, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(SUITE), help="run only these")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    names = args.only or list(SUITE)
    OUT.mkdir(parents=True, exist_ok=True)
    command = "python -m bench.run " + " ".join(argv if argv is not None else sys.argv[1:])
    started = datetime.datetime.now(datetime.timezone.utc)
    sections = [
        f"# rewrite benchmarks\n\n{started:%Y-%m-%d %H:%M} UTC, `{command.strip()}`, {_machine()}\n"
    ]
    failed = []
    for name in names:
        module, full, quick = SUITE[name]
        cmd = [sys.executable, "-m", module, *(quick if args.quick else full)]
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        seconds = time.perf_counter() - t0
        body = proc.stdout.rstrip()
        print(body, flush=True)
        status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
        if proc.returncode != 0:
            failed.append(name)
        print(f"--- {name}: {status}, {seconds:.0f} s", flush=True)
        sections.append(f"## {name}\n\n`python -m {module} {' '.join(cmd[3:])}` ({status}, "
                        f"{seconds:.0f} s)\n\n```\n{body}\n```\n")
    report = OUT / "RESULTS.md"
    report.write_text("\n".join(sections))
    print(f"\nreport: {report.relative_to(ROOT)}")
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
