"""The recurrent layers' scans, as torch.export can trace them for every sequence length.

transformers' torch paths loop in Python, which torch.export unrolls for the example's
length only: Mamba's ``mamba_selective_scan`` (Mamba, Falcon-Mamba, Jamba) over the tokens,
the gated delta rule's ``torch_chunk_gated_delta_rule`` (Qwen3-Next, Qwen3.5, OLMo-Hybrid...)
and Kimi's delta attention, ``chunk_kimi_delta_attention`` (Kimi-Linear, Bailing-Hybrid: the
same rule with a decay per key channel), over chunks and, under torch.export, over the rows
of each chunk's triangular system; Mamba-2's ``mamba2_chunk_scan`` (Bamba,
GraniteMoE-Hybrid, Falcon-H1, Nemotron-H, Zamba2) pads the sequence to whole chunks by
``(chunk - length % chunk) % chunk``, which torch's shape reasoning cannot prove a multiple
of the chunk (the export would fix the length). While exporting, :func:`traced_scans`
replaces each with the recurrence the model decodes with, written as one ``torch.scan`` over
the tokens: an ONNX ``Scan`` whose body is one token's update, for any length, linear in it,
a decode step's one token a scan of one. The replacements are the modeling module's
attributes, so neither transformers' hub kernels nor ``fla``'s or ``mamba_ssm``'s (picked at
run time when installed) are ever traced.

Mamba's full-sequence scan takes no state (transformers starts it from zeros; the one-token
step starts from the cache): :func:`scanned_selective_scan` starts from the state the mixer
read from its cache (:class:`MixerStates`, a pre-hook on each mixer), zeros before the first
token, so a multi-token call after earlier tokens continues their state, where transformers
5.24 restarts it.

Each scan runs along its operands' first axis (torch 2.9's scan stacks its outputs there
whatever its ``dim``; later releases along ``dim``). Mamba-2's scan operands are detached:
torch.onnx's type promotion pass reruns the scan, and on operands that require gradients
(computed from parameters) the scan's autograd form returns a size among its outputs, which
it then cannot stack; the other two scans are exported as they are (detached, they fail
torch.export's shape reasoning; torch 2.13). Each step is written with products and sums
(a matmul in Mamba's step failed as Mamba-2's).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import torch

MAMBA2 = "mamba2_chunk_scan"
DELTA_RULES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
               "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention")
SELECTIVE = "mamba_selective_scan"


@contextlib.contextmanager
def traced_scans(model: "torch.nn.Module") -> Iterator[None]:
    """``model``'s modeling modules' scans as one scan over the tokens while the block runs
    (:func:`scanned_mamba2`, :func:`scanned_gated_delta_rule`,
    :func:`scanned_selective_scan`); nothing changed for a model without one."""
    found = scan_modules(model)
    originals = {(module, name): getattr(module, name)
                 for module, names in found.items() for name in names}
    states = MixerStates(model, [module for module, names in found.items()
                                 if SELECTIVE in names])
    try:
        for (module, name), original in originals.items():
            setattr(module, name, scanned_mamba2 if name == MAMBA2
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
    found = {module: tuple(name for name in (MAMBA2, *DELTA_RULES, SELECTIVE)
                           if callable(getattr(module, name, None)))
             for module in modules if module is not None}
    return {module: names for module, names in found.items() if names}


class MixerStates:
    """The recurrent state each Mamba mixer of ``model`` (a module of a class of ``modules``
    with ``A_log`` and ``layer_idx``) reads from the cache it is called with, kept by a
    forward pre-hook for the selective scans the mixer calls next (:meth:`take`)."""

    def __init__(self, model: "torch.nn.Module", modules: list[types.ModuleType]) -> None:
        self.last: "torch.Tensor | None" = None
        self.scans = 0
        """Scans the mixer has called since the hook read its state."""
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
        self.scans = 0

    def take(self, A: "torch.Tensor") -> "torch.Tensor | None":
        """The state of the scan of ``A [channels, state]`` the mixer calls now: its cached
        state ``[batch, channels, state]``, or, for a mixer scanning head by head (Zamba's:
        a state ``[batch, heads, channels, state]``), the head of this call, heads being
        scanned in order; None before the first token."""
        import torch

        state, self.scans = self.last, self.scans + 1
        if state is not None and state.dim() == A.dim() + 2:
            # copied: the scan's carry has standard strides (a batch of 1's slice would keep
            # its parent's)
            return state[:, self.scans - 1].clone(memory_format=torch.contiguous_format)
        return state

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self.handles:
            handle.remove()


def scanned_mamba2(hidden_states: "torch.Tensor", dt: "torch.Tensor", A: "torch.Tensor",
                   B: "torch.Tensor", C: "torch.Tensor", chunk_size: int,
                   D: "torch.Tensor | None" = None, dt_bias: "torch.Tensor | None" = None,
                   initial_states: "torch.Tensor | None" = None, dt_softplus: bool = False,
                   dt_limit: tuple[float, float] = (0.0, float("inf")),
                   return_final_states: bool = False, **kwargs: Any) -> Any:
    """transformers' ``mamba2_chunk_scan`` (``hidden_states [batch, length, heads,
    head_dim]``, ``dt [batch, length, heads]``, ``A [heads]``, ``B``, ``C [batch, length,
    groups, state]``, ``initial_states [batch, heads, head_dim, state]``...) as one scan over
    the tokens, in float32 as transformers computes it: the output ``[batch, length, heads,
    head_dim]`` (and the final state). ``chunk_size`` is not used."""
    import torch
    import torch.nn.functional as F
    from torch._higher_order_ops.scan import scan

    batch, _, heads, head_dim = hidden_states.shape
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()
    x = hidden_states.float()
    B, C = (t.float().repeat_interleave(heads // t.shape[2], dim=2, output_size=heads)
            for t in (B, C))
    state = torch.zeros(batch, heads, head_dim, B.shape[-1]) if initial_states is None \
        else initial_states.float()
    tokens = (torch.exp(A.float() * dt), x * dt[..., None], B, C)
    state, out = scan(_mamba2_step, state.detach(),
                      tuple(t.detach().movedim(1, 0) for t in tokens))
    out = out.movedim(0, 1)
    if D is not None:
        out = out + D[..., None] * x
    return (out, state) if return_final_states else out


def _mamba2_step(state: "torch.Tensor", token: tuple["torch.Tensor", ...]
                 ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """One token's Mamba-2 update of ``state [batch, heads, head_dim, state]`` (``token``:
    its decay ``[batch, heads]``, input times step ``[batch, heads, head_dim]``, ``B`` and
    ``C [batch, heads, state]``): (new state, the token's output ``[batch, heads,
    head_dim]``)."""
    decay, update, B, C = token
    state = state * decay[..., None, None] + update[..., None] * B[:, :, None, :]
    return state.clone(), (state * C[:, :, None, :]).sum(-1)


def scanned_gated_delta_rule(
        query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor", g: "torch.Tensor",
        beta: "torch.Tensor", chunk_size: int = 64, initial_state: "torch.Tensor | None" = None,
        output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
        **kwargs: Any) -> tuple["torch.Tensor", "torch.Tensor | None"]:
    """transformers' gated delta rule (``query``, ``key [batch, length, key_heads, key_dim]``,
    ``value [batch, length, heads, value_dim]``, ``beta [batch, length, heads]``, the log
    decay ``g [batch, length, heads]``, or per key channel ``[batch, length, heads, key_dim]``
    in Kimi's delta attention, ``initial_state [batch, heads, key_dim, value_dim]``) in its
    recurrent form, in float32 as transformers computes it, as one scan over the tokens:
    ``(out [batch, length, heads, value_dim], final state or None)``. ``chunk_size`` is not
    used."""
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
    decay = g.exp()[..., None, None] if g.dim() == 3 else g.exp()[..., None]
    state, out = scan(_delta_step, state,
                      tuple(x.movedim(1, 0) for x in (query, key, value, decay, beta)))
    return out.movedim(0, 1).to(dtype), state if output_final_state else None


def _delta_step(state: "torch.Tensor", token: tuple["torch.Tensor", ...]
                ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """One token's gated delta update of ``state [batch, heads, key_dim, value_dim]``
    (``token``: its query, key, value, decay ``[batch, heads, 1 or key_dim, 1]``, beta): (new
    state, the token's output)."""
    query, key, value, decay, beta = token
    state = state * decay
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
    its mixer read (:meth:`MixerStates.take`, zeros when None) as one scan over the tokens:
    the output ``[batch, channels, length]`` (and the final state)."""
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
    state = states.take(A)
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
    return state.clone(), (state * C.unsqueeze(1)).sum(-1)
