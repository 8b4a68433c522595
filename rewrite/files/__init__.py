"""Files: weights read where they lie, and outputs published whole.

:mod:`rewrite.files.mapped` (which tensors are views of a mapped input file, and where their
bytes lie), :mod:`rewrite.files.file_maps` (mappings found in ``/proc/self/maps``),
:mod:`rewrite.files.outputs` (output path checks, atomic writes, crash-safe publishing of a
model and its external data). A frontend describes what it maps (a ``MappedFile``, handed on
with what it loaded); the ONNX writer copies from it.
"""
