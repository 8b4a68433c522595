"""Where each group's submodule lives, and which attributes it may hold itself.

Attribute names mirror the original model, so ``state_dict()`` keys stay the same:

* a module group sits under its parent at the path relative to the parent's module path
  (``h.0`` in the root, ``attn`` in ``h.0``; dotted paths go through plain container
  modules). Its attributes keep their original relative names (``c_attn.weight``). Such a
  group is *natural*: its absolute location is its module path;
* the second and later calls of one module are distinct submodules named
  ``<name>_call<N>`` for the call ``<path>@N`` (``shared_call1``, dots become ``_``); they
  are not natural: the module's parameters live once, in the natural submodule, and reach
  these calls as inputs. Inside them, submodules take their relative name (``lin``);
* a split component is named after its tag value (``encode``, ``A_1``) and is a namespace of
  its own, like ``split_by_tags``: it holds the attributes it uses under their full names
  (``encode.enc.lin.weight``).

Names that would clash get a ``_<k>`` suffix.
"""

from __future__ import annotations

from attrs import frozen

from rewrite.backends.fx.hierarchy import Hierarchy
from rewrite.backends.fx.names import identifier


@frozen
class Layout:
    location: tuple[str, ...]
    """Attribute path of each group's submodule in its parent's (``""`` for the root)."""
    namespace: tuple[str | None, ...]
    """The original module path a group's submodule stands for (``""``: the model root), or
    None when its attributes cannot be named after the original model."""

    def owns(self, hierarchy: Hierarchy, gid: int, fqn: str) -> bool:
        """Whether group ``gid`` reads attribute ``fqn`` itself (else it gets it as an input)."""
        ns = self.namespace[gid]
        if ns is None or hierarchy.leaf[gid] is not None:
            return False
        return ns == "" or fqn.startswith(ns + ".")

    def relative(self, gid: int, fqn: str) -> str:
        """The name of attribute ``fqn`` inside group ``gid`` (which owns it)."""
        ns = self.namespace[gid]
        return fqn if not ns else fqn[len(ns) + 1 :]


def _under(path: str, base: str) -> str | None:
    if base == "":
        return path
    if path.startswith(base + "."):
        return path[len(base) + 1 :]
    return None


def natural_layout(h: Hierarchy) -> tuple[list[str | None], list[str | None]]:
    """First pass: natural locations and namespaces; others are left None (named later)."""
    location: list[str | None] = [None] * len(h)
    namespace: list[str | None] = [None] * len(h)
    location[0], namespace[0] = "", ""
    for gid in range(len(h)):  # pre-order: parents first
        taken = _Taken()
        for child in h.children[gid]:
            group = h.groups[child]
            if group.kind == "component":
                namespace[child] = ""
                continue
            ns = namespace[gid]
            name = _under(h.prefix[child], ns) if ns is not None else None
            if name and taken.free(name):
                taken.add(name)
                location[child] = name
                namespace[child] = h.prefix[child]
    return location, namespace


class _Taken:
    """Dotted names in use under one parent, and the containers they pass through."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.containers: set[str] = set()

    def free(self, name: str) -> bool:
        """Not taken, not a container of a taken name, and not inside a taken name."""
        if name in self.names or name in self.containers:
            return False
        parts = name.split(".")
        return not any(".".join(parts[:i]) in self.names for i in range(1, len(parts)))

    def add(self, name: str) -> None:
        self.names.add(name)
        parts = name.split(".")
        self.containers.update(".".join(parts[:i]) for i in range(1, len(parts)))


def finish_layout(
    h: Hierarchy,
    location: list[str | None],
    namespace: list[str | None],
    reserved: list[set[str]],
) -> Layout:
    """Second pass: name components and repeated calls, away from ``reserved`` first segments."""
    for gid in range(len(h)):
        used = {loc.split(".", 1)[0] for c in h.children[gid] if (loc := location[c])}
        used |= reserved[gid]
        for child in h.children[gid]:
            if location[child] is not None:
                continue
            group = h.groups[child]
            if group.kind == "component":
                name = identifier(group.function_name or group.key)
            else:
                ns_parent = h.prefix[gid] if h.groups[gid].kind == "module" else ""
                rel = _under(h.prefix[child], ns_parent) or h.prefix[child]
                name = identifier(rel.replace(".", "_"))
                index = group.call.index if group.call is not None else 0
                if index and (namespace[gid] is not None or name in used):
                    name = f"{name}_call{index}"
            base, k = name, 0
            while name in used:
                k += 1
                name = f"{base}_{k}"
            used.add(name)
            location[child] = name
    return Layout(tuple(loc or "" for loc in location), tuple(namespace))
