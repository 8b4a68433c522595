"""A :class:`Lock` from an ONNX model with functions, and from the tree that made them.

``[main]``: the main graph's inputs, outputs, the ops outside any function call, the calls.
``[function domain::name]``: per model-local function its call sites, runs per model run,
inputs and outputs (``dtype:rRANK``), declared attributes, op and call histograms, body
digest (:mod:`_digest`). ``[rule TEXT]``: per rule that made groups, the groups (display
ids) and the functions they became.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

import onnx_ir as ir

from rewrite.backends.onnx import (
    Keyer,
    Variants,
    call_sites,
    canonical_order,
    label,
    summarize,
)
from rewrite.errors import InputError, first_line, library_call
from rewrite.structure._digest import body_digest, histograms, value_type
from rewrite.structure._lock import Lock, Section, histogram_text

if TYPE_CHECKING:
    from rewrite.grouping import GroupTree

INLINED = "(inlined)"
"""What a rule's ``functions`` line says of a group that became no function."""


def _values(values: Iterable[ir.Value]) -> str:
    types = [value_type(v) for v in values]
    return f"{len(types)}: {', '.join(types)}" if types else "0"


def _main(model: ir.Model) -> Section:
    ops, calls = histograms(model.graph, model.functions)
    return Section("main", "", (
        ("inputs", _values(model.graph.inputs)),
        ("outputs", _values(model.graph.outputs)),
        ("ops", histogram_text(ops)),
        ("calls", histogram_text(calls)),
    ))


def _functions(model: ir.Model) -> list[Section]:
    functions = model.functions
    summaries = summarize(model)
    sites = call_sites(model)
    keyer = Keyer()
    sections = []
    for fid in sorted(functions, key=label):
        function = functions[fid]
        ops, calls = histograms(function, functions)
        sections.append(Section("function", label(fid), (
            ("call_sites", str(len(sites[fid]))),
            ("runs", str(summaries[fid].instances)),
            ("inputs", _values(function.inputs)),
            ("outputs", _values(function.outputs)),
            ("attributes", ", ".join(sorted(function.attributes)) or "-"),
            ("ops", histogram_text(ops)),
            ("calls", histogram_text(calls)),
            ("digest", body_digest(function, keyer)),
        )))
    return sections


def rule_text(rule) -> str:
    """The statement that made a group, as written (comments dropped, whitespace collapsed):
    the text of its span, from its first token to its last (two statements on one line are
    two texts)."""
    parts = [_uncommented(line) for line in rule.span.text.split("\n")]
    return " ".join(" ".join(parts).split())


def _uncommented(line: str) -> str:
    """``line`` up to a ``#`` outside a string."""
    quoted = escaped = False
    for k, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = quoted
        elif ch == '"':
            quoted = not quoted
        elif ch == "#" and not quoted:
            return line[:k]
    return line


def _natural(text: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def _rules(tree: "GroupTree", function_of: Mapping[str, tuple | None]) -> list[Section]:
    made: dict[str, tuple[list[str], Counter]] = {}
    for group in tree.groups():
        if group.rule is None:
            continue
        ids, functions = made.setdefault(rule_text(group.rule), ([], Counter()))
        ids.append(group.id)
        fid = function_of.get(group.id)
        functions[label(fid) if fid else INLINED] += 1
    return [
        Section("rule", text, (
            ("groups", f"{len(ids)}: {', '.join(sorted(ids, key=_natural))}"),
            ("functions", histogram_text(functions)),
        ))
        for text, (ids, functions) in sorted(made.items())
    ]


def of_model(model: ir.Model) -> Lock:
    """The structure of an ONNX model as it is (no rule sections: a file records where its
    rules were, not what they said)."""
    return Lock((_main(model), *_functions(model)), has_rules=False,
                variants=_variants(model))


_SUFFIX = re.compile(r"_(\d+)$")


def _variants(model: ir.Model) -> tuple:
    """Why-distinct records for a file's functions: ``Name_N`` beside ``Name`` of its domain
    (the names outlining gives a class's variants), compared as merging compares them."""
    functions = model.functions
    classes: dict[tuple[str, str], list] = {}
    for fid in functions:
        domain, name, overload = fid
        match = _SUFFIX.search(name)
        base = name[:match.start()] if match and (domain, name[:match.start()], overload) \
            in functions else name
        classes.setdefault((domain, base), []).append((int(match[1]) if base != name else 0,
                                                       fid))
    keyer = Keyer()
    found = Variants(functions)
    for identity, members in sorted(classes.items()):
        for _, fid in sorted(members) if len(members) > 1 else ():
            function = functions[fid]
            nodes, args = list(function), list(function.inputs)
            arg_keys = {id(v): ("arg", k) for k, v in enumerate(args)}
            order = canonical_order(keyer, nodes, {n: (k,) for k, n in enumerate(nodes)},
                                    lambda v: arg_keys.get(id(v)))
            key = keyer.body(identity, order, args, {}, list(function.outputs))
            found.add(identity, fid, key, order, args)
    return tuple(found.found)


def read_onnx(path: str | Path) -> ir.Model:
    """An ``.onnx`` file's model (external data left where it is), its functions' inputs
    typed as the file says (onnx_ir 1.1 reads a function's ``value_info`` for the values its
    nodes make, not for its inputs)."""
    import onnx

    with library_call("onnx_ir", f"reading {path}", lambda e: _unreadable(path, e),
                      parses_input=True):
        proto = onnx.load(str(path), load_external_data=False)
        model = ir.serde.deserialize_model(proto)
    for function_proto in proto.functions:
        function = model.functions.get((function_proto.domain, function_proto.name,
                                        getattr(function_proto, "overload", "")))
        infos = {info.name: info for info in function_proto.value_info}
        for value in function.inputs if function is not None else ():
            if value.type is None and value.name in infos:
                ir.serde.deserialize_value_info_proto(infos[value.name], value)
    return model


def of_lowering(lowering) -> Lock:
    """The structure a lowering (``backends.onnx.Lowering``) made, with its rules."""
    outlined = lowering.outlined
    sections = (_main(lowering.model), *_functions(lowering.model),
                *_rules(lowering.tree, outlined.function_of))
    return Lock(sections, variants=tuple(outlined.variants))


def _unreadable(path: str | Path, error: BaseException) -> InputError:
    reason = first_line(error) or type(error).__name__
    return InputError(f"{path}: not a readable ONNX model ({reason})")
