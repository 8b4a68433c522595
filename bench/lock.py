"""What ``rewrite lock`` costs on the 1.24B-parameter Llama of the weights benchmark, beyond
grouping, and whether it reads a weight.

    nice .venv/bin/python -m bench.lock [--model PATH] [--out DIR] [--rounds N] [--check-weights]
    .venv/bin/python -m bench.lock --quick           # a tiny model, one round: the harness

Builds (once, ``bench/weights_model.py``) or takes the 2.47 GB bf16 ``.pt2``. Each round runs
three fresh processes, in alternating order:

* one that times, in turn: reading + grouping (``rewrite.apply`` with ``rules/llama.rules``),
  lowering to ONNX (``backends.onnx.lower``, no file written; ``rewrite lock`` lowers as
  ``explain --onnx`` does, with ``check_weights=False``), split into the steps the backend
  reports (its first step also builds torchlib's registry and the decomposition tables, once
  per process), and the lock itself (``structure.of_lowering`` + ``dumps``). After each step
  it reads how much of the ``.pt2`` is resident in the process (``Rss`` of its mappings in
  ``/proc/self/smaps``: pages read in), so a step that read the 2.4 GB of weights would show
  it;
* ``rewrite -q explain RULES MODEL`` and ``rewrite -q lock RULES MODEL -o FILE``: whole
  processes (imports included), wall clock and CPU time; their difference is what the lock
  costs beyond grouping.

Medians over the rounds, with the load average before and after (the machine is shared: a
busy one stretches every step, CPU time much less than wall clock).
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import Spread, load_average, timed
from bench.weights_model import OUT, ensure

_MAPPING = re.compile(r"[0-9a-f]+-[0-9a-f]+ ")
ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "llama.rules"
LOWER = "lower (no file)"
LOCK = "lock (of_lowering + dumps)"


def resident_mb(path: Path) -> float:
    """MB of ``path``'s mappings resident in this process (pages of the file read in)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if _MAPPING.match(line):
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total / 1024


def measure(model: Path, check_weights: bool = False, rules: str | Path = RULES
            ) -> dict[str, tuple[float, float]]:
    """Step -> (seconds, MB of the file resident after it); the lowering's own steps as
    ``lower: TEXT`` -> (seconds, nan), in the order they ran."""
    from rich.console import Console

    import rewrite
    from rewrite.backends.onnx import OnnxOptions, lower
    from rewrite.cli.steps import Steps
    from rewrite.structure import dumps, of_lowering

    found: dict[str, tuple[float, float]] = {}
    mark = (time.perf_counter(), resident_mb(model))

    def step(name: str) -> None:
        nonlocal mark
        now = (time.perf_counter(), resident_mb(model))
        found[name] = (now[0] - mark[0], now[1])
        mark = (time.perf_counter(), resident_mb(model))

    lowering_steps: dict[str, tuple[float, float]] = {}
    steps = Steps(Console(file=io.StringIO()), spinner=False, finished=lambda text, seconds:
                  lowering_steps.__setitem__(f"lower: {text}", (seconds, float("nan"))))
    result = rewrite.apply(rules, str(model))
    step("read + group")
    lowering = lower(result, OnnxOptions(check_weights=check_weights), steps)  # False: as lock
    step(LOWER)
    found.update(lowering_steps)
    text = dumps(of_lowering(lowering))
    step(LOCK)
    found["lock bytes"] = (len(text.encode()), 0.0)
    return found


def _timed(command: list[str]) -> tuple[float, float, str]:
    """Wall clock and CPU seconds of ``command`` run to its end (:func:`bench.harness.timed`:
    its CPU time is the child's), its stdout; a failure exits with its stderr."""
    times, done = timed(lambda: subprocess.run(command, capture_output=True, text=True,
                                               cwd=ROOT))
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return times.wall, times.cpu, done.stdout


def _round(model: Path, check_weights: bool, lock: Path, reverse: bool) -> dict[str, tuple]:
    """One round of the three processes: name -> ``(wall, cpu)``, and ``steps`` -> the
    in-process measure."""
    cli = [sys.executable, "-m", "rewrite", "-q"]
    runs = {
        "steps": [sys.executable, "-m", "bench.lock", "--model", str(model), "--one",
                  *(["--check-weights"] if check_weights else [])],
        "explain": [*cli, "explain", str(RULES), str(model)],
        "lock": [*cli, "lock", str(RULES), str(model), "-o", str(lock)],
    }
    found = {}
    for name in reversed(runs) if reverse else runs:
        wall, cpu, out = _timed(runs[name])
        found[name] = json.loads(out) if name == "steps" else (wall, cpu)
    return found


def report(model: Path, rounds: list[dict], loads: tuple[str, str]) -> list[str]:
    """The medians of the rounds, as printed."""
    steps = [r["steps"] for r in rounds]
    lines = [f"{model.name}: {model.stat().st_size / 1e9:.2f} GB; {len(rounds)} rounds of "
             f"fresh processes; load average {loads[0]} before, {loads[1]} after",
             "in one process (seconds: median (min-max, n)):"]
    for name, (_, resident) in steps[0].items():
        if name == "lock bytes":
            lines.append(f"  lock file: {steps[0][name][0]:.0f} bytes")
            continue
        spread = Spread.of([s[name][0] for s in steps]).show()
        shown = f"   {resident:7.1f} MB of the .pt2 resident" if resident == resident else ""
        label = f"    {name[len('lower: '):]}" if name.startswith("lower: ") else f"  {name}"
        lines.append(f"{label:52s} {spread:24s}{shown}")
    lines.append("whole processes (wall | CPU, seconds: median (min-max, n)):")
    for name, command in (("explain", "rewrite -q explain llama MODEL"),
                          ("lock", "rewrite -q lock llama MODEL -o FILE")):
        wall, cpu = (Spread.of([r[name][k] for r in rounds]) for k in (0, 1))
        lines.append(f"  {command:38s} {wall.show()} | {cpu.show()}")
    beyond = [Spread.of([r["lock"][k] - r["explain"][k] for r in rounds]).median
              for k in (0, 1)]
    beyond_steps = Spread.of([s[LOWER][0] + s[LOCK][0] for s in steps]).median
    lines.append(f"the lock beyond grouping: {beyond_steps:.2f} s in one process (lowering + "
                 f"lock); whole processes {beyond[0]:.2f} s wall, {beyond[1]:.2f} s CPU")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a .pt2 (default: build the 2.5gb one)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--rounds", type=int, help="default 3 (--quick: 1)")
    parser.add_argument("--quick", action="store_true",
                        help="the tiny4 model, one round: checks the harness")
    parser.add_argument("--check-weights", action="store_true",
                        help="lower as `apply` does (the weights' checksums started), to compare")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a round's steps
    args = parser.parse_args()
    size = "tiny4" if args.quick else "2.5gb"
    model = (args.model or ensure([size], args.out)[size]).resolve()
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.one:
        print(json.dumps(measure(model, args.check_weights)))
        return
    before, rounds = load_average(), []
    with tempfile.TemporaryDirectory() as work:
        for k in range(args.rounds):
            rounds.append(_round(model, args.check_weights, Path(work) / "llama.lock", k % 2 == 1))
            print(f"round {k + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print("\n".join(report(model, rounds, (before, load_average()))))


if __name__ == "__main__":
    main()
