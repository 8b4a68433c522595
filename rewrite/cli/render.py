"""Terminal rendering of group trees and diagnostics (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.tree import Tree

from rewrite.grouping import Group, GroupTree


def _label(group: Group, calls: dict[tuple[str, str], int] | None) -> str:
    parts = [f"[bold]{group.key}[/bold]"]
    if group.kind == "component":
        parts.append(f"[magenta]component[/magenta] {group.tag_value!r}")
    elif group.call is not None:
        parts.append(f"[cyan]{group.call.class_name}[/cyan]")
    parts.append(f"{group.size} nodes")
    function = f"{group.domain}::{group.function_name}" if group.domain else group.function_name
    if calls is not None:
        count = calls.get((group.domain, group.function_name))
        function += f" x{count}" if count else ""
    parts.append(f"[green]-> {function}[/green]")
    if group.origin:
        parts.append(f"[dim]{group.origin}[/dim]")
    return "  ".join(parts)


def render_tree(tree: GroupTree, *, title: str, calls: dict | None = None) -> Tree:
    graph = tree.graph
    root = Tree(
        f"[bold]{title}[/bold]  {len(graph.nodes)} nodes, {len(graph.calls)} module calls, "
        f"{len(tree.root.nodes)} at top level"
    )

    def add(parent: Tree, group: Group) -> None:
        branch = parent.add(_label(group, calls))
        for child in group.children:
            add(branch, child)

    for child in tree.root.children:
        add(root, child)
    return root


def print_tree(console: Console, tree: GroupTree, *, title: str) -> None:
    console.print(render_tree(tree, title=title))
