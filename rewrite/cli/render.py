"""The group tree as a rich table: one row per group, tree guides in the first column.

Columns: the group (its module call key, ``h.0.attn`` / ``shared@1``, or split component), the
module class, the node count (with descendants), the function it becomes, and the rule that
made it (``file:line``). After the table, one line per group that ``on cycle flatten``
dissolved. Before lowering, the function is the name the rule's templates give;
``calls=`` (filled from the ONNX backend's outlining: ``explain --onnx``, ``apply -v``) replaces
it with the function actually made and its call count (identical bodies share one function).
With ``measures`` (``explain -v``), four more columns show what the ``size``, ``depth``,
``repeats`` and ``call`` selectors compare for each module group.
On a terminal too narrow for the table, the same rows print as a rich tree whose labels wrap.
:func:`function_tree` draws an ONNX model's functions and who calls whom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

from attrs import frozen
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from rewrite.grouping import Group, GroupTree
from rewrite.grouping.cycles import Flattened
from rewrite.ir import Graph
from rewrite.ir.model import NODE_NAMES

if TYPE_CHECKING:
    import onnx_ir as ir

    from rewrite.backends.onnx.distinct import Variant


@frozen
class FunctionUse:
    """The ONNX function a group became, and how many call sites the function has."""

    label: str
    """``domain::name`` (``:overload`` when there is one)."""
    calls: int


Calls = Mapping[str, "FunctionUse | None"]
"""Group id -> the function it became, or None when it was left inline."""


def _rows(group: Group, parent: Group, guide: str, last: bool, depth: int,
          max_depth: int | None) -> Iterator[tuple[Group, Group, str, int]]:
    """(group, its parent, tree-guide prefix, hidden descendants) for ``group`` and what it
    shows below."""
    prefix = "" if depth == 0 else guide + ("└── " if last else "├── ")
    hidden = 0
    if max_depth is not None and depth + 1 >= max_depth:
        hidden = sum(1 for _ in group.walk()) - 1
    yield group, parent, prefix, hidden
    if hidden:
        return
    below = "" if depth == 0 else guide + ("    " if last else "│   ")
    for i, child in enumerate(group.children):
        yield from _rows(child, group, below, i == len(group.children) - 1, depth + 1,
                         max_depth)


def _class_cell(group: Group, qualified: bool) -> Text:
    if group.kind == "component":
        return Text(f"split {group.tag_value!r}", style="magenta")
    if group.call is None:
        return Text("")
    return Text(group.call.cls if qualified else group.call.class_name, style="cyan")


def _function_cell(group: Group, calls: Calls | None) -> Text:
    if calls is None:
        name = f"{group.domain}::{group.function_name}" if group.domain else group.function_name
        return Text(name, style="green")
    if group.id not in calls:
        return Text("(not in the ONNX graph)", style="dim")
    use = calls[group.id]
    if use is None:
        return Text("(inlined)", style="dim")
    return Text.assemble((use.label, "green"), f" x{use.calls}")


MEASURES = ("size", "depth", "repeats", "call")


def _measure_cells(tree: GroupTree, group: Group) -> list[str]:
    found = tree.measures(group)
    if found is None:
        return [""] * len(MEASURES)
    return [str(v) for v in found.as_dict().values()]


def render_tree(tree: GroupTree, *, calls: Calls | None = None, max_depth: int | None = None,
                qualified: bool = False, measures: bool = False) -> Table:
    """The group tree as a table; ``max_depth`` hides deeper groups (counted in the row)."""
    graph = tree.graph
    groups = list(tree.groups())
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    table.add_column("group", no_wrap=True)
    table.add_column("class", no_wrap=True)
    table.add_column("nodes", justify="right", no_wrap=True)
    for name in MEASURES if measures else ():
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("function" + (" (ONNX) x call sites" if calls is not None else ""),
                     no_wrap=True)
    table.add_column("rule", style="dim", no_wrap=True)
    origin = _origins(groups)
    top = tree.root.children
    for i, child in enumerate(top):
        for group, _, prefix, hidden in _rows(child, tree.root, "", i == len(top) - 1, 0,
                                              max_depth):
            key = Text(prefix, style="dim") + Text(group.key, style="bold" if not prefix else "")
            if hidden:
                key += Text(f" (+{hidden} nested)", style="dim")
            extra = _measure_cells(tree, group) if measures else []
            table.add_row(key, _class_cell(group, qualified), str(group.size), *extra,
                          _function_cell(group, calls), origin.get(group.index, ""))
    if not groups:
        table.add_row(Text("(no groups)", style="dim"), "", str(len(graph.nodes)),
                      *([""] * len(MEASURES) if measures else []), "", "")
    return table


def _origins(groups: list[Group]) -> dict[int, str]:
    """Group id -> ``file:line`` of its rule, with the file's base name when that is unique."""
    def base(origin: str) -> str:
        return origin.replace("\\", "/").rsplit("/", 1)[-1]

    files = {g.origin.rsplit(":", 1)[0] for g in groups if g.origin}
    short = len({base(f) for f in files}) == len(files)
    return {g.index: base(g.origin) if short else g.origin for g in groups if g.origin}


def _caption(tree: GroupTree, groups: list[Group], calls: Calls | None) -> str:
    graph = tree.graph
    if calls is not None:
        made = {u.label for u in calls.values() if u is not None}
        functions = f"{len(made)} ONNX functions"
    else:
        functions = f"{len({(g.domain, g.function_name) for g in groups})} function names"
    work = sum(1 for n in graph.nodes if not n.is_io)
    loose = sum(1 for i in tree.root.nodes if not graph.nodes[i].is_io)
    return (f"{len(groups)} groups, {functions}; {loose} of {work} operations outside any "
            "group")


