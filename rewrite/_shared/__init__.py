"""Small helpers that more than one stage uses (never a stage's own logic): FX keys
(:mod:`fx_keys`), ``onnx_ir`` node helpers (:mod:`onnx_ir_nodes`), pausing the collector
(:mod:`gc`)."""
