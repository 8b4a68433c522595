"""``node.meta["nn_module_stack"]`` -> stack ids of a :class:`~rewrite.ir.stacks.StackTreeBuilder`.

A stack dict is ``{key: (path, cls)}`` (``torch.export``, ``symbolic_trace``; ``cls`` a type,
or a string in a loaded ``.pt2``; a key ``path@N`` is the (N+1)-th call of the module) or
``{path: cls}`` (older tracers: no call indices, :attr:`NnModuleStacks.legacy`). The root
entry (path ``""``) is no call: its class is the graph's root class. The entry
``_empty_nn_module_stack_from_metadata_hook`` adds nothing. A path torch left as dynamo wrote
it (``L['args'][0].model.layers[0]``: torch 2.9's strict export of a module whose ``forward``
a decorator calls with ``self`` as an argument) is read as torch writes the others
(``model.layers.0``): :func:`dynamo_path`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from rewrite.ir import ModuleCall
from rewrite.ir.stacks import EMPTY, UNKNOWN, StackTreeBuilder

EMPTY_STACK_KEY = "_empty_nn_module_stack_from_metadata_hook"
STACK = "nn_module_stack"


def class_name(cls: Any) -> str:
    """Qualified name of a class given as a type or a string (``"<class 'a.B'>"`` too)."""
    if isinstance(cls, type):
        return f"{cls.__module__}.{cls.__qualname__}"
    text = str(cls)
    if text.startswith("<class '") and text.endswith("'>"):
        return text[len("<class '") : -2]
    return text


_split_key = ModuleCall.split_key

_DYNAMO_ROOT = re.compile(r"L\[['\"](?:self|args)['\"]\](?:\[0\])?")
_DYNAMO_PART = re.compile(r"\.(\w+)|\[(\d+)\]|\[['\"]([^'\"]*)['\"]\]"
                          r"|(\[slice\((?:None|0), \w+, (?:None|1)\)\])")


def dynamo_path(path: str) -> str:
    """``model.layers.0`` for dynamo's ``L['self'].model.layers[0]`` or
    ``L['args'][0].model.layers[slice(None, 2, None)]._modules['0']`` (as torch's
    ``_normalize_nn_module_stack`` reads them; a slice from the start keeps the indices of
    a ``ModuleList``); any other text as it is."""
    root = _DYNAMO_ROOT.match(path)
    if root is None:
        return path
    parts, at = [], root.end()
    while at < len(path):
        part = _DYNAMO_PART.match(path, at)
        if part is None:
            return path
        name = next(g for g in part.groups() if g is not None)
        if name != "_modules" and part.group(4) is None:  # a prefix slice keeps the indices
            parts.append(name)
        at = part.end()
    return ".".join(parts)


class NnModuleStacks:
    """Parses ``nn_module_stack`` dicts into :attr:`tree`, once per distinct tuple of keys.

    A stack is read from the stack of its keys but the last (memoized too), so the work is
    one dictionary lookup and one call per distinct stack.
    """

    def __init__(self) -> None:
        self.tree = StackTreeBuilder()
        self._ids: dict[tuple, int] = {(): UNKNOWN}  # tuple of keys -> stack id
        self._classes: dict[Any, str] = {}
        self.root_class: str | None = None
        self.saw_root = False
        """Whether some stack had the root entry (``torch.export`` writes it everywhere)."""
        self.legacy = False
        """Whether some entry had the ``{path: cls}`` form (no call indices)."""

    def read_all(self, distinct: Mapping[tuple, Mapping]) -> dict[tuple, int]:
        """The stack id of each tuple of keys (``distinct``: keys -> a meta dict whose
        ``nn_module_stack`` has these keys), numbered in the order of ``distinct``."""
        ids = self._ids
        read = self._read
        for keys, meta in distinct.items():
            if keys not in ids:  # else: parsed already, as the parent of another stack
                read(meta[STACK], keys)
        return ids

    def _read(self, raw: Mapping, keys: tuple) -> int:
        """The stack of ``keys``, from the stack of ``keys[:-1]``.

        Hot: one call per distinct stack. The usual entry (``key: (path, cls)`` with a known
        class) is read here; everything else goes through :meth:`_read_entry`."""
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
        if (type(path) is not str or not path or cls_name is None or last == EMPTY_STACK_KEY
                or path[:2] == "L["):
            return self._read_entry(raw, keys, parent)
        number = _split_key(last)[1]
        tree = self.tree
        call = tree.call(path, cls_name, int(number) if number is not None else 0)
        found = ids[keys] = tree.child(parent, call)
        return found

    def _read_entry(self, raw: Mapping, keys: tuple, parent: int) -> int:
        """The stack of ``keys`` (any form), given the id of the stack of ``keys[:-1]``."""
        ids = self._ids
        last = keys[-1]
        if last == EMPTY_STACK_KEY:
            ids[keys] = parent
            return parent
        call = self._call(last, raw[last])
        if call is None:  # the root entry
            found = parent if parent != UNKNOWN else EMPTY
        else:
            found = self.tree.child(parent, call)
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

    def _call(self, key: Any, value: Any) -> int | None:
        """The call id of one entry (None: the root entry)."""
        key = key if type(key) is str else str(key)
        head, number = _split_key(key)
        if type(value) is tuple and len(value) == 2:
            path, cls = value
            if type(path) is not str:
                path = str(path)
            elif path[:2] == "L[":
                path = dynamo_path(path)
        else:  # {path: cls}
            self.legacy = True
            path, cls = head, value
        if path == "":
            self.saw_root = True
            if self.root_class is None:
                self.root_class = self._class(cls)
            return None
        return self.tree.call(path, self._class(cls), int(number) if number is not None else 0)
