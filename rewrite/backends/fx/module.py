"""The GraphModule class of lowered modules, and their readable code.

:class:`LoweredModule` is a ``torch.fx.GraphModule`` (a lazily compiled one, see
:mod:`rewrite.backends.fx.compile`) whose ``print_readable`` also shows submodules that sit
under plain container modules (the ``h.0`` of a ``ModuleList``), which
``GraphModule.print_readable`` skips. Nested classes are named after the attribute path
(``h_0``) and preceded by a comment naming the module call and the rule that made it.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from rewrite._private.torch_programs import LazyGraphModule
from rewrite.backends.fx.names import identifier

META_KEY = "rewrite"
"""``gm.meta["rewrite"]``: ``{"group", "kind", "class", "rule"}`` of the group a module is."""


class LoweredModule(LazyGraphModule):
    """A GraphModule made by ``rewrite`` from one group (or the root) of a group tree."""

    def print_readable(  # type: ignore[override]
        self,
        print_output: bool = True,
        include_stride: bool = False,
        include_device: bool = False,
        colored: bool = False,
        *,
        fast_sympy_print: bool = False,
        expanded_def: bool = False,
        additional_meta: list[str] | None = None,
    ) -> str:
        """Code of this module and every GraphModule below it, like the original model."""
        text = readable_code(
            self,
            self._get_name(),
            include_stride=include_stride,
            include_device=include_device,
            colored=colored,
            expanded_def=expanded_def,
            additional_meta=additional_meta,
        )
        if print_output:
            print(text)
        return text


def new_module(class_name: str, meta: dict[str, Any]) -> LoweredModule:
    """An empty lowered module; register children and attributes, then set its graph."""
    module = LoweredModule({}, torch.fx.Graph(), class_name)
    module.meta.update(meta)
    return module


def graph_children(module: torch.nn.Module,
                   prefix: str = "") -> Iterator[tuple[str, torch.fx.GraphModule]]:
    """GraphModules below ``module``, looking through plain containers (``h`` -> ``h_0``)."""
    for name, child in module.named_children():
        path = f"{prefix}_{name}" if prefix else name
        if isinstance(child, torch.fx.GraphModule):
            yield identifier(path), child
        elif type(child) is torch.nn.Module:
            yield from graph_children(child, path)


def _indent(text: str) -> str:
    lines = text.split("\n")
    return "\n".join([lines[0]] + [("    " + line) if line.strip() else line for line in lines[1:]])


def readable_code(module: torch.fx.GraphModule, name: str, **options: Any) -> str:
    """``print_readable`` text of ``module`` and its GraphModule descendants."""
    # options left unset are not passed (torch 2.9's python_code has no additional_meta)
    options = {key: value for key, value in options.items() if value is not None}
    code = module.graph.python_code(root_module="self", verbose=True, **options).src.lstrip("\n")
    info = module.meta.get(META_KEY) if isinstance(getattr(module, "meta", None), dict) else None
    header = ""
    if info and info.get("kind") != "root":
        what = info.get("class") or info.get("kind")
        header = (f"# {info['group']}: {what}"
                  + (f" (rule {info['rule']})" if info.get("rule") else "") + "\n")
    text = _indent(f"class {name}(torch.nn.Module):\n" + code)
    parts = [""]
    for child_name, child in graph_children(module):
        parts.append(readable_code(child, child_name, **options))
    return header + text + _indent("\n".join(parts))
