"""The whole job in one run (``make demo``): .pt2 -> ``rewrite apply`` -> checked ONNX.

1. build a small random-weight GPT-2 (transformers, nothing downloaded), export it with
   ``torch.export`` and save ``demo-out/gpt2.pt2``;
2. run the CLI: ``rewrite apply rules/gpt2.rules demo-out/gpt2.pt2 -o demo-out/gpt2.onnx``;
3. print the function tree of the result (functions, call sites, runs per inference);
4. run it in onnxruntime and compare with eager PyTorch.

    .venv/bin/python examples/demo.py [--layers 4] [--out demo-out]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_gpt2(layers: int):
    """A random-weight GPT2Model, its example input ids, and the call's keyword arguments."""
    import torch
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=500, n_positions=128,
                        use_cache=False, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = GPT2Model(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 16))
    return model, ids, {"return_dict": False, "use_cache": False}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("demo-out"))
    args = parser.parse_args(argv)

    import numpy as np
    import onnx
    import onnx_ir as ir
    import onnxruntime as ort
    import torch
    from rich.console import Console

    from rewrite.cli.render import function_tree

    console = Console(highlight=False)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    pt2, onnx_path = out / "gpt2.pt2", out / "gpt2.onnx"
    rules = Path(os.path.relpath(ROOT / "rules" / "gpt2.rules"))

    console.rule(f"1. a random-weight GPT-2 with {args.layers} blocks -> {pt2}")
    model, ids, kwargs = build_gpt2(args.layers)
    start = time.perf_counter()
    torch.export.save(torch.export.export(model, (ids,), kwargs=kwargs), str(pt2))
    console.print(f"exported and saved in {time.perf_counter() - start:.1f}s")

    command = [sys.executable, "-m", "rewrite", "apply", str(rules), str(pt2), "-o", str(onnx_path)]
    console.rule("2. rewrite apply " + " ".join(map(str, command[4:])))
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=Path.cwd())
    if proc.returncode != 0:
        console.print(f"[red]rewrite apply failed with exit code {proc.returncode}[/red]")
        return proc.returncode
    console.print(f"rewrite apply: exit 0 in {time.perf_counter() - start:.1f}s, "
                  f"{onnx_path.stat().st_size / 1e6:.1f} MB")

    console.rule("3. the function tree")
    grouped = ir.load(str(onnx_path))
    console.print(function_tree(grouped, title=str(onnx_path)))
    onnx.checker.check_model(str(onnx_path), full_check=True)
    console.print("onnx.checker.check_model(full_check=True): ok")

    console.rule("4. onnxruntime vs eager PyTorch")
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    for shape in [(2, 16)]:  # the export has static shapes
        x = torch.randint(0, 500, shape)
        with torch.no_grad():
            (expected,) = model(x, **kwargs)
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        err = float(np.abs(got - expected.numpy()).max())
        ok = err <= 1e-4
        console.print(f"input {tuple(shape)}: max |onnxruntime - eager| = {err:.2e} "
                      + ("[green]ok[/green]" if ok else "[red]MISMATCH[/red]"))
        if not ok:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
