"""The model of a checked checkpoint, built by transformers, offline, its weights mapped.

``from_pretrained`` maps ``*.safetensors`` shards (the model's tensors are views of the
mapping, nothing is copied) and reads the config's dtype (``dtype="auto"``). Nothing is ever
downloaded: ``local_files_only`` (transformers' own argument: nothing in the process's
environment changes). The class is the one the config's ``architectures`` names; code from
the folder (``auto_map``) only when trusted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    trusted = checkpoint.remote_code

    def rejected(e: BaseException) -> InputError:
        return InputError(f"{checkpoint.path}: transformers could not load it: "
                          f"{type(e).__name__}: {first_line(e)}")

    with library_call("transformers", f"loading {checkpoint.path}", rejected,
                      parses_input=True):
        model = cls.from_pretrained(
            checkpoint.path, local_files_only=True, dtype=dtype,
            trust_remote_code=trusted, use_safetensors=checkpoint.safetensors)
    return model.eval()