def summary_line(tree: GroupTree) -> str:
    """One line about the graph: nodes and module calls."""
    graph = tree.graph
    root = graph.root_class.rsplit(".", 1)[-1] if graph.root_class else "graph"
    return f"{root}: {len(graph.nodes)} nodes, {len(graph.calls)} module calls{origin(graph)}"


def origin(graph: Graph) -> str:
    """Where the module calls came from, when not from torch's metadata: `` (from node
    names: paths, no classes)``; else empty."""
    return " (from node names: paths, no classes)" if graph.structure == NODE_NAMES else ""


def render_compact(tree: GroupTree, *, calls: Calls | None = None,
                   max_depth: int | None = None, qualified: bool = False,
                   measures: bool = False) -> Tree:
    """The same rows as a rich tree whose labels wrap: for terminals too narrow for the table."""
    groups = list(tree.groups())
    origin = _origins(groups)
    root = Tree(Text("groups", style="bold"))
    branches: dict[int, Tree] = {0: root}
    top = tree.root.children
    for i, child in enumerate(top):
        for group, parent, _, hidden in _rows(child, tree.root, "", i == len(top) - 1, 0,
                                              max_depth):
            label = Text.assemble(
                (group.key, "bold"), f" (+{hidden} nested)" if hidden else "", "  ",
                _class_cell(group, qualified), f"  {group.size} nodes",
                _measure_text(tree, group) if measures else "", "  -> ",
                _function_cell(group, calls), "  ", (origin.get(group.index, ""), "dim"),
            )
            branches[group.index] = branches[parent.index].add(label)
    return root


def _measure_text(tree: GroupTree, group: Group) -> str:
    found = tree.measures(group)
    if found is None:
        return ""
    return " (" + " ".join(f"{k}={v}" for k, v in found.as_dict().items()) + ")"


def print_tree(console: Console, tree: GroupTree, *, title: str, calls: Calls | None = None,
               max_depth: int | None = None, qualified: bool = False,
               measures: bool = False) -> None:
    """The title, the table when it fits the console, else the wrapping tree, then a summary.

    Nothing is cut off: the title and summary lines are never wrapped, the tree's labels wrap.
    """
    console.print(Text(title, style="bold"), soft_wrap=True)
    table = render_tree(tree, calls=calls, max_depth=max_depth, qualified=qualified,
                        measures=measures)
    natural = Measurement.get(console, console.options.update_width(1_000_000), table).maximum
    if natural <= console.width and not console.is_terminal:  # a file: no trailing blanks
        with console.capture() as captured:
            console.print(table)
        console.file.write("".join(line.rstrip() + "\n"
                                   for line in captured.get().splitlines()))
    elif natural <= console.width:
        console.print(table)
    else:
        console.print(render_compact(tree, calls=calls, max_depth=max_depth, qualified=qualified,
                                     measures=measures))
    console.print(Text(_caption(tree, list(tree.groups()), calls), style="dim"), soft_wrap=True)
    for flat in tree.flattened:
        console.print(flattened_line(flat), soft_wrap=True)


def print_variants(console: Console, variants: Sequence["Variant"], calls: Mapping) -> None:
    """Why distinct: under each class lowered to more than one function, one line per
    function beside the first, with the first difference that kept it apart."""
    if not variants:
        return
    by_class: dict[tuple[str, str], list[Variant]] = {}
    for variant in variants:
        by_class.setdefault(variant.identity, []).append(variant)
    classes = f"{len(by_class)} class" + ("es" if len(by_class) > 1 else "")
    console.print(Text(f"why distinct ({classes} lowered to more than one function):",
                       style="bold"), soft_wrap=True)
    for (domain, name), found in by_class.items():
        functions = [found[0].first, *(v.function for v in found)]
        made = ", ".join(f"{f[1]} x{calls.get(f, 0)}" for f in functions)
        console.print(Text.assemble((f"{domain}::{name}", "green"),
                                    f": {len(functions)} functions ({made})"), soft_wrap=True)
        for variant in found:
            console.print(Text(f"  {variant.reason()}"), soft_wrap=True)


def flattened_line(flat: Flattened) -> Text:
    """One line about a group that ``on cycle flatten`` dissolved: which, why, where to."""
    into = f"group {flat.into}" if flat.into else "the top level"
    nodes = ", ".join(flat.nodes[:8]) + (", ..." if len(flat.nodes) > 8 else "")
    return Text.assemble(("flattened ", "yellow bold"), (flat.id, "bold"),
                         f" ({flat.call.class_name}, {flat.origin}): its nodes are in {into}; "
                         f"{flat.reason}; nodes involved: {nodes}")


def function_tree(model: "ir.Model", title: str = "functions") -> Tree:
    """A rich tree: top-level calls, then each function's callees (``xN`` = call sites)."""
    from rewrite.backends.onnx.summary import FunctionId, summarize, top_calls

    summaries = summarize(model)
    root = Tree(f"[bold]{title}[/bold]: {len(summaries)} functions, "
                f"{len(model.graph)} nodes in the main graph")

    def add(parent: Tree, fid: FunctionId, sites: int, depth: int) -> None:
        info = summaries[fid]
        branch = parent.add(
            f"[green]{info.label}[/green] x{sites}  [dim]{info.nodes} nodes, runs "
            f"{info.instances}x[/dim]"
        )
        if depth < 32:
            for callee, n in info.calls.items():
                add(branch, callee, n, depth + 1)

    for fid, n in top_calls(model).items():
        add(root, fid, n, 0)
    return root
