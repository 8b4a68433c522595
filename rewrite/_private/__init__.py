"""The one layer of private APIs of other libraries (torch, onnxscript, onnx_ir) that rewrite
uses: nothing outside this package reaches into another library's internals.

Each shim uses the private API where it is what the shim was written against, and otherwise
either falls back to the public API (same result, slower) or raises :class:`Unavailable`
(the caller then takes a public path: the ONNX backend lowers the flat program with
``torch.onnx.export``). torch's own code failing on a program, inside a shim, is
:class:`TorchFailed`.

=====================  ==============================================  ====================
shim                   private API                                     without it
=====================  ==============================================  ====================
``torch_exporter``     torch.onnx's ``_core`` / ``_decomp`` /          :class:`Unavailable`
                       ``_fx_passes``, ``make_fx``, ``TracingContext``  (flat export)
                       (decompose and translate per body); the type
                       promotion pass's interpreter; onnxscript's
                       ``_version_converter``                           public converter
``torch_recording``    ``invoke_subgraph``'s tracing (repeated calls    :class:`Unavailable`
                       recorded, not dispatched)                        (flat export)
``torchlib``           onnxscript's ``_framework_apis``, torch's        torch's
                       ``ONNXRegistry.from_torchlib``                   ``from_torchlib``
``onnx_ir_inline``     onnx_ir's ``inliner._make_unique_name``          ``InlinePass`` as is
``torch_graphs``       ``ExportedProgram._graph_module``, op schemas    --
                       (``torch._ops``)
=====================  ==============================================  ====================

Still outside this package (issue 22 rewrites them; they move here after it merges, their
``CHECKED_WITH`` replaced by :data:`CHECKED_WITH`): ``rewrite/_torch_private.py``
(``fast_pt2_decoding``, ``lazy_program_graph_modules``, ``lazy_graph_modules``,
``LazyGraphModule``), ``rewrite/_pt2_decode.py`` (torch's ``.pt2`` JSON decoding) and
``rewrite/_swap.py`` (the one way to swap another library's function while a block runs).
"""

CHECKED_WITH: dict[str, tuple[str, ...]] = {
    "torch": ("2.13.0",),
    "onnxscript": ("0.7.2",),
    "onnx_ir": ("1.1.0",),
}
"""The one table of the versions every shim here was checked with."""
