"""Each distinct decoder layer traced once by ``torch.export``: the export's cost flat in depth.

torch.export traces every layer of a model again; from a checkpoint that is most of the
export's time (~0.6 s per layer). While exporting, each decoder layer's ``forward`` is
replaced on the instance (module paths and weight names stay the checkpoint's): its call
becomes one call of a function of the layer's weights, its tensor arguments and its layer's
cache (keys and values in, updated keys and values out), which
:class:`rewrite._private.torch_layer_calls.LayerCalls` traces at the first layer of each kind
and records, not traced, at the others. The program holds one ``invoke_subgraph`` body per
kind, which rewrite's reader inlines at each call with that call's module paths
(:func:`rewrite.frontends.fx.regions.readable_program`): grouping, lowering and the ONNX
output are those of the whole-model trace.

A kind is the layer's class, the names, shapes and dtypes of its weights, the settings of
its modules (their plain attributes: a sliding or a full attention, dense or MoE; the layer's
index aside) and the non-tensor arguments of its call. The export is checked after
(:func:`check_bodies`): the program is run against the model on one row of its example
inputs, and must give what the model gives (a layer whose code reads its index or other
state per layer would not); a fixed cache's program at its twin's sizes
(:mod:`rewrite.exporting.twin`). Where the model cannot be cut this way (no list of decoder
layers, a cache other than transformers' ``DynamicCache``, a failure of the cut trace, a
layer its body does not reproduce), :func:`traced_once` says why in one line and traces the
whole model.
"""

from __future__ import annotations

import contextlib
import hashlib
import types
from typing import TYPE_CHECKING, Any, Callable, Iterator

from attrs import frozen

from rewrite._private.errors import Unavailable
from rewrite._private.torch_layer_calls import LayerCalls, available
from rewrite._private.torch_repeated_calls import Extension, extended
from rewrite._private.transformers_masks import masks_as_exported
from rewrite.errors import InputError, LibraryError, first_line, library_call
from rewrite.exporting.bounds import Bounded
from rewrite.exporting.twin import Twin, alike

if TYPE_CHECKING:
    import torch

    from rewrite.backends.onnx import Progress

TRACES = ("layers", "whole")
"""``rewrite export --trace``: each distinct layer once (where the model can be cut so), or
the whole model."""
_INDEX_NAMES = frozenset({"layer_idx", "layer_id", "layer_index", "layer_number", "idx"})
"""Attributes that number a layer (the layer's index; checked by running every layer)."""


def decoder_layers(model: "torch.nn.Module") -> "torch.nn.ModuleList | None":
    """The model's list of decoder layers: its one ``ModuleList`` of ``num_hidden_layers``
    modules of one base class (None when there is not exactly one)."""
    import torch

    config = model.config.get_text_config(decoder=True)
    count = getattr(config, "num_hidden_layers", None)
    found = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)
             and len(m) == count and count and any(True for _ in m[0].parameters())]
    return found[0] if len(found) == 1 else None


def repeated_layers(model: "torch.nn.Module") -> "torch.nn.ModuleList | None":
    """A module's list of repeated layers (``rewrite.export(module)``, no config to read): its
    one outermost ``ModuleList`` of two or more modules of one class holding weights (None
    when there is not exactly one; lists inside another's layers, such as a mixture's
    experts, do not count)."""
    import torch

    lists = {path: m for path, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)
             and len(m) > 1 and len({type(layer) for layer in m}) == 1
             and any(True for _ in m[0].parameters())}
    outermost = [m for path, m in lists.items()
                 if not any(path.startswith(f"{other}.") for other in lists if other != path)]
    return outermost[0] if len(outermost) == 1 else None


