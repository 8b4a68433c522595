"""Programs as a test hands them to rewrite: built in memory, or saved with
``torch.export.save`` and read back by rewrite's ``.pt2`` loader; and what two loaders of one
file must agree on (which tensors share a storage, and every tensor's metadata).

The stateful and higher-order programs here are the ones the lowering tests build in memory
(``test_state.py``, ``test_higher_order.py``), so that the file path is tested like the memory
path (issue 29).
"""

from __future__ import annotations

import copy
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch

from tools import models
from tests.test_higher_order import Conditional, Regions
from tests.test_state import Cached

SOURCES = ("memory", "file")
LOWERINGS = ("per-body", "flat")


def as_source(program: torch.export.ExportedProgram, source: str, folder: Path
              ) -> torch.export.ExportedProgram | Path:
    """What ``rewrite.apply`` is given: ``program`` itself, or the ``.pt2`` it is saved to."""
    if source == "memory":
        return program
    path = folder / "program.pt2"
    torch.export.save(program, str(path))
    return path


def export(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
           strict: bool) -> torch.export.ExportedProgram:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(copy.deepcopy(model), args, kwargs or {}, strict=strict)


class Layouts(torch.nn.Module):
    """What a loader can get wrong: tied weights, buffers that are a slice (a storage offset)
    and a transpose (strides) of another, a frozen parameter, bfloat16, int64 and bool
    buffers, a non-persistent buffer, a lifted constant."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.frozen = torch.nn.Parameter(torch.randn(4), requires_grad=False)
        table = torch.randn(6, 4)
        self.register_buffer("table", table)
        self.register_buffer("rows", table[2:5])
        self.register_buffer("columns", table.t())
        self.register_buffer("brain", torch.randn(4).to(torch.bfloat16))
        self.register_buffer("index", torch.tensor([3, 1, 2]))
        self.register_buffer("mask", torch.tensor([True, False, True, True]), persistent=False)
        self.constant = torch.randn(4)

    def forward(self, ids):
        h = self.embed(ids) * self.frozen + self.constant + self.brain.float()
        h = h + self.rows.sum(0) + self.columns.sum(1)
        h = h + self.table.index_select(0, self.index).sum(0)
        return self.head(torch.where(self.mask, h, -h))


def static_cache_llama() -> tuple[torch.nn.Module, dict]:
    """transformers' static-cache decoder wrapper (cache buffers updated in place) around a
    2-layer random-weight Llama, and its keyword inputs."""
    from transformers import GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model, _, _ = models.llama(head=True)
    model.config.use_cache = True
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": 16})
    wrapper = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=16)
    return wrapper.eval(), {"input_ids": torch.randint(0, 100, (1, 4)),
                            "cache_position": torch.arange(4)}


def _seeded(make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    torch.manual_seed(0)
    return models.perturb(make().eval())


def programs() -> dict[str, Callable[[], tuple[torch.nn.Module, tuple, dict, bool]]]:
    """Name -> (model, args, kwargs, strict) of every program the round-trip tests save."""
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([1, 3])
    return {
        "cond": lambda: (_seeded(Conditional), (x,), {}, False),
        "cond-strict": lambda: (_seeded(Conditional), (x,), {}, True),
        "regions": lambda: (_seeded(Regions), (x,), {}, True),
        "cache-buffers": lambda: (_seeded(lambda: Cached(constants=False)), (x, pos), {}, True),
        "cache-constants": lambda: (_seeded(Cached), (x, pos), {}, False),
        "layouts": lambda: (_seeded(Layouts), (torch.tensor([[1, 5, 7]]),), {}, False),
        "static-cache": lambda: (*_static_cache(), True),
        "static-cache-nonstrict": lambda: (*_static_cache(), False),
    }


def _static_cache() -> tuple[torch.nn.Module, tuple, dict]:
    model, kwargs = static_cache_llama()
    return model, (), kwargs


def storage_classes(program: torch.export.ExportedProgram) -> set[frozenset[str]]:
    """The program's tensors (state and constants) grouped by the storage they are views of;
    empty tensors, which have no bytes to share, left out."""
    by_storage: dict[int, set[str]] = defaultdict(set)
    for name, tensor in {**program.state_dict, **program.constants}.items():
        if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().nbytes():
            by_storage[tensor.untyped_storage().data_ptr()].add(name)
    return {frozenset(names) for names in by_storage.values()}


def object_classes(program: torch.export.ExportedProgram) -> set[frozenset[str]]:
    """The program's tensor names grouped by the object they name (tied weights: one)."""
    by_object: dict[int, set[str]] = defaultdict(set)
    for name, tensor in {**program.state_dict, **program.constants}.items():
        by_object[id(tensor)].add(name)
    return {frozenset(names) for names in by_object.values()}


def tensor_facts(tensor: Any) -> tuple:
    """What a loader decides about one tensor (its bytes compared apart), and the bytes of
    its storage (its archive entry's)."""
    if not isinstance(tensor, torch.Tensor):
        return (type(tensor).__name__,)
    return (type(tensor).__name__, tensor.dtype, tuple(tensor.shape), tensor.stride(),
            tensor.storage_offset(), tensor.untyped_storage().nbytes(), tensor.requires_grad,
            tensor.is_leaf, type(tensor.grad_fn).__name__, tensor.device.type)


def signature_facts(program: torch.export.ExportedProgram) -> tuple:
    """Which names the program has as parameters, persistent and non-persistent buffers and
    lifted constants, and what ``module()`` makes of them."""
    sig = program.graph_signature
    module = program.module()
    return (tuple(sig.parameters), tuple(sig.buffers), tuple(sig.non_persistent_buffers),
            tuple(sig.lifted_tensor_constants),
            tuple((n, p.requires_grad) for n, p in module.named_parameters(remove_duplicate=False)),
            tuple(n for n, _ in module.named_buffers(remove_duplicate=False)),
            tuple(module.state_dict(keep_vars=False)))
