"""``rewrite suggest``: a starter rules file for a model.

:func:`suggest` reads the model's module calls (with the grouping stage's measures: sizes),
chooses what to group (:mod:`choose`), estimates the distinct bodies of each block class
(:mod:`bodies`) and returns a :class:`Suggestion`; :func:`render` writes it as rules text.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from rewrite.compile import RuleSet
from rewrite.grouping import group_graph
from rewrite.suggest.bodies import body_keys
from rewrite.ir import Graph, ModuleCall
from rewrite.ir.model import NODE_NAMES
from rewrite.suggest.choose import (
    PATHS,
    CallInfo,
    Plan,
    call_infos,
    class_key,
    plan,
    weighted_calls,
)
from rewrite.suggest.model import Line, Section, Suggestion, pattern, render


def suggest(model: Any, name: str | None = None, *, trust_model: bool = False) -> Suggestion:
    """A starter rules file for ``model`` (what :func:`rewrite.apply` accepts), as data;
    ``name`` is how the header names the model (default: the path, or its class)."""
    from rewrite.frontends import load_graph

    graph = load_graph(model, trust_model=trust_model)
    tree = group_graph(RuleSet(()), graph)  # no groups: the calls and their measures
    infos = call_infos(tree)
    chosen = plan(infos, weighted_calls(graph))
    root = (graph.root_class or "model").rsplit(".", 1)[-1]
    summary = f"{root}: {len(graph.nodes)} nodes, {len(graph.calls)} module calls"
    if graph.structure == NODE_NAMES:
        summary += ", from node names"
    label = name or (str(model) if isinstance(model, (str, Path)) else root)
    return Suggestion(label, summary, _sections(graph, infos, chosen), tree.warnings)


def _sections(graph: Graph, infos: dict[ModuleCall, CallInfo], chosen: Plan
              ) -> tuple[Section, ...]:
    short = Counter(_short(cls) for cls in chosen.calls)
    keys = body_keys(graph, [c for c in infos if class_key(c) in set(chosen.blocks)])
    distinct: dict[str, set] = {}
    for call, key in keys.items():
        distinct.setdefault(class_key(call), set()).add(key)
    bodies = {cls: len(found) for cls, found in distinct.items()}

    def by_class(cls: str) -> str:
        if cls.startswith(PATHS):  # no class: its paths (indices as *)
            return f"path {cls[len(PATHS):]}"
        simple = cls.rsplit(".", 1)[-1]
        return f"class {pattern(simple if short[simple] == 1 else cls)}"

    def plural(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    blocks = []
    for cls in chosen.blocks:
        n = bodies.get(cls, 0)
        comment = (f"{plural(chosen.calls[cls], 'call')}, {n} distinct "
                   f"{'body' if n == 1 else 'bodies'}")
        if cls in chosen.inside:
            comment += f", inside {_short(chosen.inside[cls])}"
        blocks.append(Line("group", by_class(cls), comment))
    shared = Counter(class_key(c) for c in chosen.singles)
    paths = Counter(c.path for c in infos)
    singles = [
        Line("group", f"path {pattern(c.path)}", f"{c.class_name}, {plural(paths[c.path], 'call')}",
             "{class}_{name}" if shared[class_key(c)] > 1 else None)
        for c in chosen.singles if c.index == 0
    ]
    dropout = [Line("flat", by_class(cls), plural(chosen.calls[cls], "call"))
               for cls in chosen.dropout]
    return (Section("repeated blocks, outermost first, with the blocks repeated inside them",
                    tuple(blocks)),
            Section("top-level modules with weights: embeddings, head, final norm",
                    tuple(singles)),
            Section("dropout stays inline", tuple(dropout)))


def _short(key: str) -> str:
    """A block's class without its module, or its path pattern."""
    return key[len(PATHS):] if key.startswith(PATHS) else key.rsplit(".", 1)[-1]


__all__ = ["Line", "Section", "Suggestion", "render", "suggest"]