def kind(layer: "torch.nn.Module") -> str:
    """The layer's kind (see the module docstring), as a short identifier."""
    parts = [type(layer).__qualname__]
    for name, tensor in (*layer.named_parameters(), *layer.named_buffers()):
        parts.append(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}")
    for path, module in layer.named_modules():
        settings = {k: v for k, v in vars(module).items()
                    if not k.startswith("_") and k not in _INDEX_NAMES and _plain(v)}
        parts.append(f"{path}:{type(module).__qualname__}:{sorted(settings.items())!r}")
    digest = hashlib.sha1("\n".join(parts).encode()).hexdigest()[:10]
    return f"{type(layer).__name__}_{digest}"


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def traced_once(model: "torch.nn.Module", progress: "Progress",
                export: Callable[..., "torch.export.ExportedProgram"], example: tuple,
                dynamic_shapes: Any = None, used: list | None = None,
                kwargs: dict | None = None, layers: "torch.nn.ModuleList | None" = None,
                twin: Twin | None = None, weighed: bool = True
                ) -> "torch.export.ExportedProgram":
    """``export()`` with each distinct decoder layer of ``model`` traced once (``example``
    and ``dynamic_shapes``: the export's example inputs and their dynamic shapes; ``used``
    gets a ``True`` when the program is so made); where the model cannot be cut so, a
    one-line note of why, and ``export()`` as it is.

    A checkpoint's model is traced cut to its first layers (:func:`first_layers`: as many
    as its kinds need), the further layers added to the program as calls of their kinds'
    traces (:mod:`rewrite._private.torch_repeated_calls`); where that fails, every layer's
    call is traced or recorded. ``kwargs`` (a dict, even empty) marks a module's export
    (``rewrite.export(module)``): its layers are its :func:`repeated_layers`, checked on
    ``example`` and ``kwargs`` as given; without it, a checkpoint's decoder layers, checked
    on a row of ``example`` randomized. ``layers``: the list to cut, when not the model's
    own (an encoder-decoder's encoder). ``twin``: smaller inputs of the same call, at which
    a program extended from its first layers is checked when its example costs more
    (:mod:`rewrite.exporting.twin`). ``weighed=False``: the model's weights are placeholders
    until written (int4's float32 shell, :mod:`rewrite.exporting.int4`), on which eager
    computes nothing to compare: the bodies are not run here; the written model's check
    against eager on the real weights stands for it (a model that fails it is exported again
    with every layer traced: ``checkpoint._traced``)."""
    if layers is None:
        layers = decoder_layers(model) if kwargs is None else repeated_layers(model)
    reason = _cannot_cut(model, layers, kwargs is not None)
    if reason is None:
        try:
            program, calls, added = _cut_trace(model, layers, export, example,
                                               dynamic_shapes, kwargs is None, progress)
            reason, by_twin = _sizes_from_data(program), False
            if reason is None and weighed:
                checking = _Checking(model, layers, export, dynamic_shapes)
                reason, by_twin = checking.verdict(program, example, kwargs, added > 0, twin)
        except Bounded:
            raise
        except (Unavailable, InputError, LibraryError) as e:  # not supported by the cut
            reason = f"the cut trace failed: {type(e).__name__}: {first_line(e)}"
        if reason is None:
            if used is not None:
                used.append(True)
            progress.note(f"torch.export: {len(calls.traced)} of {len(layers)} layers traced "
                          f"({_classes(calls.traced)}), {calls.recorded + added} recorded as "
                          "calls of their traces" + (f" ({added} added to the program of "
                                                     f"the first {len(layers) - added})"
                                                     if added else "")
                          + ("; checked at its twin's sizes, its program alike" if by_twin
                             else "")
                          + ("" if weighed else "; checked with the written model, on the "
                             "weights written"))
            return program
    progress.note(f"torch.export traces every layer: {reason}")
    return export()


def _cut_trace(model: "torch.nn.Module", layers: "torch.nn.ModuleList",
               export: Callable[..., "torch.export.ExportedProgram"], example: tuple,
               dynamic_shapes: Any, first: bool, progress: "Progress"
               ) -> tuple["torch.export.ExportedProgram", LayerCalls, int]:
    """The program with each layer a call of its kind's trace, the traced calls, and how
    many layers were added to the program without a trace: the model cut to its
    :func:`first_layers` when ``first`` and it can be (the further layers added), else
    every layer's call traced or recorded."""
    plan = first_layers(model, layers, example, dynamic_shapes) if first else None
    if plan is not None:
        calls = LayerCalls()
        try:
            return _extended(model, layers, export, plan, calls), calls, \
                len(layers) - plan.count
        except Bounded:
            raise
        except (Unavailable, InputError, LibraryError) as e:
            progress.note(f"torch.export traces or records every layer's call: the program "
                          f"of the first {plan.count} layers could not be extended: "
                          f"{type(e).__name__}: {first_line(e)}")
    calls = LayerCalls()
    with cut(layers, calls), _no_gradients(model):
        return export(), calls, 0


def _extended(model: "torch.nn.Module", layers: "torch.nn.ModuleList",
              export: Callable[..., "torch.export.ExportedProgram"], plan: "FirstLayers",
              calls: LayerCalls) -> "torch.export.ExportedProgram":
    """The program of the model cut as ``plan`` says (its layers' calls traced or recorded
    by ``calls``), extended to every layer."""
    with cut(layers, calls), plan.cut(model, layers), _no_gradients(model):
        program = export(args=plan.args, dynamic_shapes=plan.dynamic_shapes)
    return extended(program, plan.extension(model))


