"""The FX frontend: an ``ExportedProgram`` or ``GraphModule`` -> graph IR.

:mod:`graph` (targets, tags, edges), :mod:`nn_module_stack` (module calls from
``nn_module_stack``), :mod:`regions` (module calls inside higher-order op regions)."""
