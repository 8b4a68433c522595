"""The one layer of private APIs of other libraries (torch, onnxscript, onnx_ir, transformers)
that rewrite uses: nothing outside this package reaches into another library's internals.

Each shim uses the private API where it is what the shim was written against, and otherwise
either falls back to the public API (same result, slower) or raises :class:`errors.Unavailable`
(the caller then takes a public path: the ONNX backend lowers the flat program with
``torch.onnx.export``). torch's own code failing on a program, inside a shim, is
:class:`errors.TorchFailed`.

=====================  ==============================================  ====================
shim                   private API                                     without it
=====================  ==============================================  ====================
``torch_exporter``     torch.onnx's ``_core`` / ``_decomp`` /          ``Unavailable``
                       ``_fx_passes``, ``make_fx``, ``TracingContext``  (flat export)
                       (decompose and translate per body); the type
                       promotion pass's interpreter; onnxscript's
                       ``_version_converter``                           public converter
``torch_recording``    ``invoke_subgraph``'s tracing (repeated calls    ``Unavailable``
                       recorded, not dispatched)                        (flat export)
``torch_layer_calls``  ``invoke_subgraph`` in a ``torch.export`` trace   the whole-model
                       (a layer's first call traced, the others         trace (said in one
                       recorded), symbolic sizes' expressions/hints     line)
``torchlib``           onnxscript's ``_framework_apis``, torch's        torch's
                       ``ONNXRegistry.from_torchlib``                   ``from_torchlib``
``torch_fake_cache``   ``torch._dynamo.config.fake_tensor_cache_        the cache on (the
                       enabled``, ``disable_fake_tensor_cache``: the    same programs,
                       fake-tensor dispatch cache off while rewrite     slower)
                       traces (cheaper with symbolic sizes)
``onnx_ir_inline``     onnx_ir's ``inliner._make_unique_name``          ``InlinePass`` as is
``transformers_onnx``  transformers' ``exporters.exporter_onnx.``       no MoE translation
                       ``_ONNX_TRANSLATION_TABLE`` (its grouped          (torch.onnx's error
                       matmul ops)                                      names the op)
``transformers_        transformers' ``integrations.sdpa_attention.``   ``repeat_kv`` (same
attention``            ``use_gqa_in_sdpa``, answering yes for one        values, slower
                       export's context (``enable_gqa``)                export)
``transformers_        transformers' ``masking_utils.``                 eager's masks (the
masks``                ``is_torchdynamo_exporting``, answering yes in   check traces every
                       the eager runs that check a traced layer         layer of BART's
                                                                        family)
``onnx_ir_attrs``      the ``data`` dict of ``Node.attributes``         the mapping (slower)
``onnx_files``         onnx_ir's ``_shard_filename`` (chunk names)      stale chunks stay
``torch_graphs``       ``ExportedProgram._graph_module``, op schemas    --
                       (``torch._ops``); runtime asserts' conditions
                       (``SymBool.node.expr``) and torch's sympy
                       functions (``torch.utils._sympy.functions``)
``torch_programs``     lazy graph modules, pytree code generation       eager modules,
                       (the FX backend); ``.pt2`` loading: torch's       plain code;
                       ``_bytes_to_dataclass``,                         ``torch.export.load``
                       ``ExportedProgramDeserializer`` (the program     (weights copied,
                       around weights rewrite mapped), its JSON         after rewrite's own
                       decoding planned per type (``_pt2_decode``),     pickle checks)
                       ``_pickle_load_obj`` (TorchBind, trusted only)
=====================  ==============================================  ====================

``_swap`` is the one way a shim replaces another library's function while a block runs;
such blocks, and the others that drive process-wide state of torch or transformers (building
a model, ``torch.export``, a lowering), hold one lock (:mod:`exclusive`).
"""

CHECKED_WITH: dict[str, tuple[str, ...]] = {
    "torch": ("2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0"),
    "onnxscript": ("0.7.0", "0.7.2"),
    "onnx_ir": ("1.1.0",),
    "transformers": ("5.24.0",),
}
"""The one table of the versions every shim here was checked with (``make matrix``: the
suite on each torch release, docs/MATRIX.md)."""
