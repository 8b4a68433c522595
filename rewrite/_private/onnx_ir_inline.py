"""Inline a model's local functions: onnx_ir's ``InlinePass``, its name search made linear.

The per-body lowering (:mod:`rewrite.backends.onnx.lowering._perbody`) gets from torch.onnx a
main graph that calls one function per distinct body (and torchlib's helper functions) and
inlines the first call of each body (the others stand in,
:mod:`rewrite.backends.onnx._standins`, unless they must be inlined too) as torch.onnx.export
would have written them; onnx_ir's ``InlinePass`` does it (it skips the standing calls: their
domain has no function). The pass names each
cloned node and value with the first free of ``name``, ``name_2``, ``name_3``... through its
private ``_make_unique_name``, which starts from ``name`` every time: with 48 calls of one
body a name is tried ~1,000 times (0.5 s of CPU on the 48-block GPT-2, 10x the time of 12
blocks).

While :func:`inline_functions` runs the pass, that function is replaced by one that gives the
same names but remembers, per set of used names, the next suffix to try: names are only ever
added to the set, so every candidate found taken stays taken. Checked with
:data:`rewrite._private.CHECKED_WITH`; if onnx_ir no longer has the function, the pass runs as it is
(the same result, slower).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import onnx_ir as ir
from onnx_ir.passes.common import InlinePass

from rewrite._private._swap import swapped

try:  # the private module whose name search is replaced (see the module docstring)
    from onnx_ir.passes.common import inliner as _inliner
except ImportError:  # pragma: no cover - a future onnx_ir
    _inliner = None


@contextlib.contextmanager
def linear_unique_names() -> Iterator[bool]:
    """Within the block, onnx_ir's inliner finds unique names in linear time; yields whether
    it does (False: onnx_ir changed, the pass runs as it is)."""
    # per set of used names (kept alive here, so its id is not reused): the next suffix
    memo: dict[int, tuple[set[str], dict[str, int]]] = {}

    def make_unique_name(name: str, callstack: object, used_names: set[str]) -> str:
        entry = memo.get(id(used_names))
        if entry is None:
            entry = memo[id(used_names)] = (used_names, {})
        next_of = entry[1]
        i = next_of.get(name, 1)
        candidate = name if i == 1 else f"{name}_{i}"
        while candidate in used_names:
            i += 1
            candidate = f"{name}_{i}"
        next_of[name] = i
        used_names.add(candidate)
        return candidate

    with swapped(_inliner, "_make_unique_name", make_unique_name) as done:
        yield done


def inline_functions(model: ir.Model,
                     criteria: Callable[[ir.Function], bool] | None = None) -> None:
    """Inline every call of a local function in ``model`` (nested calls too; only of the
    functions ``criteria`` accepts, if given) and drop the functions inlined:
    ``InlinePass``, with :func:`linear_unique_names`."""
    with linear_unique_names():
        InlinePass(criteria)(model)
