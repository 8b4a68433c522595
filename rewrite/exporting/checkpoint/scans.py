"""The recurrent layers' scans, as torch.export can trace them for every sequence length.

**Mamba-2.** transformers' ``mamba2_chunk_scan`` (Bamba, GraniteMoE-Hybrid, Falcon-H1,
Nemotron-H, Mamba-2: the torch path, which transformers itself takes under torch.export
instead of a ``mamba_ssm`` kernel) pads the sequence to whole chunks of the config's size by
``(chunk - length % chunk) % chunk``: torch's shape reasoning cannot prove that padded length
a multiple of the chunk, so every reshape into chunks guards on it, and the export
specializes the sequence length. While exporting, :func:`one_chunk_scans` calls it with the
whole sequence as its one chunk (``chunk_size`` the length itself: no padding, one chunk,
both of which torch proves). The scan is exact for any chunk size (state-space duality:
within a chunk the quadratic form, across chunks the recurrence), so the result is the
model's; a decode step's one token is a chunk of one. A prefill's cost grows with the square
of its length, as attention's does: ``[batch, heads, length, length]`` per layer. A runtime
may bound it by feeding a long prompt in pieces, each with the states the previous one
returned.

**Gated delta nets.** transformers' ``torch_chunk_gated_delta_rule`` (Qwen3-Next, Qwen3.5,
OLMo-Hybrid...) loops in Python over chunks, and under torch.export over the rows of each
chunk's triangular system: torch.export would unroll both for the example's length. While
exporting, both it and ``torch_recurrent_gated_delta_rule`` (the decode step's) are replaced
by :func:`scanned_gated_delta_rule`, the recurrent form (the one transformers decodes with)
as one ``torch.scan`` over the tokens: an ONNX ``Scan`` whose body is one token's update, for
any length, linear in it. The replacement is the module's attribute, so neither transformers'
hub kernel nor ``fla``'s (picked at run time when installed) is ever traced.

**Mamba (1).** transformers' ``mamba_selective_scan`` (Mamba, Falcon-Mamba, Jamba) loops in
Python over the tokens and starts from zeros: it takes no state, the decode step's one token
goes through ``mamba_selective_state_update`` instead. While exporting it is replaced by
:func:`scanned_selective_scan`, the same recurrence as one ``torch.scan`` over the tokens from
the state the mixer read from its cache (:class:`MixerStates`, a pre-hook on each mixer): zeros
before the first token (transformers' start), the cached state at a decode step (transformers'
recurrent form). A multi-token call after earlier tokens continues their state, where
transformers 5.24 restarts it from zeros.
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
DELTA_RULES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
SELECTIVE = "mamba_selective_scan"


@contextlib.contextmanager
def one_chunk_scans(model: "torch.nn.Module") -> Iterator[None]:
    """``model``'s modeling modules' scans as torch.export traces them for every length while
    the block runs (Mamba-2's on one chunk, :func:`one_chunk`; gated delta rules and Mamba's
    selective scan as one scan over the tokens, :func:`scanned_gated_delta_rule`,
    :func:`scanned_selective_scan`); nothing changed for a model without one."""
    found = scan_modules(model)
    originals = {(module, name): getattr(module, name)
                 for module, names in found.items() for name in names}
    states = MixerStates(model, [module for module, names in found.items()
                                 if SELECTIVE in names])
    try:
        for (module, name), original in originals.items():
            setattr(module, name, one_chunk(original) if name == SCAN
                    else functools.partial(scanned_selective_scan, states) if name == SELECTIVE
                    else scanned_gated_delta_rule)
        yield
    finally:
        states.remove()
        for (module, name), original in originals.items():
            setattr(module, name, original)


def scan_modules(model: "torch.nn.Module") -> dict[types.ModuleType, tuple[str, ...]]:
    """The modeling modules of ``model``'s classes that define a scan rewrite can trace
    (``mamba2_chunk_scan``, the gated delta rules, ``mamba_selective_scan``), each with the
    names it defines: a model whose recurrent states rewrite carries."""
    modules = {sys.modules.get(type(m).__module__) for m in model.modules()}
    found = {module: tuple(name for name in (SCAN, *DELTA_RULES, SELECTIVE)
                           if callable(getattr(module, name, None)))
             for module in modules if module is not None}
    return {module: names for module, names in found.items() if names}


class MixerStates:
    """The recurrent state each Mamba mixer of ``model`` (a module of a class of ``modules``
    with ``A_log`` and ``layer_idx``) reads from the cache it is called with, kept by a
    forward pre-hook for the selective scan the mixer calls next (:attr:`last`)."""

    def __init__(self, model: "torch.nn.Module", modules: list[types.ModuleType]) -> None:
        self.last: "torch.Tensor | None" = None
        self.handles = [
            mixer.register_forward_pre_hook(self.read, with_kwargs=True)
            for mixer in model.modules()
            if sys.modules.get(type(mixer).__module__) in modules
            and hasattr(mixer, "A_log") and hasattr(mixer, "layer_idx")]

    def read(self, mixer: "torch.nn.Module", args: tuple, kwargs: dict) -> None:
        """Keep the state ``mixer``'s cache (its ``cache`` argument) holds for its layer."""
        cache = kwargs.get("cache", kwargs.get("cache_params", args[1] if len(args) > 1
                                               else None))
        self.last = None if cache is None else cache.get_recurrent_state(mixer.layer_idx, 0)

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self.handles:
            handle.remove()


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


