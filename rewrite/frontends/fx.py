"""FX frontend: ``torch.fx`` graphs (``GraphModule``, ``ExportedProgram``) -> :class:`Graph`.

Module stacks come from ``node.meta["nn_module_stack"]``, in either form:

* ``{key: (path, cls)}`` from ``torch.export`` and ``torch.fx.symbolic_trace``; ``cls`` is a
  type, or a string in a loaded ``.pt2``. A key ending in ``@N`` marks the (N+1)-th call of
  the module at ``path``: a shared module called twice gives two :class:`ModuleCall`\\ s;
* ``{path: cls}`` from older tracers. It has no call indices, so calls are recovered from the
  order of the nodes (:func:`rewrite.frontends.calls.split_runs`): a path whose nodes form
  separate runs is one call per run.

The root entry of exported programs (path ``""``) is dropped; its class is the graph's
``root_class``. Which nodes have no stack, and where they go:

* graph inputs and outputs (``placeholder``, ``output``) are always at the top level;
* in exported programs every traced node has a stack (the root entry at least), so a node
  without one, or with only ``_empty_nn_module_stack_from_metadata_hook``, was made by a
  pass: its stack is unknown (``None``) and grouping places it with its users;
* a higher-order op region (a ``torch.no_grad()`` block...) that a strict export recorded at
  the root takes the stack its body's nodes agree on (:mod:`rewrite.frontends.regions`);
* ``symbolic_trace`` records no root entry: its nodes without a stack were traced in the root
  module's own ``forward``, so ``call_function``/``call_method``/``call_module`` nodes get
  the empty stack (top level). ``get_attr`` nodes stay unknown and go with their users.

Tags come from ``node.meta["custom"]`` (``torch.fx.traceback.annotate``; keys starting with
``_`` are torch's own and skipped) and from ``node.tag`` (as tag ``tag``).

The frontend also fills the graph's :class:`~rewrite.ir.columns.Columns` as it reads, with
one dictionary lookup per node for its stack, target and tags (each distinct value is parsed
once) and the garbage collector paused.
"""

from __future__ import annotations

from itertools import chain, islice
from operator import ne
from typing import Any, Mapping

import numpy as np
import torch

from rewrite._gc import gc_paused
from rewrite._torch_private import is_op_overload
from rewrite.frontends.calls import distinct_calls, split_runs
from rewrite.frontends.regions import region_stacks
from rewrite.ir import Graph, ModuleCall, Node, Stack
from rewrite.ir.columns import (EMPTY_TAGS, CallColumns, StackInterner, StackSequence, TagSets,
                                build_columns, call_columns_of)
from rewrite.ir.nodes import LazyNodes

EMPTY_STACK_KEY = "_empty_nn_module_stack_from_metadata_hook"
_STACK = "nn_module_stack"
_IO_OPS = frozenset(("placeholder", "output"))
_ROOT_LEVEL_OPS = frozenset(("call_function", "call_method", "call_module"))
_EMPTY: Stack = ()


def class_name(cls: Any) -> str:
    """Qualified name of a class given as a type or a string (``"<class 'a.B'>"`` too)."""
    if isinstance(cls, type):
        return f"{cls.__module__}.{cls.__qualname__}"
    text = str(cls)
    if text.startswith("<class '") and text.endswith("'>"):
        return text[len("<class '") : -2]
    return text


