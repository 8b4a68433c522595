"""Selectors compiled into predicates over :class:`Facts`.

A selector is asked about a *module call* (group and flat rules) or about a *node* (tag
rules). Both are described by the same facts:

=============  ===============================  ===================================
predicate      on a module call                 on a node
=============  ===============================  ===================================
``path P``     the call's path matches           any call around the node matches
``class C``    the call's class matches          any call around the node matches
``op T``       some node of the call matches     the node's target matches
``k == "v"``   every node of the call has k=v    the node has k=v
``k != "v"``   ``not (k == "v")``                ``not (k == "v")``
``has k``      every node of the call has k      the node has k
=============  ===============================  ===================================
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping

from attrs import frozen

from rewrite.compile.patterns import ClassGlob, Glob, OpGlob, PatternError
from rewrite.errors import Diagnostic, RuleError
from rewrite.lang import ast


@frozen
class Facts:
    """What a selector may ask about its subject."""

    paths: tuple[str, ...]
    classes: tuple[str, ...]
    ops: Collection[str]
    tags: Mapping[str, str]


Predicate = Callable[[Facts], bool]


def _pattern(kind: type[Glob], node: ast.PathSelector | ast.ClassSelector | ast.OpSelector) -> Glob:
    try:
        return kind(node.pattern)
    except PatternError as e:
        raise RuleError([Diagnostic("error", f"bad pattern: {e}", node.span)]) from None


def compile_selector(node: ast.Selector) -> Predicate:
    """Turn a selector AST into a predicate; raises :class:`RuleError` on bad patterns."""
    if isinstance(node, ast.PathSelector):
        glob = _pattern(Glob, node)
        return lambda f: any(glob(p) for p in f.paths)
    if isinstance(node, ast.ClassSelector):
        cglob = _pattern(ClassGlob, node)
        return lambda f: any(cglob(c) for c in f.classes)
    if isinstance(node, ast.OpSelector):
        oglob = _pattern(OpGlob, node)
        return lambda f: any(oglob(o) for o in f.ops)
    if isinstance(node, ast.TagSelector):
        key, value = node.key, node.value
        if value is None:
            test: Predicate = lambda f: key in f.tags
        else:
            test = lambda f: f.tags.get(key) == value
        if node.negate:
            return lambda f: not test(f)
        return test
    if isinstance(node, ast.AnySelector):
        return lambda f: True
    if isinstance(node, ast.NotSelector):
        inner = compile_selector(node.operand)
        return lambda f: not inner(f)
    if isinstance(node, ast.BoolSelector):
        parts = tuple(compile_selector(o) for o in node.operands)
        if node.op == "and":
            return lambda f: all(p(f) for p in parts)
        return lambda f: any(p(f) for p in parts)
    raise TypeError(f"unknown selector {node!r}")  # pragma: no cover


def uses(node: ast.Selector, kind: type) -> bool:
    """Whether the selector contains a predicate of AST type ``kind``."""
    if isinstance(node, kind):
        return True
    if isinstance(node, ast.NotSelector):
        return uses(node.operand, kind)
    if isinstance(node, ast.BoolSelector):
        return any(uses(o, kind) for o in node.operands)
    return False
