"""sha256 of the ONNX models rewrite writes for a fixed set of models: a refactor must not
change one byte of them (issue 23).

    .venv/bin/python -m tools.output_hashes [--only NAME ...] [--write FILE] [--compare FILE]

Per model (random weights, fixed seeds, its program exported in this process): the ONNX of
``rewrite.apply(rules, program).to_onnx(...)`` through the per-body path and the flat
fallback (``lowering="per-body"`` / ``"flat"``), and of the flat model ``torch.onnx.export``
writes, given as an ``.onnx`` file and as an ``onnx_ir.Model``; the GPT-2 also under the
other constant policies and without body node names. Each line: ``model path sha256`` of
``ir.serde.serialize_model(m).SerializeToString()``. The ``.onnx`` inputs are exported once
and kept in ``tools/out/hashes/`` so that every run outlines the same file.

Compare runs from one checkout path and one ``tools/models.py``: the models built from it
(``settings``, ``eps-blocks``) carry its path and line numbers in their stack-trace metadata, so
their hashes differ between two clones of the same commit, and after any edit that moves its
lines.

``--compare FILE`` prints the lines that differ from an earlier ``--write FILE`` and exits 1
when any does.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "rules" / "gpt2.rules"
CACHE = ROOT / "tools" / "out" / "hashes"
LIBRARY = ROOT / "rules"


def _gpt2(blocks: int) -> Callable[[], Any]:
    def build():
        import torch
        from transformers import GPT2Config, GPT2Model

        config = GPT2Config(n_layer=blocks, n_embd=64, n_head=4, vocab_size=1000,
                            n_positions=64, use_cache=False, bos_token_id=0, eos_token_id=0)
        torch.manual_seed(0)
        model = GPT2Model(config).eval()
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith(".bias"):
                    parameter.normal_(0.0, 0.02)
        ids = torch.randint(0, 1000, (1, 32))
        return torch.export.export(model, (ids,),
                                   kwargs={"return_dict": False, "use_cache": False})
    return build


def _llama():
    import torch
    from transformers import LlamaModel

    from tools.models import llama_config

    torch.manual_seed(0)
    model = LlamaModel(llama_config(6, 128, use_cache=False)).eval()
    ids = torch.randint(0, 1000, (1, 32))
    return torch.export.export(model, (ids,), kwargs={"return_dict": False, "use_cache": False})


def _llama_static():
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    from tools.models import llama_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(4, 128, use_cache=True)).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": 64})
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=64)
    return wrapper.export(input_ids=torch.randint(0, 1000, (1, 4)),
                          cache_position=torch.arange(4), strict=True)


def _shared_model(name: str, **kwargs: Any) -> Callable[[], Any]:
    def build():
        import torch

        from tools import models

        model, args, kw = getattr(models, name)(**kwargs)
        return torch.export.export(model, args, kwargs=kw)
    return build


def _zoo(name: str) -> Callable[[], Any]:
    def build():
        import torch

        from tools.zoo_models import entry

        model, args, kwargs = entry(name).build()
        return torch.export.export(model, args, kwargs=kwargs)
    return build


def _zoo_rules(name: str) -> str:
    from tools.zoo_models import entry

    return f"group class {entry(name).block}"


MODELS: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    # name: (program builder, rules: a path or text, made lazily)
    "gpt2-12": (_gpt2(12), lambda: RULES),
    "gpt2-48": (_gpt2(48), lambda: RULES),
    "gpt2-12-modularize": (_gpt2(12), lambda: LIBRARY / "modularize.rules"),
    "llama": (_llama, lambda: LIBRARY / "llama.rules"),
    "llama-static": (_llama_static, lambda: LIBRARY / "llama.rules"),
    "bert": (_shared_model("bert", layers=4), lambda: LIBRARY / "modularize.rules"),
    "settings": (_shared_model("settings"), lambda: LIBRARY / "modularize.rules"),
    "eps-blocks": (_shared_model("eps_blocks"), lambda: LIBRARY / "modularize.rules"),
    **{f"zoo-{name}": (_zoo(name), (lambda name=name: _zoo_rules(name)))
       for name in ("t5", "bart", "whisper", "vit", "wav2vec2", "resnet18", "unet2d")},
    # under modularize, stand-ins that do not fit are inlined (several lowering rounds);
    # swin: torch cannot convert it (the error message is hashed)
    **{f"zoo-{name}-modularize": (_zoo(name), lambda: LIBRARY / "modularize.rules")
       for name in ("t5", "bloom", "resnet18", "convnext_hf", "swin")},
}

VARIANTS: dict[str, dict[str, Any]] = {
    "gpt2-12": {"input": {"constants": "input"}, "embed": {"constants": "embed"},
                "unnamed": {"body_node_names": False}, "no-optimize": {"optimize": False}},
    "settings": {"input": {"constants": "input"}, "no-optimize": {"optimize": False}},
}
"""Extra per-body lowerings with these options, by model."""


def _hash(model) -> str:
    import onnx_ir as ir

    return hashlib.sha256(ir.serde.serialize_model(model).SerializeToString()).hexdigest()


def _rules(spec):
    import rewrite

    if isinstance(spec, Path):
        return rewrite.load_rules(spec)
    return rewrite.parse_rules(spec, "blocks.rules")


def _onnx_file(name: str, program) -> Path:
    """torch.onnx.export's model of ``program``, exported once and kept."""
    import torch

    path = CACHE / f"{name}.onnx"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        torch.onnx.export(program, dynamo=True, verbose=False, report=False).save(str(path))
    return path