@contextlib.contextmanager
def _no_gradients(model: "torch.nn.Module") -> Iterator[None]:
    """While inside, ``model``'s parameters require no gradients: a layer's body is traced
    without autograd (a ``torch.scan`` in a body whose operands require gradients is traced
    with its backward too: tiny Jamba's and Qwen3-Next's cut traces took 2.3x as long)."""
    held = [p for p in model.parameters() if p.requires_grad]
    for p in held:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in held:
            p.requires_grad_(True)


@frozen(eq=False)
class _Checking:
    """How a program traced once is checked: :func:`check_bodies` on its example, or on its
    twin's where the twin stands for it (:mod:`rewrite.exporting.twin`)."""

    model: "torch.nn.Module"
    layers: "torch.nn.ModuleList"
    export: Callable[..., "torch.export.ExportedProgram"]
    dynamic_shapes: Any

    def verdict(self, program: "torch.export.ExportedProgram", example: tuple,
                kwargs: dict | None, added: bool, twin: Twin | None
                ) -> tuple[str | None, bool]:
        """Why ``program`` does not compute the model (None: it does), and whether its twin
        was checked in its stead."""
        if twin is not None and added and kwargs is None and twin.stands_for(example):
            made = self._twin(twin)
            if made is not None and alike(made, program):
                return twin.made["reason"], True
        return check_bodies(self.model, self.layers, program, example, kwargs, added), False

    def _twin(self, twin: Twin) -> "torch.export.ExportedProgram | None":
        """The twin's program extended from its first layers, checked (its verdict kept in
        ``twin.made``), traced once per export; None where it cannot be so made."""
        if "program" not in twin.made:
            plan = first_layers(self.model, self.layers, twin.args, self.dynamic_shapes)
            program = None
            with contextlib.suppress(Unavailable, InputError, LibraryError):
                program = None if plan is None else _extended(
                    self.model, self.layers, self.export, plan, LayerCalls())
            twin.made["reason"] = None if program is None else check_bodies(
                self.model, self.layers, program, twin.args, None, True)
            twin.made["program"] = program
        return twin.made["program"]


@frozen(eq=False)
class FirstLayers:
    """A checkpoint's model cut to its first layers for torch.export: as many as it takes
    for each kind of the further layers to be traced after another layer (two of each
    kind, at least), with its example inputs and dynamic shapes cut to their states."""

    path: str
    """The layer list's module path."""
    count: int
    """How many layers the cut model keeps."""
    templates: tuple[int, ...]
    """Per layer, the kept layer whose call it repeats: the second of its kind."""
    whole_args: tuple
    """The whole model's example inputs."""
    states_at: int | None
    """Where the example inputs hold a list of per-layer states (the cache), or None."""
    args: tuple
    """The cut model's example inputs: the states list cut to :attr:`count` layers."""
    dynamic_shapes: Any
    """Their dynamic shapes, cut the same way."""

    @contextlib.contextmanager
    def cut(self, model: "torch.nn.Module", layers: "torch.nn.ModuleList") -> Iterator[None]:
        """While inside, ``model``'s layer list and its config's layer count (and list of
        layer types) are cut."""
        parent, _, name = self.path.rpartition(".")
        owner = model.get_submodule(parent)
        config = model.config.get_text_config(decoder=True)
        saved = {"num_hidden_layers": config.num_hidden_layers}
        types = getattr(config, "layer_types", None)
        try:
            config.num_hidden_layers = self.count
        except (AttributeError, NotImplementedError) as e:  # ProphetNet's: a property
            raise Unavailable(f"its config's layer count cannot be set: {first_line(e)}") \
                from e
        owner._modules[name] = layers[:self.count]
        if isinstance(types, list):  # per layer: cut as the layers are
            with contextlib.suppress(AttributeError):  # a property of the count (Bamba's)
                config.layer_types, saved["layer_types"] = types[:self.count], types
        try:
            yield
        finally:
            owner._modules[name] = layers
            for key, value in saved.items():
                setattr(config, key, value)

    def extension(self, model: "torch.nn.Module") -> Extension:
        """What the cut model's program needs to hold every layer."""
        tensors = dict(model.named_parameters(remove_duplicate=False))
        tensors.update(model.named_buffers(remove_duplicate=False))
        return Extension(self.path, self.templates, self.whole_args, self.states_at, tensors)


