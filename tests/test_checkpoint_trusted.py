"""``rewrite export --trust-model`` of a checkpoint with pickled weights (``pytorch_model.bin``,
what ``save_pretrained(safe_serialization=False)`` of transformers 4 wrote): refused without
the flag, exported with it, decode-ready and equal to eager PyTorch in onnxruntime."""

from __future__ import annotations

import pytest
import torch

from tests.test_checkpoint_export import decode_and_compare

transformers = pytest.importorskip("transformers")


@pytest.mark.slow
def test_pickled_weights_export_with_trust_model(tmp_path, run_cli):
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    folder = tmp_path / "checkpoint"
    model.save_pretrained(folder)  # transformers 5 writes safetensors only: as older ones
    (folder / "model.safetensors").unlink()  # did, the weights pickled by torch.save
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    out = tmp_path / "model.onnx"
    refused = run_cli("export", folder, "-o", out)
    assert refused.code == 2 and "--trust-model" in refused.err and not out.exists(), refused
    r = run_cli("export", folder, "-o", out, "--trust-model")
    assert r.code == 0, r
    assert max(decode_and_compare(folder, out)) < 1e-4
