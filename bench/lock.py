"""What ``rewrite lock`` costs on the 1.24B-parameter Llama of the weights benchmark, beyond
grouping and lowering, and whether it reads a weight.

    nice .venv/bin/python -m bench.lock [--model PATH] [--out DIR]

Builds (once, ``bench/weights_model.py``) or takes the 2.47 GB bf16 ``.pt2``, then times, in
one process: reading + grouping (``rewrite.apply`` with ``rules/llama.rules``), lowering to
ONNX (``backends.onnx.lower``, no file written; ``rewrite lock`` lowers as ``explain --onnx``
does, with ``check_weights=False``), and the lock itself (``structure.of_lowering`` +
``dumps``). After each step it prints how much of the ``.pt2`` is resident in the process
(``Rss`` of its mappings in ``/proc/self/smaps``: pages read in), so a step that read the
2.4 GB of weights would show it.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from bench.weights_model import OUT, ensure

_MAPPING = re.compile(r"[0-9a-f]+-[0-9a-f]+ ")
RULES = Path(__file__).resolve().parent.parent / "rules" / "llama.rules"


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
    """Step -> (seconds, MB of the file resident after it)."""
    import rewrite
    from rewrite.backends.onnx import OnnxOptions, lower
    from rewrite.structure import dumps, of_lowering

    found = {}
    mark = (time.perf_counter(), resident_mb(model))

    def step(name: str) -> None:
        nonlocal mark
        now = (time.perf_counter(), resident_mb(model))
        found[name] = (now[0] - mark[0], now[1])
        mark = (time.perf_counter(), resident_mb(model))

    result = rewrite.apply(rules, str(model))
    step("read + group")
    lowering = lower(result, OnnxOptions(check_weights=check_weights))  # False: as lock does
    step("lower (no file)")
    text = dumps(of_lowering(lowering))
    step("lock (of_lowering + dumps)")
    found["lock bytes"] = (len(text.encode()), 0.0)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a .pt2 (default: build the 2.5gb one)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check-weights", action="store_true",
                        help="lower as `apply` does (the weights' checksums started), to compare")
    args = parser.parse_args()
    model = args.model or ensure(["2.5gb"], args.out)["2.5gb"]
    print(f"{model.name}: {model.stat().st_size / 1e9:.2f} GB")
    for name, (seconds, grown) in measure(model, args.check_weights).items():
        if name == "lock bytes":
            print(f"  lock file: {seconds:.0f} bytes")
        else:
            print(f"  {name:28s} {seconds:6.2f} s   {grown:7.1f} MB of the .pt2 resident")


if __name__ == "__main__":
    main()
