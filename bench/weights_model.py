"""The Llama-shaped ``.pt2`` files of the weights benchmark, built here, never downloaded.

    .venv/bin/python -m bench.weights_model [--sizes 0.5gb 1.2gb 2.5gb] [--rebuild] [--out DIR]

``2.5gb`` is shaped like Llama-3.2-1B (16 layers, hidden 2048, MLP 8192, 32 heads, 8 key/value
heads, vocabulary 128256, tied embeddings: 1.24B parameters); ``0.5gb`` and ``1.2gb`` are the
same family, narrower or shallower (the memory-growth criterion); ``tiny2`` / ``tiny4`` are
for ``--quick``; ``180m-fp32`` is issue 39's fp32 Llama (8 layers, hidden 1024, MLP 4096, 16/4
heads, vocabulary 32000, untied head: 187M parameters). All in bf16 but that one, every
parameter drawn at random (matrices N(0, 0.02), norm
weights N(1, 0.02)), so no two tensors are equal and nothing folds or deduplicates by value.
``LlamaForCausalLM(input_ids)`` (8 tokens, static shapes, ``use_cache=False``, the default
``return_dict``: the program's output is transformers' ``CausalLMOutputWithPast``, as for a
user who exports ``model(ids)``) is exported with ``torch.export.export`` and saved with
``torch.export.save``. A file is rebuilt only when missing (or with ``--rebuild``); it is
written under a temporary name and renamed, so a build that dies leaves no file to reuse.
Peak memory of a build: about twice the weights (the 2.5gb model: ~6 GB).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
TOKENS = 8


@attrs.frozen
class Size:
    """One model shape of the benchmark."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    dtype: str = "bf16"
    """``bf16`` or ``fp32``: the dtype of the parameters."""
    tied: bool = True
    """Whether the output head is the embedding (else a matrix of its own)."""

    @property
    def parameters(self) -> int:
        """Parameters (a tied embedding counted once)."""
        kv = self.hidden // self.heads * self.kv_heads
        layer = 2 * self.hidden * (self.hidden + kv) + 3 * self.hidden * self.intermediate
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * (layer + 2 * self.hidden) + self.hidden

    def describe(self) -> str:
        return (f"{self.layers} layers x {self.hidden} (MLP {self.intermediate}, "
                f"{self.heads}/{self.kv_heads} heads, vocab {self.vocab}"
                f"{'' if self.tied else ', untied head'}), "
                f"{self.parameters / 1e6:,.1f}M parameters in {self.dtype}")

    def stem(self) -> str:
        """The shape in a file name: ``llama-LAYERSxHIDDENxMLP-vVOCAB-DTYPE``."""
        return (f"llama-{self.layers}x{self.hidden}x{self.intermediate}-v{self.vocab}"
                f"-{self.dtype}")

    def path(self, out: Path = OUT) -> Path:
        return out / f"weights-{self.stem()}.pt2"


SIZES = {size.name: size for size in (
    Size("tiny2", 2, 64, 256, 4, 2, 1000),
    Size("tiny4", 4, 64, 256, 4, 2, 1000),
    Size("0.5gb", 8, 1024, 4096, 16, 4, 128256),
    Size("1.2gb", 6, 2048, 8192, 32, 8, 128256),
    Size("2.5gb", 16, 2048, 8192, 32, 8, 128256),
    Size("180m-fp32", 8, 1024, 4096, 16, 4, 32000, dtype="fp32", tied=False),  # issue 39's
)}


def random_model(size: Size):
    """A LlamaForCausalLM of ``size`` in its dtype, every parameter drawn at random."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=size.layers, hidden_size=size.hidden,
        intermediate_size=size.intermediate, num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads, vocab_size=size.vocab, tie_word_embeddings=size.tied,
        max_position_embeddings=2048, use_cache=False, bos_token_id=0, eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[size.dtype]
    model = LlamaForCausalLM._from_config(config, dtype=dtype).eval()
    starts: dict[bytes, str] = {}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(1.0 if parameter.ndim == 1 else 0.0, 0.02)
            start = parameter.flatten()[:64].view(torch.int16).numpy().tobytes()  # any dtype
            if start in starts:
                raise AssertionError(f"{name} starts like {starts[start]}")
            starts[start] = name
    count = sum(parameter.numel() for parameter in model.parameters())
    if count != size.parameters:
        raise AssertionError(f"{count} parameters, expected {size.parameters}")
    return model


def build(size: Size, path: Path) -> None:
    """Export a model of ``size`` and save it at ``path`` (via a temporary file)."""
    import torch

    model = random_model(size)
    ids = torch.randint(0, size.vocab, (1, TOKENS))
    program = torch.export.export(model, (ids,), kwargs={"use_cache": False})
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.stem + ".partial.pt2")
    torch.export.save(program, str(partial))
    os.replace(partial, path)


def ensure(names: list[str], out: Path = OUT, rebuild: bool = False) -> dict[str, Path]:
    """The ``.pt2`` of each size, built where missing (or all with ``rebuild``)."""
    paths = {}
    for name in names:
        size, path = SIZES[name], SIZES[name].path(out)
        if rebuild or not path.exists():
            start = time.perf_counter()
            print(f"building {path.name}: {size.describe()} ...", file=sys.stderr, flush=True)
            build(size, path)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            print(f"built in {time.perf_counter() - start:.0f}s, {path.stat().st_size / 1e9:.2f}"
                  f" GB (peak RSS of this process so far {peak:.1f} GB)", file=sys.stderr,
                  flush=True)
        paths[name] = path
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["2.5gb"])
    parser.add_argument("--rebuild", action="store_true", help="build even if the file exists")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the .pt2 files")
    args = parser.parse_args(argv)
    for path in ensure(args.sizes, args.out, args.rebuild).values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
