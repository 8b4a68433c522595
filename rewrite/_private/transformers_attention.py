"""transformers' SDPA attention passing ``enable_gqa`` while a model is exported.

transformers' ``sdpa_attention_forward`` repeats the key/value heads of grouped-query
attention first (``repeat_kv``: an expand and a reshape) unless
``integrations.sdpa_attention.use_gqa_in_sdpa`` says to pass ``enable_gqa`` to
``scaled_dot_product_attention``: the same values, but with dynamic shapes ``torch.export``
spends ~0.1 s per layer reasoning about that reshape's symbolic strides (measured: 16-layer
Llama, 13.3 s -> 9.1 s under a profiler).

transformers offers no per-model switch for it: the only one is the environment variable
``TRANSFORMERS_SDPA_FORCE_GQA``, which that function reads at each call (process-wide: every
thread's models would see it). A model's ``attn_implementation`` names its attention function,
but one registered under a name of rewrite's would have to copy ``sdpa_attention_forward``
(transformers' code, per release) and register a mask function under that name too, and
models take other paths for a name that is not ``sdpa``. So while the block runs,
``use_gqa_in_sdpa`` is swapped (:mod:`._swap`, which runs swapped blocks one at a time) for
one that answers yes in this block's context only (a ``ContextVar``: torch.export runs the
model in the caller's thread) and gives transformers' own answer everywhere else: other
threads' models are not affected even while the swap is in place. Without that function
(other transformers releases): ``repeat_kv``, the same values, a slower export.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Iterator

from rewrite._private._swap import swapped

_FORCED: ContextVar[bool] = ContextVar("rewrite_sdpa_gqa", default=False)


@contextlib.contextmanager
def grouped_query_attention() -> Iterator[bool]:
    """Within the block, transformers' SDPA attention called from this context passes
    ``enable_gqa`` (see the module docstring); yields whether it does."""
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        yield False
        return
    original = getattr(sdpa_attention, "use_gqa_in_sdpa", None)

    def use_gqa_in_sdpa(attention_mask: Any, key: Any, value: Any) -> bool:
        return _FORCED.get() or bool(original(attention_mask, key, value))  # type: ignore

    token = _FORCED.set(True)
    try:
        with swapped(sdpa_attention if original is not None else None, "use_gqa_in_sdpa",
                     use_gqa_in_sdpa) as done:
            yield done
    finally:
        _FORCED.reset(token)