def _lowered(make: Callable[[], Any]) -> str:
    """The sha256 of the model ``make`` returns, or of the error message it raises
    (``error:...``: torch cannot convert every program)."""
    import rewrite

    try:
        return _hash(make())
    except rewrite.InputError as e:
        return "error:" + hashlib.sha256(str(e).encode()).hexdigest()


def hashes(name: str) -> list[tuple[str, str]]:
    """``(path, sha256)`` for every lowering of model ``name``."""
    import onnx_ir as ir

    import rewrite

    build, rules_of = MODELS[name]
    program = build()
    rules = _rules(rules_of())
    out = []
    for lowering in ("per-body", "flat"):
        out.append((lowering, _lowered(
            lambda: rewrite.apply(rules, program).to_onnx(lowering=lowering))))
    for variant, options in VARIANTS.get(name, {}).items():
        out.append((f"per-body:{variant}", _lowered(
            lambda: rewrite.apply(rules, program).to_onnx(lowering="per-body", **options))))
    try:
        path = _onnx_file(name, program)
    except Exception:  # torch.onnx.export cannot convert it
        return out
    out.append(("onnx-file", _lowered(lambda: rewrite.apply(rules, path).to_onnx())))
    out.append(("onnx-model", _lowered(
        lambda: rewrite.apply(rules, ir.load(str(path))).to_onnx())))
    return out


def _read(path: Path) -> dict[tuple[str, str], str]:
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return {(a, b): h for a, b, h in lines}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(MODELS))
    parser.add_argument("--write", type=Path, help="write the lines to this file")
    parser.add_argument("--compare", type=Path, help="compare with an earlier --write")
    args = parser.parse_args(argv)
    from rewrite.cli.logs import quiet_libraries

    lines: list[tuple[str, str, str]] = []
    for name in args.only or MODELS:
        start = time.perf_counter()
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                quiet_libraries():
            warnings.simplefilter("ignore")
            found = hashes(name)
        for path, digest in found:
            lines.append((name, path, digest))
            print(f"{name} {path} {digest}", flush=True)
        print(f"  ({name}: {time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text("".join(f"{a} {b} {h}\n" for a, b, h in lines))
    if args.compare:
        before = _read(args.compare)
        changed = [(a, b) for a, b, h in lines if before.get((a, b)) != h]
        for a, b in changed:
            print(f"CHANGED {a} {b}: {before.get((a, b))} -> "
                  f"{dict(((x, y), h) for x, y, h in lines)[(a, b)]}")
        print(f"{len(lines) - len(changed)} of {len(lines)} identical", file=sys.stderr)
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
