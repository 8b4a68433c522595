"""Mamba-2's chunked scan, as torch.export can trace it for every sequence length.

transformers' ``mamba2_chunk_scan`` (Bamba, GraniteMoE-Hybrid, Falcon-H1, Nemotron-H, Mamba-2:
the torch path, which transformers itself takes under torch.export instead of a
``mamba_ssm`` kernel) pads the sequence to whole chunks of the config's size by ``(chunk -
length % chunk) % chunk``: torch's shape reasoning cannot prove that padded length a
multiple of the chunk, so every reshape into chunks guards on it, and the export specializes
the sequence length. While exporting, :func:`one_chunk_scans` calls it with the whole sequence
as its one chunk (``chunk_size`` the length itself: no padding, one chunk, both of which
torch proves). The scan is exact for any chunk size (state-space duality: within a chunk
the quadratic form, across chunks the recurrence), so the result is the model's; a decode
step's one token is a chunk of one. A prefill's cost grows with the square of its length,
as attention's does: ``[batch, heads, length, length]`` per layer. A runtime may bound it by
feeding a long prompt in pieces, each with the states the previous one returned.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    import torch

SCAN = "mamba2_chunk_scan"


@contextlib.contextmanager
def one_chunk_scans(model: "torch.nn.Module") -> Iterator[None]:
    """``model``'s modeling modules' ``mamba2_chunk_scan`` on one chunk of the whole sequence
    (:func:`one_chunk`) while the block runs; nothing changed for a model without one."""
    originals = scan_modules(model)
    try:
        for module, original in originals.items():
            setattr(module, SCAN, one_chunk(original))
        yield
    finally:
        for module, original in originals.items():
            setattr(module, SCAN, original)


def scan_modules(model: "torch.nn.Module") -> dict[types.ModuleType, Callable[..., Any]]:
    """The modeling modules of ``model``'s classes that define ``mamba2_chunk_scan``, each
    with it: a model whose recurrent states rewrite carries."""
    modules = {sys.modules.get(type(m).__module__) for m in model.modules()}
    return {module: getattr(module, SCAN) for module in modules
            if module is not None and callable(getattr(module, SCAN, None))}


def one_chunk(scan: Callable[..., Any]) -> Callable[..., Any]:
    """``scan`` (transformers' ``mamba2_chunk_scan``: ``hidden_states [batch, length, heads,
    head_dim]``, ``dt``, ``A``, ``B``, ``C``, ``chunk_size``...) with the sequence's length
    as its chunk size."""

    @functools.wraps(scan)
    def whole(hidden_states: "torch.Tensor", dt: "torch.Tensor", A: "torch.Tensor",
              B: "torch.Tensor", C: "torch.Tensor", chunk_size: int, *args: Any,
              **kwargs: Any) -> Any:
        return scan(hidden_states, dt, A, B, C, hidden_states.shape[1], *args, **kwargs)

    return whole
