"""The front door for modules and checkpoints: ``rewrite.export``.

An ``nn.Module`` goes through :mod:`rewrite.exporting.module` (``torch.export``, grouping,
lowering, named dimensions: :mod:`rewrite.exporting.dim_names`); a Hugging Face checkpoint
folder through :mod:`rewrite.exporting.checkpoint` first (the model built from it, called with
its KV cache explicit), then the same pipeline.
"""

from rewrite.exporting.entry import export

__all__ = ["export"]
