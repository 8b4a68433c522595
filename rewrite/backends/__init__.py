"""Stage 5: a group tree -> an ONNX model with local functions (``onnx``) or a
hierarchical / split ``torch.fx.GraphModule`` (``fx``)."""
