"""FX backend: a group tree -> a hierarchical or split ``torch.fx.GraphModule``.

``to_fx(result)`` returns a GraphModule called like ``ExportedProgram.module()`` (same user
inputs and outputs, parameters and buffers as attributes under their original names) with one
nested submodule per group: module calls become submodules whose class is the module's class
(``GPT2Block``), split components become top-level submodules named after their tag value,
called in order. See :mod:`rewrite.backends.fx.layout` for submodule and attribute names.
``save_python(result, path)`` writes the readable code of that module.
"""

from rewrite.backends.fx.lower import to_fx
from rewrite.backends.fx.module import LoweredModule
from rewrite.backends.fx.save import python_text, save_python

__all__ = ["LoweredModule", "python_text", "save_python", "to_fx"]