def first_layers(model: "torch.nn.Module", layers: "torch.nn.ModuleList", example: tuple,
                 dynamic_shapes: Any) -> FirstLayers | None:
    """How ``model`` is cut to its first layers (:class:`FirstLayers`), or None where it
    would keep them all or its inputs hold per-layer values it cannot cut."""
    kinds = [kind(layer) for layer in layers]
    count = next((m for m in range(2, len(kinds)) if all(
        kinds[:m].count(k) >= 2 for k in set(kinds[m:]))), None)
    path = next((p for p, m in model.named_modules() if m is layers), None)
    if count is None or not path:
        return None
    second = {}
    for index, k in enumerate(kinds[:count]):
        if kinds[:index].count(k) == 1:
            second[k] = index
    templates = (*range(count), *(second[k] for k in kinds[count:]))
    at = [k for k, v in enumerate(example) if isinstance(v, list) and len(v) == len(kinds)]
    if len(at) > 1:
        return None
    args, shapes = tuple(example), dynamic_shapes
    if at:
        if not isinstance(shapes, (tuple, list)) or len(shapes) != len(args) \
                or not isinstance(shapes[at[0]], list) or len(shapes[at[0]]) != len(kinds):
            return None
        args = (*args[:at[0]], args[at[0]][:count], *args[at[0] + 1:])
        shapes = (*shapes[:at[0]], shapes[at[0]][:count], *shapes[at[0] + 1:])
    return FirstLayers(path, count, templates, tuple(example), at[0] if at else None, args,
                       type(dynamic_shapes)(shapes) if shapes is not None else None)


def _classes(identifiers: list[str]) -> str:
    """``Gemma2DecoderLayer x2`` for the identifiers of :class:`LayerCall` s."""
    names = [identifier.split(".")[0].rsplit("_", 2)[0] for identifier in identifiers]
    return ", ".join(f"{name} x{names.count(name)}" if names.count(name) > 1 else name
                     for name in dict.fromkeys(names))


def _cannot_cut(model: "torch.nn.Module", layers: Any, module: bool) -> str | None:
    if not available():
        return "this torch lacks what tracing a layer once needs"
    if layers is None and module:
        return (f"{type(model).__name__} has no one list of repeated layers (a ModuleList "
                "of modules of one class)")
    if layers is None:
        return (f"{type(model).__name__} has no one list of num_hidden_layers decoder "
                "layers")
    return None