def scanned_gated_delta_rule(
        query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor", g: "torch.Tensor",
        beta: "torch.Tensor", chunk_size: int = 64, initial_state: "torch.Tensor | None" = None,
        output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
        **kwargs: Any) -> tuple["torch.Tensor", "torch.Tensor | None"]:
    """transformers' gated delta rule (``query``, ``key [batch, length, key_heads, key_dim]``,
    ``value [batch, length, heads, value_dim]``, decay ``g`` and ``beta [batch, length,
    heads]``, ``initial_state [batch, heads, key_dim, value_dim]``) in its recurrent form,
    in float32 as transformers computes it, as one scan over the tokens: ``(out [batch,
    length, heads, value_dim], final state or None)``. ``chunk_size`` is not used."""
    import torch
    from torch._higher_order_ops.scan import scan

    dtype, (batch, _, key_heads, key_dim) = query.dtype, key.shape
    heads, value_dim = value.shape[-2:]
    if key_heads != heads:  # grouped: each query/key head serves consecutive value heads
        query = query.repeat_interleave(heads // key_heads, dim=2)
        key = key.repeat_interleave(heads // key_heads, dim=2)
    query, key, value, g, beta = (x.to(torch.float32) for x in (query, key, value, g, beta))
    if use_qk_l2norm_in_kernel:
        query, key = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)
                      for x in (query, key))
    query = query / query.shape[-1] ** 0.5
    state = torch.zeros(batch, heads, key_dim, value_dim) if initial_state is None \
        else initial_state.to(torch.float32)
    state, out = scan(_delta_step, state, (query, key, value, g, beta), dim=1)
    return out.to(dtype), state if output_final_state else None


def _delta_step(state: "torch.Tensor", token: tuple["torch.Tensor", ...]
                ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """One token's gated delta update of ``state [batch, heads, key_dim, value_dim]``
    (``token``: its query, key, value, decay, beta): (new state, the token's output)."""
    query, key, value, g, beta = token
    state = state * g.exp()[..., None, None]
    delta = (value - (state * key.unsqueeze(-1)).sum(-2)) * beta.unsqueeze(-1)
    state = state + key.unsqueeze(-1) * delta.unsqueeze(-2)
    return state.clone(), (state * query.unsqueeze(-1)).sum(-2)


def scanned_selective_scan(
        states: MixerStates, hidden_states: "torch.Tensor", dt: "torch.Tensor",
        A: "torch.Tensor", B: "torch.Tensor", C: "torch.Tensor", D: "torch.Tensor | None" = None,
        z: "torch.Tensor | None" = None, delta_bias: "torch.Tensor | None" = None,
        delta_softplus: bool = False, return_last_state: bool = False, **kwargs: Any) -> Any:
    """transformers' ``mamba_selective_scan`` (``hidden_states`` and ``dt [batch, channels,
    length]``, ``A [channels, state]``, ``B``, ``C [batch, state, length]``...) from the state
    its mixer read (``states.last [batch, channels, state]``, zeros when None) as one scan over
    the tokens: the output ``[batch, channels, length]`` (and the final state)."""
    import torch
    import torch.nn.functional as F
    from torch._higher_order_ops.scan import scan

    dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    decay = torch.exp(A[None, :, None, :] * dt[:, :, :, None])
    update = dt[:, :, :, None] * B[:, None].transpose(2, 3).float() \
        * hidden_states[:, :, :, None].float()
    state = states.last
    state = torch.zeros(hidden_states.shape[0], *A.shape, dtype=dtype) if state is None \
        else state.to(dtype)
    tokens = (decay.movedim(2, 0), update.movedim(2, 0), C.to(state.dtype).movedim(2, 0))
    state, out = scan(_selective_step, state, tokens)
    out = out.movedim(0, 2).to(dtype)
    if D is not None:
        out = out + hidden_states * D[None, :, None]
    if z is not None:
        out = out * F.silu(z)
    return (out, state) if return_last_state else out


def _selective_step(state: "torch.Tensor", token: tuple["torch.Tensor", ...]
                    ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """One token's selective-scan update of ``state [batch, channels, state]`` (``token``: its
    decay and update ``[batch, channels, state]``, its ``C [batch, state]``): (new state, the
    token's output ``[batch, channels]``)."""
    decay, update, C = token
    state = decay * state + update
    # a product and a sum: with a matmul, torch.onnx's type promotion pass reruns the scan
    # and fails (a SymInt among the body's outputs; Jamba, torch 2.13)
    return state.clone(), (state * C.unsqueeze(1)).sum(-1)
