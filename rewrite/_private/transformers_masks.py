"""transformers' attention masks made in the eager runs that check a traced layer as a trace
of ``torch.export`` makes them.

While a model is exported, ``transformers.masking_utils`` materializes masks that eager skips
(``_ignore_bidirectional_mask_sdpa`` reads ``is_torchdynamo_exporting``, a name of that
module): BART's family as decoders (``BartForCausalLM``...) gets an encoder mask while
exporting (unused: there is no encoder) and None in eager. A layer's call then has other
constants in eager than in its trace, and :func:`rewrite.exporting.once.check_bodies` could
not check its traced body (every layer was traced instead). While the block runs, that name
answers yes in this block's context only (a ``ContextVar``, as
:mod:`.transformers_attention`), transformers' own answer everywhere else; the masks are the
same values either way. Without that name (other transformers releases): eager's masks, the
check falls back to every layer traced, as before.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

from rewrite._private._swap import swapped

_FORCED: ContextVar[bool] = ContextVar("rewrite_masks_as_exported", default=False)


@contextlib.contextmanager
def masks_as_exported() -> Iterator[bool]:
    """Within the block, transformers' masks made from this context are made as while
    exporting (see the module docstring); yields whether they are."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield False
        return
    original = getattr(masking_utils, "is_torchdynamo_exporting", None)

    def is_torchdynamo_exporting() -> bool:
        return _FORCED.get() or bool(original())  # type: ignore[misc]

    token = _FORCED.set(True)
    try:
        with swapped(masking_utils if callable(original) else None,
                     "is_torchdynamo_exporting", is_torchdynamo_exporting) as done:
            yield done
    finally:
        _FORCED.reset(token)
