"""The ``.pt2`` frontend: a ``torch.export.save`` archive read as data, into an
``ExportedProgram`` whose weights are views of the file.

:mod:`archive` (the zip's entries and checks), :mod:`payloads` (weights and constants, what
needs pickle), :mod:`program` (the program deserialized by torch)."""