def _readonly(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _target_text(target: Any) -> str:
    if isinstance(target, str):
        return target
    if is_op_overload(target):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    return f"{module}.{name}" if module else name


class _StackReader:
    """Parses ``nn_module_stack`` dicts into interned stacks, once per distinct tuple of keys.

    :meth:`read_all` gives each distinct tuple of keys the id of its stack; equal stacks
    share one id and one tuple, every call is one :class:`ModuleCall` object, numbered in
    order of first appearance (outer calls first), and each stack is also known by its call
    numbers (:attr:`calls`) and its parent stack (:attr:`parents`). The reader is its own
    stack table (``stacks``, ``calls``, ``parents``, ``lasts``, ``depths``, as
    :class:`StackInterner`), with the tuples made on demand.
    """

    def __init__(self) -> None:
        # the stacks as a tree: per stack its parent stack, last call number and depth; the
        # tuples (stacks, calls) are made on demand (StackSequence)
        self.parents: list[int] = [-1, -1]
        self._lasts: list[int] = [-1, -1]
        self._depths: list[int] = [0, -1]
        self._by_pair: dict[int, int] | None = None  # (parent, last call) -> stack id
        self.empty, self.unknown = 0, 1
        self._ids: dict[tuple, int] = {(): 1}  # tuple of keys -> stack id
        self._classes: dict[Any, str] = {}
        self._calls: dict[tuple[str, str, int], int] = {}  # (path, class, index) -> number
        self._call_list: list[ModuleCall] = []  # by number (no tuple per call to track)
        self._paths: dict[str, int] = {}  # distinct call paths, numbered
        self._path_id: list[int] = []  # per call number
        self.stacks = StackSequence(self.parents, self._lasts, self._depths, self._call_list)
        """Per stack id, its tuple of calls (None: unknown), made on first access."""
        self.calls = StackSequence(self.parents, self._lasts, self._depths)
        """Per stack id, its tuple of call numbers, made on first access."""
        self.root_class: str | None = None
        self.saw_root = False
        self.legacy = False
        """Whether some entry had the ``{path: cls}`` form (no call indices)."""

    @property
    def module_calls(self) -> tuple[ModuleCall, ...]:
        """Every call, in order of first appearance (outer calls before inner ones)."""
        return tuple(self._call_list)

    @property
    def lasts(self) -> list[int]:
        """Per stack, the number of its last call (-1: empty or unknown)."""
        return self._lasts

    @property
    def depths(self) -> list[int]:
        """Per stack, its number of calls (-1: unknown)."""
        return self._depths

    def _add(self, parent: int, number: int) -> int:
        """A new stack: stack ``parent`` plus call ``number``."""
        if parent == self.unknown:
            parent = self.empty
        found = len(self.parents)
        self.parents.append(parent)
        self._lasts.append(number)
        self._depths.append(self._depths[parent] + 1)
        if self._by_pair is not None:
            self._by_pair[parent << 32 | number] = found
        return found

    def _find(self, parent: int, number: int) -> int | None:
        """The stack ``parent`` plus call ``number``, if there is one."""
        if parent == self.unknown:
            parent = self.empty
        if self._by_pair is None:  # the uncommon case (another spelling of a call): index
            self._by_pair = {p << 32 | c: k for k, (p, c) in
                             enumerate(zip(self.parents, self._lasts)) if c >= 0}
        return self._by_pair.get(parent << 32 | number)

    def call_columns(self) -> CallColumns:
        """The calls (:attr:`module_calls`) as columns."""
        paths, classes, index = zip(*self._calls) if self._calls else ((), (), ())
        names = {name: i for i, name in enumerate(dict.fromkeys(classes))}
        class_id = np.fromiter(map(names.__getitem__, classes), dtype=np.int64,
                               count=len(classes))
        return CallColumns(paths, tuple(names), _readonly(class_id),
                           _readonly(np.array(index, dtype=np.int64)),
                           _readonly(np.array(self._path_id, dtype=np.int64)), self._paths)

    def read_all(self, distinct: Mapping[tuple, Mapping]) -> dict[tuple, int]:
        """The stack id of each tuple of keys (``distinct``: keys -> a meta dict whose
        ``nn_module_stack`` has these keys), numbered in the order of ``distinct``."""
        ids = self._ids
        read = self._read
        for keys, meta in distinct.items():
            if keys not in ids:  # else: parsed already, as the parent of another stack
                read(meta[_STACK], keys)
        return ids

    def _read(self, raw: Mapping, keys: tuple) -> int:
        """Parse the stack of ``keys`` from the stack of ``keys[:-1]`` (memoized too).

        Hot: one call per distinct stack. The usual case, a new call in the
        ``torch.export`` form (``key: (path, cls)``), is written out here; everything else
        goes through :meth:`_read_entry`."""
        ids = self._ids
        parent = ids.get(keys[:-1])  # () is the unknown stack
        if parent is None:
            parent = self._read(raw, keys[:-1])
        last = keys[-1]
        value = raw[last]
        if type(value) is not tuple or len(value) != 2 or type(last) is not str:
            return self._read_entry(raw, keys, parent)
        path, cls = value
        try:
            cls_name = self._classes.get(cls)
        except TypeError:  # unhashable
            cls_name = None
        if type(path) is not str or not path or cls_name is None or last == EMPTY_STACK_KEY:
            return self._read_entry(raw, keys, parent)
        at = last.rfind("@")
        index = int(last[at + 1:]) if at >= 0 and last[at + 1:].isdigit() else 0
        ident = (path, cls_name, index)
        known_calls = self._calls
        if ident in known_calls:  # another spelling of a known call
            return self._read_entry(raw, keys, parent)
        number = known_calls[ident] = len(known_calls)
        self._call_list.append(ModuleCall(path, cls_name, index))
        self._path_id.append(self._paths.setdefault(path, len(self._paths)))
        found = ids[keys] = self._add(parent, number)
        return found

    def _read_entry(self, raw: Mapping, keys: tuple, parent: int) -> int:
        """The stack of ``keys`` (any form), given the id of the stack of ``keys[:-1]``."""
        ids = self._ids
        last = keys[-1]
        if last == EMPTY_STACK_KEY:
            ids[keys] = parent
            return parent
        call, number, new = self._entry(last, raw[last])
        if call is None:  # the root entry
            found = parent if parent != 1 else 0
        else:
            # a new call is in no stack yet; a known one (another spelling) may be
            found = None if new else self._find(parent, number)
            if found is None:
                found = self._add(parent, number)
        ids[keys] = found
        return found

    def _class(self, cls: Any) -> str:
        try:
            name = self._classes.get(cls)
        except TypeError:  # unhashable
            return class_name(cls)
        if name is None:
            name = self._classes[cls] = class_name(cls)
        return name

    def _entry(self, key: Any, value: Any) -> tuple[ModuleCall | None, int, bool]:
        """The call of one entry, its number and whether it is new (None: the root entry)."""
        if type(value) is tuple and len(value) == 2:
            path, cls = value
            if type(path) is not str:
                path = str(path)
        else:  # {path: cls}
            self.legacy = True
            path, cls = str(key).rpartition("@")[0] or str(key), value
        if path == "":
            self.saw_root = True
            if self.root_class is None:
                self.root_class = self._class(cls)
            return None, -1, False
        if type(key) is not str:
            key = str(key)
        at = key.rfind("@")
        index = int(key[at + 1:]) if at >= 0 and key[at + 1:].isdigit() else 0
        cls_name = self._class(cls)
        known = self._calls.get((path, cls_name, index))
        if known is not None:  # two keys may name one call (another tracer's spelling)
            return self._call_list[known], known, False
        call = ModuleCall(path, cls_name, index)
        number = self._calls[(path, cls_name, index)] = len(self._calls)
        self._call_list.append(call)
        self._path_id.append(self._paths.setdefault(path, len(self._paths)))
        return call, number, True


def from_fx_graph(
    graph: torch.fx.Graph,
    *,
    source: Any = None,
    root_class: str | None = None,
    split_calls: bool | None = None,
) -> Graph:
    """Build the IR of an FX graph (its nodes are already in topological order).

    ``split_calls``: recover calls from runs of nodes (see the module docstring); default:
    only when the stacks have the ``{path: cls}`` form, which has no call indices.
    """
    with gc_paused():
        return _read(graph, source, root_class, split_calls)


def _read(graph: torch.fx.Graph, source: Any, root_class: str | None,
          split_calls: bool | None) -> Graph:
    # One column at a time: comprehensions and C-level map calls per node, Python work only
    # per distinct stack, target, tag set (per run of equal ones) and graph input.
    fx_nodes = list(graph.nodes)
    size = len(fx_nodes)
    ops = [n.op for n in fx_nodes]
    metas = [n.meta for n in fx_nodes]
    stacks = region_stacks(graph)  # regions a strict export put at the root
    if stacks:
        position = {node: i for i, node in enumerate(fx_nodes)}
        for node, stack in stacks.items():
            metas[position[node]] = {**node.meta, _STACK: stack}
    is_io = list(map(_IO_OPS.__contains__, ops))
    io = np.fromiter(is_io, dtype=bool, count=size)

    reader = _StackReader()
    # graph inputs and outputs are at the top level whatever their metadata says: not read
    keys = [tuple(r) if not x and (r := m.get(_STACK)) else None
            for m, x in zip(metas, is_io)]
    # neighbours mostly share their stack: look keys up once per run of equal ones
    change = np.fromiter(map(ne, islice(keys, 1, None), keys), dtype=bool,
                         count=max(size - 1, 0))
    starts = _run_starts(change, size)
    run_keys = list(map(keys.__getitem__, starts.tolist()))
    del keys
    distinct = dict(zip(run_keys, map(metas.__getitem__, starts.tolist())))  # first seen order
    distinct.pop(None, None)
    ids = reader.read_all(distinct)
    ids[None] = reader.unknown  # type: ignore[index]
    stack_id = _repeat_runs(np.fromiter(map(ids.__getitem__, run_keys), dtype=np.int32,
                                        count=len(run_keys)), starts, size)
    stack_id[io] = reader.empty
    del run_keys, distinct, ids

    targets, target_id = _target_ids(fx_nodes)
    tag_sets = TagSets()
    tags_id = _tag_ids(fx_nodes, metas, tag_sets)
    start, flat = _edges(fx_nodes)
    del metas

    table: Any = reader
    if not reader.saw_root and len(table.stacks) > 2:
        # symbolic_trace: a node traced in the root module's forward carries no stack
        root_ops = _ROOT_LEVEL_OPS
        at_root = np.fromiter(map(root_ops.__contains__, ops), dtype=bool, count=size)
        stack_id = np.where(at_root & (stack_id == reader.unknown), reader.empty,
                            stack_id).astype(np.int32)
    if reader.legacy if split_calls is None else split_calls:
        split = split_runs([None if x else table.stacks[k]
                            for x, k in zip(is_io, stack_id.tolist())])
        calls = distinct_calls(split)
        table, stack_id = _renumber(calls, split, is_io)
        call_columns = call_columns_of(calls)
    else:
        calls = reader.module_calls
        call_columns = reader.call_columns()

    columns = build_columns(table.stacks, stack_id, targets, target_id, tag_sets.values,
                            tags_id, io, start, flat, table.calls, table.parents,
                            stack_last=table.lasts, stack_depth=table.depths,
                            call_columns=call_columns)
    nodes = _lazy_nodes(fx_nodes, ops, targets, target_id, table.stacks, stack_id,
                        tag_sets.values, tags_id, is_io, flat, start)
    return Graph(nodes, calls, "fx", root_class or reader.root_class, source,
                 columns=columns)


def _renumber(calls: tuple[ModuleCall, ...], stacks: list[Stack | None], is_io: list[bool]
              ) -> tuple[StackInterner, list[int]]:
    """Intern split stacks (calls numbered as in ``calls``) and give each node its stack id."""
    number = {id(c): i for i, c in enumerate(calls)}
    table = StackInterner()
    empty = table.id((), ())
    table.id(None, None)
    out = []
    for io, stack in zip(is_io, stacks):
        if io or stack is None:
            out.append(empty if io else table.get(None))
            continue
        ids = tuple(number[id(c)] for c in stack)
        found = table.get(ids)
        if found is None:
            parent = table.get(ids[:-1])
            found = table.id(ids, stack, -1 if parent is None else parent)
        out.append(found)
    return table, out


def _target_ids(fx_nodes: list[torch.fx.Node]) -> tuple[list[str], np.ndarray]:
    """The distinct target texts (in order of first appearance) and each node's index in
    them. Each target object is read once, known by its identity (op overloads hash in
    Python); placeholders' targets are their names, already text."""
    raw = [n.target for n in fx_nodes]
    idents = list(map(id, raw))
    objects = dict(zip(idents, raw))
    texts = [t if type(t) is str else _target_text(t) for t in objects.values()]
    numbers: dict[str, int] = {}
    object_text = dict(zip(objects, [numbers.setdefault(t, len(numbers)) for t in texts]))
    target_id = np.fromiter(map(object_text.__getitem__, idents), dtype=np.int32,
                            count=len(raw))
    return list(numbers), target_id


def _tag_ids(fx_nodes: list[torch.fx.Node], metas: list[dict], tag_sets: TagSets
             ) -> np.ndarray:
    """Per node, the id of its tag set (``meta["custom"]`` and ``node.tag``).

    Neighbours usually carry equal tags: the tags are read once per run of equal ones."""
    size = len(fx_nodes)
    customs = [m.get("custom") for m in metas]
    tags = [getattr(n, "tag", None) for n in fx_nodes]
    no_tag = tags.count(None) == size
    if no_tag and not any(customs):
        return np.zeros(size, dtype=np.int32)
    try:
        change = np.fromiter(map(ne, customs[1:], customs), dtype=bool, count=size - 1)
        if not no_tag:
            change |= np.fromiter(map(ne, tags[1:], tags), dtype=bool, count=size - 1)
    except Exception:  # values that do not compare (tensors...): one node at a time
        return np.array([tag_sets.id(_tags(c, t)) for c, t in zip(customs, tags)],
                        dtype=np.int32).reshape(size)
    starts = _run_starts(change, size)
    known: dict[Any, int] = {}
    run_ids = []
    for i in starts.tolist():
        custom, tag = customs[i], tags[i]
        try:
            key = (tuple(custom.items()) if type(custom) is dict else None, tag)
            found = known.get(key)
            if found is None:
                found = known[key] = tag_sets.id(_tags(custom, tag))
        except TypeError:  # unhashable values
            found = tag_sets.id(_tags(custom, tag))
        run_ids.append(found)
    return _repeat_runs(np.array(run_ids, dtype=np.int32), starts, size)


def _run_starts(change: np.ndarray, size: int) -> np.ndarray:
    """The first index of each run of ``size`` items; ``change[i]``: item ``i + 1`` differs
    from item ``i``."""
    if not size:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(change)
    starts += 1
    return np.concatenate((np.zeros(1, dtype=starts.dtype), starts))


def _repeat_runs(run_values: np.ndarray, starts: np.ndarray, size: int) -> np.ndarray:
    """Per item, the value of its run."""
    return np.repeat(run_values, np.diff(starts, append=size))


def _tags(custom: Any, tag: Any) -> dict[str, str]:
    tags: dict[str, str] = {}
    if isinstance(custom, dict):
        for name, value in custom.items():
            if not str(name).startswith("_"):  # torch's own bookkeeping, not user tags
                tags[str(name)] = str(value)
    if tag is not None:
        tags.setdefault("tag", str(tag))
    return tags


def _edges(fx_nodes: list[torch.fx.Node]) -> tuple[np.ndarray, np.ndarray]:
    """The input edges as CSR arrays: node ``i`` reads ``flat[start[i]:start[i + 1]]``.

    Inputs are found by identity in a sorted array of the nodes' ids (no dict of the
    nodes: a million-entry hash table is slower to build and to probe than a sort)."""
    size = len(fx_nodes)
    if size and not hasattr(fx_nodes[0], "_input_nodes"):  # pragma: no cover - other torch
        inputs: list = [n.all_input_nodes for n in fx_nodes]
    else:
        inputs = [n._input_nodes for n in fx_nodes]
    start = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, inputs), dtype=np.int64, count=size), out=start[1:])
    total = int(start[-1])
    node_ids = np.fromiter(map(id, fx_nodes), dtype=np.uint64, count=size)
    order = np.argsort(node_ids, kind="stable")  # nodes are mostly allocated in order
    sorted_ids = node_ids[order]
    wanted = np.fromiter(map(id, chain.from_iterable(inputs)), dtype=np.uint64, count=total)
    at = np.searchsorted(sorted_ids, wanted)
    if total and (int(at.max()) >= size or not np.array_equal(sorted_ids[at], wanted)):
        members = set(fx_nodes)
        bad = next(x for ins in inputs for x in ins if x not in members)
        raise KeyError(f"node {bad} is an input of this graph but not one of its nodes")
    return start, order[at]


