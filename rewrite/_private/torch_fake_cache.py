"""torch's fake-tensor dispatch cache, off while rewrite traces.

Checked with the torch releases of :data:`rewrite._private.CHECKED_WITH`. A ``FakeTensorMode``
caches each op's output metadata under a key made of its inputs' metadata. With symbolic
sizes, making an entry costs more than the op's own meta function (torch synthesizes the
output from the entry and checks it), and rewrite's traces repeat few ops under one key
(one decoder layer traced, the others recorded as calls of its trace). Measured on a
187M-parameter Llama checkpoint (``rewrite export --precision int4``): torch.export 1.4 ->
1.0 s, the per-body decomposition 0.9 -> 0.75 s, the same programs; with ``--trace whole``
(every layer traced) 2.0 -> 1.7 s and 1.0 -> 0.75 s.

Two private APIs: ``torch._dynamo.config.fake_tensor_cache_enabled`` (read when a fake mode is
made: torch.export makes its own) and ``fake_tensor.disable_fake_tensor_cache`` (an existing
mode: a loaded ``.pt2``'s). Without them the cache stays on: the same programs, slower.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def new_modes_uncached() -> Iterator[None]:
    """Fake modes made within the block (torch.export's) keep no dispatch cache."""
    with contextlib.ExitStack() as stack:
        try:
            from torch._dynamo import config

            stack.enter_context(config.patch(fake_tensor_cache_enabled=False))
        except (ImportError, AttributeError, KeyError):
            pass
        yield


def uncached(fake_mode: Any) -> contextlib.AbstractContextManager:
    """A block in which ``fake_mode`` keeps no dispatch cache."""
    try:
        from torch._subclasses.fake_tensor import disable_fake_tensor_cache
    except ImportError:
        return contextlib.nullcontext()
    if not hasattr(fake_mode, "cache_enabled"):
        return contextlib.nullcontext()
    return disable_fake_tensor_cache(fake_mode)
