"""torchlib's ONNX registry, built without parsing every torchlib function's source.

Checked against torch 2.9.1, 2.10.0, 2.11.0, 2.12.1, 2.13.0, 2.14.1, 2.15.0 and onnxscript 0.7.0, 0.7.2. ``ONNXRegistry.from_torchlib`` (how
torch.onnx.export builds its registry) reads torchlib's functions from onnxscript's
``_framework_apis.get_torchlib_ops``, which reads each function's ``function_ir.domain``:
for a trace-only function (most of torchlib) that property parses the function's Python
source and translates its signature (~0.5 s for ~500 functions), only to give the domain of
the function's opset, which ``from_torchlib`` does not use. :func:`from_torchlib` runs
torch's ``from_torchlib`` unchanged with the same list of functions (same order, same
``is_complex``), the domain read from the function's opset. Anything missing or changed:
torch's ``from_torchlib`` as it is.
"""

from __future__ import annotations

import types
from typing import Any, Callable

from attrs import frozen

from rewrite._swap import swapped

CHECKED_WITH = {"torch": ("2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0"), "onnxscript": ("0.7.0", "0.7.2")}
"""The versions whose private APIs this module was checked against."""


@frozen
class TorchlibOp:
    """One torchlib function, with the fields of onnxscript's ``_OnnxFunctionMeta``."""

    qualified_name: str
    function: Callable
    domain: str
    name: str
    is_complex: bool = False


def torchlib_ops() -> list[TorchlibOp]:
    """What onnxscript's ``get_torchlib_ops`` lists, in its order; each domain from the
    function's opset (what a trace-only function's ``function_ir`` would parse to give)."""
    from onnxscript.function_libs.torch_lib import ops, registration

    del ops  # importing it registers torchlib's functions
    found = []
    for qualified_name, overloaded in registration.default_registry.items():
        if qualified_name.startswith("internal::"):
            continue
        for is_complex, functions in ((False, overloaded.overloads),
                                      (True, overloaded.complex)):
            found += [TorchlibOp(qualified_name, f, f.opset.domain, f.name, is_complex)
                      for f in functions]
    return found


def from_torchlib(opset_version: int) -> Any:
    """``ONNXRegistry.from_torchlib(opset_version)``, its function list read without
    translating every function's signature."""
    from torch.onnx._internal.exporter import _registration

    registry = _registration.ONNXRegistry
    try:
        ops = torchlib_ops()
    except (ImportError, AttributeError):  # pragma: no cover - not in the checked versions
        return registry.from_torchlib(opset_version=opset_version)
    # torch's from_torchlib reads the list from ``onnxscript_apis.get_torchlib_ops``
    listing = types.SimpleNamespace(get_torchlib_ops=lambda: ops)
    with swapped(_registration, "onnxscript_apis", listing):
        return registry.from_torchlib(opset_version=opset_version)