def _lazy_nodes(fx_nodes, ops, target_text, target_id, table, stack_id, tag_values, tags_id,
                is_io, flat, start: np.ndarray) -> LazyNodes:
    """``Graph.nodes``: each :class:`Node` built from the columns on first access.

    The FX nodes are kept in an object array: the cyclic garbage collector does not scan
    arrays, and a list of a million nodes would be scanned at every collection of the
    generation it is in (the graph keeps the nodes alive anyway)."""
    fx_nodes = np.fromiter(fx_nodes, dtype=object, count=len(fx_nodes))
    lists: list[list] = []

    def columns() -> list[list]:
        if not lists:
            lists.extend(np.asarray(c).tolist()
                         for c in (target_id, stack_id, tags_id, start, flat))
        return lists

    def make(i: int) -> Node:
        targets, stacks, tags, bounds, inputs = columns()
        fx_node = fx_nodes[i]
        return Node(i, fx_node.name, ops[i], target_text[targets[i]],
                    tuple(inputs[bounds[i]:bounds[i + 1]]), table[stacks[i]],
                    tag_values[tags[i]], is_io[i], fx_node)

    def make_all() -> list[Node]:
        targets, stacks, tags, bounds, inputs = columns()
        with gc_paused():
            every = list(table)  # each stack's tuple made once
            return [
                Node(i, n.name, op, target_text[t], tuple(inputs[a:b]), every[k],
                     tag_values[g], io, n)
                for i, (n, op, t, k, g, io, a, b) in enumerate(
                    zip(fx_nodes, ops, targets, stacks, tags, is_io, bounds, bounds[1:])
                )
            ]

    return LazyNodes(len(fx_nodes), make, make_all)


def from_graph_module(gm: torch.fx.GraphModule, *, source: Any = None,
                      split_calls: bool | None = None) -> Graph:
    """Build the IR of a GraphModule (``symbolic_trace``, ``ExportedProgram.module()``...)."""
    root_class = None
    if type(gm).__name__ != "GraphModule":
        root_class = class_name(type(gm))
    graph = from_fx_graph(gm.graph, source=source if source is not None else gm,
                          split_calls=split_calls)
    if graph.root_class is None and root_class is not None:
        from attrs import evolve

        graph = evolve(graph, root_class=root_class, columns=graph.columns)
    return graph


def from_exported_program(program: torch.export.ExportedProgram) -> Graph:
    """Build the IR of an exported program's graph (parameters are placeholders)."""
    return from_fx_graph(program.graph_module.graph, source=program)


__all__ = ["EMPTY_TAGS", "class_name", "from_exported_program", "from_fx_graph",
           "from_graph_module", "gc_paused"]
