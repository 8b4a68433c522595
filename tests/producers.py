"""ONNX files made by other producers than torch.onnx's dynamo exporter, from tiny random
models (nothing downloaded): torch.onnx's TorchScript exporter, onnxruntime-genai's model
builder (run as a subprocess), onnxruntime's transformer optimizer and its MatMulNBits
quantizer. Every model is perturbed (``models.perturb``): no two layers hold equal weights.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from tools import models

HIDDEN, HEADS, KV_HEADS, LAYERS, VOCAB = 64, 4, 2, 4, 96
"""The decoders' sizes: head size 16 (GroupQueryAttention at int4 needs a multiple of 16)."""


class Wrapped(torch.nn.Module):
    """``model`` under attribute ``name`` (the node names' first scope), returning its last
    hidden state; decoders get an all-ones attention mask (without one, transformers' mask
    code calls ``aten::diff``, which the TorchScript exporter cannot export)."""

    def __init__(self, name: str, model: torch.nn.Module, mask: bool) -> None:
        super().__init__()
        setattr(self, name, model)
        self.name, self.mask = name, mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        model = getattr(self, self.name)
        if self.mask:
            return model(x, attention_mask=torch.ones_like(x), use_cache=False)[0]
        return model(x)[0]


def torchscript_model(which: str) -> tuple[torch.nn.Module, torch.Tensor, str]:
    """A 4-layer BERT, GPT-2 or Whisper encoder, an input, and its layers' path glob."""
    import transformers
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    if which == "bert":
        config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4,
                                         num_attention_heads=4, intermediate_size=64,
                                         max_position_embeddings=32)
        model = Wrapped("bert", transformers.BertModel(config), True)
        return model, torch.randint(0, 64, (1, 8)), "bert.encoder.layer.*"
    if which == "gpt2":
        config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=4, n_head=4,
                                         n_positions=32)
        model = Wrapped("transformer", transformers.GPT2Model(config), True)
        return model, torch.randint(0, 64, (1, 8)), "transformer.h.*"
    config = transformers.WhisperConfig(vocab_size=64, d_model=32, encoder_layers=4,
                                        encoder_attention_heads=4, encoder_ffn_dim=64,
                                        num_mel_bins=8, max_source_positions=16)
    model = Wrapped("encoder", WhisperEncoder(config), False)
    return model, torch.randn(1, 8, 32), "encoder.layers.*"


def torchscript_export(which: str, path: Path) -> str:
    """Export :func:`torchscript_model` with ``dynamo=False`` to ``path``; its layers' glob."""
    model, x, layers = torchscript_model(which)
    models.perturb(model.eval())
    with torch.no_grad():
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"])
    return layers


def hf_checkpoint(arch: str, folder: Path) -> Path:
    """A ``save_pretrained`` folder of a tiny random (perturbed) decoder of ``arch``
    (``llama``, ``phi3``, ``qwen2``) with a word-level tokenizer made by ``tokenizers``."""
    import transformers
    from tokenizers import Tokenizer, models as tokenizer_models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB - 1)} | {"<unk>": VOCAB - 1}
    tokenizer = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>",
                                                bos_token="t1", eos_token="t2", pad_token="t0")
    config_class = {"llama": transformers.LlamaConfig, "phi3": transformers.Phi3Config,
                    "qwen2": transformers.Qwen2Config}[arch]
    config = config_class(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                          num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          num_key_value_heads=KV_HEADS, max_position_embeddings=64,
                          bos_token_id=1, eos_token_id=2, pad_token_id=0,
                          # Phi-3: no long-context RoPE (the builder's int4 path fails on it)
                          **({"original_max_position_embeddings": 64} if arch == "phi3" else {}))
    torch.manual_seed(0)
    model = models.perturb(transformers.AutoModelForCausalLM.from_config(config))
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


_BUILD = """
import runpy, sys
for argv in {runs!r}:
    sys.argv = ["builder", *argv]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
"""


def genai_build(runs: list[tuple[Path, Path, str]], cache: Path) -> None:
    """Run onnxruntime-genai's builder (``-i DIR -o OUT -p PRECISION -e cpu``) for each
    ``(DIR, OUT, PRECISION)``, in one subprocess (the builder imports torch and transformers
    once); raises with the end of its log when it fails."""
    argv = [["-i", str(i), "-o", str(o), "-p", p, "-e", "cpu", "-c", str(cache)]
            for i, o, p in runs]
    done = subprocess.run([sys.executable, "-c", _BUILD.format(runs=argv)], capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the builder failed: {done.stderr[-2000:]}")


DIMS = {"batch_size": 1, "sequence_length": 3, "past_sequence_length": 2,
        "total_sequence_length": 5, "kv_cache_dim": HIDDEN // HEADS}
"""Values of the symbolic dimensions of the producers' inputs (the others: 2)."""


def feeds(session: ort.InferenceSession, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for ``session``: ids below 60, all-ones masks, normal floats."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else DIMS.get(d, 2) for d in spec.shape]
        if "int" in spec.type:
            dtype = np.int64 if "64" in spec.type else np.int32
            value = np.ones(shape) if "mask" in spec.name else rng.integers(0, 60, shape)
            out[spec.name] = value.astype(dtype)
        else:
            out[spec.name] = rng.standard_normal(shape).astype(np.float32)
    return out