@contextlib.contextmanager
def cut(layers: "torch.nn.ModuleList", calls: "LayerCalls | BodyCheck") -> Iterator[None]:
    """While inside, each layer's call goes through ``calls`` (see the module docstring)."""
    kinds = [kind(layer) for layer in layers]
    outputs_of: dict = {}
    for index, (layer, identifier) in enumerate(zip(layers, kinds)):
        layer.forward = types.MethodType(_layer_forward(calls, index, identifier, outputs_of),
                                         layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def _layer_forward(calls: "LayerCalls | BodyCheck", index: int, kind: str, outputs_of: dict
                   ) -> Callable[..., Any]:
    """The forward of layer ``index``: one call of its kind's body through ``calls``
    (``outputs_of``: the structure of each body's outputs, shared by the layers)."""

    def forward(self: "torch.nn.Module", *args: Any, **kwargs: Any) -> Any:
        call = LayerCall(self, index, kind, args, dict(kwargs), outputs_of)
        return call.finish(calls.call(call.identifier, call.body, call.operands))

    return forward


class LayerCall:
    """One call of a layer, as a function of tensors: its weights, its tensor arguments and
    its layer's past keys and values in; its tensor outputs and updated keys and values
    out. The call's other arguments are constants of the function (in :attr:`identifier`)."""

    def __init__(self, layer: "torch.nn.Module", index: int, kind: str, args: tuple,
                 kwargs: dict, outputs_of: dict) -> None:
        import torch
        import torch.utils._pytree as pytree

        from transformers.cache_utils import Cache

        self.layer, self.index, self._outputs_of = layer, index, outputs_of
        places = [*(k for k, v in enumerate(args) if isinstance(v, Cache)),
                  *(k for k, v in kwargs.items() if isinstance(v, Cache))]
        self.cache_at: int | str | None = places[0] if places else None
        """Where the call passes the cache: a position, a keyword, or None."""
        self.cache = None
        if isinstance(self.cache_at, int):
            args = list(args)
            self.cache, args[self.cache_at] = args[self.cache_at], None
        elif self.cache_at is not None:
            self.cache = kwargs.pop(self.cache_at)
        self.past = self._past() if self.cache is not None else ()
        self.leaves, self.spec = pytree.tree_flatten((args, kwargs))
        self.tensors = [k for k, v in enumerate(self.leaves) if isinstance(v, torch.Tensor)]
        self.shared = _SharedStates(self.leaves)
        named = [*layer.named_parameters(), *layer.named_buffers()]
        self.names = [name for name, _ in named]
        self.operands = (*(t for _, t in named), *(self.leaves[k] for k in self.tensors),
                         *self.shared.tensors(), *self.past)
        others = [repr(v) for k, v in enumerate(self.leaves)
                  if k not in self.tensors and k != self.shared.at]
        text = f"{self.spec}|{others}|{self.cache_at}|{self.shared.layout}"
        self.identifier = f"{kind}_{hashlib.sha1(text.encode()).hexdigest()[:8]}"
        """The function's identifier: the layer's kind and the call's constants."""

    def _past(self) -> tuple:
        self.slots = _slots(self.cache)
        if self.slots is None:
            raise Unavailable(f"the cache is a {type(self.cache).__name__}")
        past = self.slots.read(self.cache, self.index)
        if any(t is None for t in past):
            raise Unavailable(f"layer {self.index}'s cache holds no keys and values")
        return past  # empty: a layer that keeps no state (a hybrid's MLP layer)

    def body(self, *operands: "torch.Tensor") -> tuple:
        """The layer's call on ``operands`` (see the class docstring)."""
        import torch
        import torch.utils._pytree as pytree

        weights = dict(zip(self.names, operands))
        given = operands[len(self.names):len(operands) - len(self.past)]
        leaves = list(self.leaves)
        for k, tensor in zip(self.tensors, given):
            leaves[k] = tensor
        shared = self.shared.made(given[len(self.tensors):])
        if shared is not None:
            leaves[self.shared.at], before = shared, dict(shared)
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        if self.past:
            saved = self.slots.read(self.cache, self.index)
            self.slots.install(self.cache, self.index, operands[len(operands) - len(saved):],
                               given=True)
        if self.cache is not None:
            if isinstance(self.cache_at, int):
                args[self.cache_at] = self.cache
            else:
                kwargs[self.cache_at] = self.cache
        forward = self.layer.__dict__.pop("forward")  # the class's, for this call
        try:
            out = torch.func.functional_call(self.layer, weights, tuple(args), kwargs)
        finally:
            self.layer.forward = forward
        out_leaves, out_spec = pytree.tree_flatten(out)
        stored, entries = self.shared.stored(shared, before if shared is not None else {})
        self._outputs_of[self.identifier] = (out_leaves, out_spec, stored)
        tensors = [v for v in out_leaves if isinstance(v, torch.Tensor)] + entries
        if self.past:
            tensors += self.slots.updated(self.cache, self.index)
            self.slots.install(self.cache, self.index, saved)
        return tuple(tensors)

    def finish(self, outputs: tuple) -> Any:
        """The layer's return value from the function's ``outputs``; the layer's cache
        updated."""
        import torch
        import torch.utils._pytree as pytree

        if self.past:
            state = self.slots.read(self.cache, self.index)
            changed = self.slots.changed(state)
            rest = state[changed:]  # read-only state: unchanged
            self.slots.install(self.cache, self.index, (*outputs[-changed:], *rest))
            outputs = outputs[:-changed]
        leaves, spec, stored = self._outputs_of[self.identifier]
        count = sum(n for _, n in stored)
        if count:
            self.shared.install(stored, outputs[len(outputs) - count:])
            outputs = outputs[:len(outputs) - count]
        given = iter(outputs)
        leaves = [next(given) if isinstance(v, torch.Tensor) else v for v in leaves]
        return pytree.tree_unflatten(leaves, spec)


class _SharedStates:
    """A mapping of tensors passed to every layer, which layers store into for later layers
    to read (Gemma 4's ``shared_kv_states``, a ``UserDict``: the keys and values of the last
    layer of each attention type before the layers that share them). In a layer's function
    its entries are operands (their keys and sizes among the call's constants, in
    :attr:`layout`) and the entries the call stores are outputs, stored into the model's
    mapping after the call."""

    def __init__(self, leaves: list) -> None:
        from collections import UserDict

        import torch

        found = [k for k, v in enumerate(leaves) if isinstance(v, UserDict)]
        self.at: int | None = found[0] if found else None
        self.mapping = None if self.at is None else leaves[self.at]
        values = [] if self.mapping is None else list(self.mapping.values())
        if len(found) > 1 or not all(
                isinstance(v, tuple) and all(isinstance(t, torch.Tensor) for t in v)
                for v in values):
            raise Unavailable("a layer is given a mapping of other values than tensors")
        self.layout: tuple[tuple[Any, int], ...] = () if self.mapping is None else tuple(
            (key, len(value)) for key, value in self.mapping.items())

    def tensors(self) -> tuple:
        return tuple(t for value in (self.mapping or {}).values() for t in value)

    def made(self, tensors: tuple) -> Any:
        """A mapping of the model's type holding ``tensors`` as :attr:`layout` says (None
        where the call is given none)."""
        if self.mapping is None:
            return None
        made, given = type(self.mapping)(), iter(tensors)
        for key, count in self.layout:
            made[key] = tuple(next(given) for _ in range(count))
        return made

    @staticmethod
    def stored(made: Any, given: dict) -> tuple[tuple[tuple[Any, int], ...], list]:
        """What the call stored into ``made`` (the mapping :meth:`made` gave it, ``given``
        its entries then): the keys and sizes, and the tensors."""
        if made is None:
            return (), []
        new = [(key, value) for key, value in made.items() if value is not given.get(key)]
        return tuple((key, len(value)) for key, value in new), [t for _, v in new for t in v]

    def install(self, stored: tuple[tuple[Any, int], ...], tensors: tuple) -> None:
        given = iter(tensors)
        for key, count in stored:
            self.mapping[key] = tuple(next(given) for _ in range(count))


class _DynamicSlots:
    """A ``DynamicCache`` layer's state, all updated by the layer: its keys and values (and
    indexer keys), or a hybrid's convolution state (and recurrent state)
    (:func:`~rewrite.exporting.checkpoint.cache.layer_state`)."""

    @staticmethod
    def read(cache: Any, index: int) -> tuple:
        from rewrite.exporting.checkpoint.cache import layer_state

        return layer_state(cache.layers[index])

    @staticmethod
    def install(cache: Any, index: int, tensors: tuple, given: bool = False) -> None:
        """``tensors`` as layer ``index``'s state; convolution and recurrent states, updated
        in place by the layer, copied when ``given`` (the function's input)."""
        from rewrite.exporting.checkpoint.cache import holding_states

        layer = cache.layers[index]
        if tensors and hasattr(layer, "keys"):  # keys and values first, maybe indexer keys
            layer.keys, layer.values, *tensors = tensors
            if tensors and hasattr(layer, "indexer_keys"):
                layer.indexer_keys, *tensors = tensors
            if tensors and getattr(layer, "named_states", None):  # DeepSeek-V4's
                layer.named_states, tensors = dict(zip(layer.named_states, tensors)), ()
        if tensors:  # a hybrid's states (Falcon-H1's beside keys and values)
            holding_states(layer, *tensors, copy=given)

    updated = read

    @staticmethod
    def changed(state: tuple) -> int:
        """How many of a layer's ``state`` tensors its call updates: all."""
        return len(state)


class _FixedSlots:
    """A :class:`~rewrite.exporting.checkpoint.fixed_cache.FixedCache` layer's state: its
    key and value buffers (updated), then the positions written at (read only)."""

    @staticmethod
    def read(cache: Any, index: int) -> tuple:
        return (*cache.buffers[index], cache.positions)

    @staticmethod
    def install(cache: Any, index: int, tensors: tuple, given: bool = False) -> None:
        cache.buffers[index] = [tensors[0], tensors[1]]
        cache.positions = tensors[2]

    @staticmethod
    def updated(cache: Any, index: int) -> tuple:
        return tuple(cache.buffers[index])

    @staticmethod
    def changed(state: tuple) -> int:
        """How many of a layer's ``state`` tensors its call updates: the two buffers."""
        return 2


class _EncoderDecoderSlots:
    """An ``EncoderDecoderCache`` layer's state (a decoder step's): its self-attention keys
    and values, then its cross-attention ones (the encoder's: made at the first step), all
    updated by the layer."""

    @staticmethod
    def read(cache: Any, index: int) -> tuple:
        return (*_DynamicSlots.read(cache.self_attention_cache, index),
                *_DynamicSlots.read(cache.cross_attention_cache, index))

    @staticmethod
    def install(cache: Any, index: int, tensors: tuple, given: bool = False) -> None:
        _DynamicSlots.install(cache.self_attention_cache, index, tensors[:2], given)
        _DynamicSlots.install(cache.cross_attention_cache, index, tensors[2:], given)

    updated = read

    @staticmethod
    def changed(state: tuple) -> int:
        """How many of a layer's ``state`` tensors its call updates: all."""
        return len(state)


def _slots(cache: Any) -> "type[_DynamicSlots | _FixedSlots | _EncoderDecoderSlots] | None":
    """How a layer's state is read from ``cache`` and written back (None: a cache not
    known here)."""
    from rewrite.exporting.checkpoint.fixed_cache import FixedCache

    if type(cache) is FixedCache:
        return _FixedSlots
    from transformers import DynamicCache, EncoderDecoderCache

    if type(cache) is EncoderDecoderCache and all(
            type(part) is DynamicCache and hasattr(part, "layers")
            for part in (cache.self_attention_cache, cache.cross_attention_cache)):
        return _EncoderDecoderSlots

    if isinstance(cache, DynamicCache) and hasattr(cache, "layers"):
        return _DynamicSlots  # a model's own subclass too (MiniMax's: states in its layers)
    return None


class BodyCheck:
    """Runs each layer's function as is and checks, as it is called, that a traced body of
    its identifier (``bodies``) gives its outputs: :attr:`reason` says why the first that
    does not fails (None: all do). Nothing is kept (a static export's calls hold the whole
    cache buffers: 144 MB at 16 layers of a 1.24B model)."""

    def __init__(self, bodies: dict[str, "torch.fx.GraphModule"]) -> None:
        self.bodies = bodies
        self.reason: str | None = None
        self.index = 0

    def call(self, identifier: str, body: Callable[..., tuple], operands: tuple) -> tuple:
        outputs = tuple(body(*operands))
        index, self.index = self.index, self.index + 1
        if self.reason is None:
            self.reason = self._failure(index, identifier, operands, outputs)
        return outputs

    def candidates(self, identifier: str) -> list["torch.fx.GraphModule"]:
        """The traced bodies of ``identifier``."""
        return [body for name, body in self.bodies.items()
                if name == identifier or name.startswith(f"{identifier}.")]

    def _failure(self, index: int, identifier: str, operands: tuple, outputs: tuple
                 ) -> str | None:
        candidates = self.candidates(identifier)
        if not candidates:
            return (f"layer {index} took another path in eager than in the trace: its "
                    "traced body could not be checked")
        if not any(_same(body, operands, outputs) for body in candidates):
            return (f"layer {index}'s traced body does not compute it (its code differs "
                    f"from its kind's first layer: {identifier})")
        return None


class BodyRun(BodyCheck):
    """Runs each layer through its kind's traced body: the model as the program computes
    it. The first call of each identifier, and one with no single body, runs the layer's
    function too and is checked as :class:`BodyCheck` checks (which also gives the outputs'
    structure)."""

    def __init__(self, bodies: dict[str, "torch.fx.GraphModule"]) -> None:
        super().__init__(bodies)
        self.seen: set[str] = set()

    def call(self, identifier: str, body: Callable[..., tuple], operands: tuple) -> tuple:
        candidates = self.candidates(identifier)
        if identifier not in self.seen or len(candidates) != 1:
            self.seen.add(identifier)
            return super().call(identifier, body, operands)
        index, self.index = self.index, self.index + 1
        try:
            return tuple(candidates[0](*operands))
        except RuntimeError:  # not the sizes it was traced for
            if self.reason is None:
                self.reason = f"layer {index}'s traced body does not run on its inputs"
            return tuple(body(*operands))


def check_bodies(model: "torch.nn.Module", layers: "torch.nn.ModuleList",
                 program: "torch.export.ExportedProgram", example: tuple,
                 kwargs: dict | None = None, added: bool = False) -> str | None:
    """Why ``program``'s traced bodies do not compute every layer (None when they do): the
    model whose layers go through their traced bodies gives what the model gives, eagerly on
    ``example`` (a checkpoint's export's example inputs, one row, the cache made random: two
    runs; a fixed cache's export checks its twin's program instead,
    :mod:`rewrite.exporting.twin`; a module's: the program as it is, on ``example`` and
    ``kwargs`` as given).
    Where it does not, the verdict is the layer by layer one: the model whose layers go
    through their functions gives what the model gives, and each layer's kind's body gives
    what its function gives (one run more, to say which layer). A program to which layers
    were ``added`` is itself run instead of the model through the bodies: what joins the
    added calls is checked too."""
    import torch

    bodies = _bodies(program)
    if kwargs is not None:
        return _check_program(model, program, example, kwargs)
    example = _randomized(example)
    name = type(model).__name__

    def failed(e: BaseException) -> InputError:
        return InputError(f"{name} failed through its layers' functions: "
                          f"{type(e).__name__}: {first_line(e)}")

    with library_call("transformers", f"running {name}", failed), torch.no_grad(), \
            masks_as_exported():  # the trace's masks (BART's family: an encoder mask)
        whole = model(*example)
        if added:
            if _all_close(whole, _run_program(program, example)):
                return None
        else:
            run = BodyRun(bodies)  # the model as the program computes it: two runs in all
            with cut(layers, run):
                through = model(*example)
            if run.reason is None and _all_close(whole, through):
                return None
        checked = BodyCheck(bodies)  # else, each layer against its function: which one
        with cut(layers, checked):
            through = model(*example)
    if not _all_close(whole, through):
        return "the model through its layers' functions does not give the model's outputs"
    return checked.reason or ("the program of the first layers, extended, does not give the "
                              "model's outputs" if added else None)


def _sizes_from_data(program: "torch.export.ExportedProgram") -> str | None:
    """Why torch's ONNX translation would not keep apart the sizes each call of a traced
    body computes from data (None: it would). A size computed from data inside a layer (an
    unbacked symbol, ``u0``: the rows a MoE routes to an expert) has one name in the body
    and another value at each call; torch 2.9's translator (public ``torch.onnx.export``
    too) takes it to be one value at every call and writes a model that disagrees with
    eager. 2.10 and later keep them apart (checked with 2.9.1, 2.10.0 and later:
    ``tests/test_trace_layers_once.py``)."""
    import torch
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    if torch.__version__ >= (2, 10):
        return None
    for identifier, body in _bodies(program).items():
        if any(free_unbacked_symbols(node.meta.get("val")) for node in body.graph.nodes):
            return (f"{_classes([identifier])} computes sizes from data, which torch "
                    f"{torch.__version__.split('+')[0]}'s ONNX translation takes to be "
                    "one value at every layer (torch 2.10 and later keep them apart)")
    return None


def _run_program(program: "torch.export.ExportedProgram", args: tuple) -> Any:
    """``program``'s graph run eagerly on ``args``: its user outputs, flat (its weights
    passed as the inputs they are; ``program.module()`` would make guards for every input
    first: ~10 ms per layer)."""
    import torch.utils._pytree as pytree

    signature = program.graph_signature
    leaves = iter(pytree.tree_leaves((args, {})))
    weights = {**program.state_dict, **program.constants}
    inputs = [next(leaves) if spec.kind.name == "USER_INPUT" else weights[spec.target]
              for spec in signature.input_specs]
    outputs = program.graph_module(*inputs)
    return [value for value, spec in zip(outputs, signature.output_specs)
            if spec.kind.name == "USER_OUTPUT"]


def _check_program(model: "torch.nn.Module", program: "torch.export.ExportedProgram",
                   args: tuple, kwargs: dict) -> str | None:
    """A module's check (its layers called eagerly may take other paths than traced, such as
    a mask skipped outside a trace): the program, each layer a call of its kind's traced
    body, run eagerly on the example gives what the module gives."""
    import torch

    name = type(model).__name__

    def failed(e: BaseException) -> InputError:
        return InputError(f"{name}'s program with its layers traced once failed to run: "
                          f"{type(e).__name__}: {first_line(e)}")

    with library_call("torch", f"running {name}", failed), torch.no_grad():
        whole = model(*args, **kwargs)
        through = program.module()(*args, **kwargs)
    if not _all_close(whole, through):
        return "the program with each layer traced once does not give the module's outputs"
    return None


def _all_close(a: Any, b: Any) -> bool:
    """Whether two outputs (nested tuples and lists of tensors) are equal within float
    rounding."""
    import torch
    import torch.utils._pytree as pytree

    left, right = pytree.tree_leaves(a), pytree.tree_leaves(b)
    return len(left) == len(right) and all(
        not isinstance(x, torch.Tensor) or (isinstance(y, torch.Tensor) and _close(x, y))
        for x, y in zip(left, right))


def _close(a: "torch.Tensor", b: "torch.Tensor") -> bool:
    """``a`` and ``b`` of one shape and equal within float rounding (``torch.equal`` first:
    13x faster than ``allclose`` on bf16, and the eager layer and its body often agree bit
    for bit)."""
    import torch

    return a.shape == b.shape and (torch.equal(a, b)
                                   or torch.allclose(a, b, rtol=1e-4, atol=1e-5))


def _bodies(program: "torch.export.ExportedProgram") -> dict[str, "torch.fx.GraphModule"]:
    """The program's ``invoke_subgraph`` bodies by identifier."""
    import torch

    hop = torch.ops.higher_order.invoke_subgraph
    gm = program.graph_module
    return {node.args[1]: gm.get_submodule(node.args[0].target)
            for node in gm.graph.find_nodes(op="call_function", target=hop)}


def _same(body: "torch.fx.GraphModule", operands: tuple, outputs: tuple) -> bool:
    try:
        got = body(*operands)
    except RuntimeError:  # a body traced for other sizes: torch's shape check refuses them
        return False
    return len(got) == len(outputs) and all(_close(a, b) for a, b in zip(got, outputs))


def _randomized(example: tuple) -> tuple:
    """``example`` (``input_ids``, ``attention_mask``, ``position_ids``, the cache...) cut to
    its first row, its floating-point tensors (the cache) random normal, and
    its first slot masked: the mask is a tensor in eager as it is in the trace (transformers
    skips an all-ones mask when not tracing)."""
    import torch
    import torch.utils._pytree as pytree

    generator = torch.Generator().manual_seed(0)

    def cut(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        t = t[:1]
        return torch.randn(t.shape, generator=generator, dtype=t.dtype) \
            if t.is_floating_point() else t.clone()

    ids, mask, *rest = pytree.tree_map(cut, example)
    mask[0, 0] = 0
    return (ids, mask, *rest)
