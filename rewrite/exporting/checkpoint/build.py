"""The model of a checked checkpoint, built by transformers, offline, its weights mapped.

``from_pretrained`` maps ``*.safetensors`` shards (the model's tensors are views of the
mapping, nothing is copied) and reads the config's dtype (``dtype="auto"``). Nothing is ever
downloaded: ``local_files_only`` and ``HF_HUB_OFFLINE`` while it runs. The class is the one
the config's ``architectures`` names; code from the folder (``auto_map``) only when trusted.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Iterator

from rewrite.exporting.checkpoint.folder import Checkpoint
from rewrite.errors import library_call
from rewrite.errors import InputError, first_line

if TYPE_CHECKING:
    import torch


def model_class(checkpoint: Checkpoint) -> type:
    """The transformers class of the checkpoint's architecture (InputError if unknown)."""
    try:
        import transformers
    except ImportError as e:
        raise InputError("rewrite export builds the model with transformers, which is not "
                         "installed: pip install 'rewrite[checkpoint]'") from e

    name = checkpoint.architecture
    cls = getattr(transformers, name, None) if name.isidentifier() else None
    if cls is None and checkpoint.remote_code:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM
    if not (isinstance(cls, type) and hasattr(cls, "from_pretrained")):
        raise InputError(f"{checkpoint.path}: architecture {name!r} is not a model class of "
                         f"transformers {transformers.__version__}")
    return cls


def is_causal_lm(cls: type) -> bool:
    """Whether ``cls`` is a causal language model (transformers' own list of them)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return cls.__name__ in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def load_model(checkpoint: Checkpoint, cls: type, dtype: "torch.dtype | str" = "auto"
               ) -> "torch.nn.Module":
    """``cls.from_pretrained`` of the folder, in eval mode (InputError when it fails);
    ``dtype``: the config's (``"auto"``), or the one given."""
    from transformers.utils import logging

    trusted = checkpoint.remote_code
    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # the caller's progress reports the step

    def rejected(e: BaseException) -> InputError:
        return InputError(f"{checkpoint.path}: transformers could not load it: "
                          f"{type(e).__name__}: {first_line(e)}")

    try:
        with library_call("transformers", f"loading {checkpoint.path}", rejected,
                          parses_input=True):
            model = cls.from_pretrained(
                checkpoint.path, local_files_only=True, dtype=dtype,
                trust_remote_code=trusted, use_safetensors=checkpoint.safetensors)
    finally:
        if shown:
            logging.enable_progress_bar()
    return model.eval()


def offline() -> contextlib.AbstractContextManager[None]:
    """``HF_HUB_OFFLINE=1`` while the block runs (restored afterwards): with
    ``local_files_only``, nothing looks up the hub, even when transformers is imported here."""
    return _environment(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def grouped_query_attention() -> contextlib.AbstractContextManager[None]:
    """While the block runs, transformers' SDPA attention passes ``enable_gqa`` to
    ``scaled_dot_product_attention`` instead of repeating the key/value heads first
    (``repeat_kv``: an expand and a reshape): the same values, but with dynamic shapes
    ``torch.export`` spends ~0.1 s per layer reasoning about that reshape's symbolic strides
    (measured: 16-layer Llama, 13.3 s -> 9.1 s under a profiler)."""
    return _environment(TRANSFORMERS_SDPA_FORCE_GQA="1")


@contextlib.contextmanager
def _environment(**variables: str) -> Iterator[None]:
    """``variables`` set in ``os.environ`` while the block runs (restored afterwards; the
    process's environment: not for threads that read it meanwhile)."""
    saved = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
