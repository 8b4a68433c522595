"""Selectors compiled into predicates: one subject at a time, or many at once.

A selector is asked about a *module call* (group and flat rules) or about a *node* (tag
rules):

=============  ===================================  ===================================
selector       on a module call                     on a node
=============  ===================================  ===================================
``path P``     the call's path matches P             some call around the node matches
``path P@N``   the call's ``path@index`` matches     some call around the node matches
``class C``    the call's class matches C            some call around the node matches
``op T``       some node inside the call matches     the node's target matches
``k == "v"``   every node inside the call has k=v    the node has k=v
``k != "v"``   ``not (k == "v")``                    ``not (k == "v")``
``has k``      every node inside the call has k      the node has k
``any``        true                                  true
``size >= N``  the call's measure compares true      some call around the node does
=============  ===================================  ===================================

"Inside the call" includes the calls nested in it. The measures of a call (``size``,
``depth``, ``repeats``, ``call``) are defined in :mod:`rewrite.grouping.measures`. ``and``,
``or`` and ``not`` combine as usual. :func:`compile_selector` gives a predicate over one
:class:`Facts` (the reference semantics); :func:`compile_mask` gives a function over
:class:`Subjects`, which answers each basic question for all subjects at once as a numpy bool
array. Grouping uses the masks: the work is per distinct path, class, target and tag set, not
per node and rule.
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping, Protocol

import operator

import numpy as np
from attrs import field, frozen

from rewrite.compile.patterns import ClassGlob, Glob, OpGlob, PatternError
from rewrite.errors import Diagnostic, RuleError
from rewrite.lang import ast


@frozen
class Facts:
    """What a selector may ask about one subject."""

    paths: tuple[str, ...]
    classes: tuple[str, ...]
    ops: Collection[str]
    tags: Mapping[str, str]
    keys: tuple[str, ...] = field(default=())
    """``path@index`` of the same calls as ``paths`` (for patterns with ``@``)."""
    measures: tuple[Mapping[str, int], ...] = field(default=())
    """The measures (``size``, ``depth``, ``repeats``, ``call``) of the same calls."""


Predicate = Callable[[Facts], bool]


class Subjects(Protocol):
    """Many subjects asked the basic questions at once; each answer has one bool per subject."""

    size: int

    def path_mask(self, glob: Glob) -> np.ndarray: ...

    def key_mask(self, path: Glob, index: Glob) -> np.ndarray:
        """``path P@I``: the call's path matches P and its index (as text) matches I."""

    def class_mask(self, glob: ClassGlob) -> np.ndarray: ...

    def op_mask(self, glob: OpGlob) -> np.ndarray: ...

    def tag_mask(self, key: str, value: str | None) -> np.ndarray: ...

    def measure_mask(self, measure: str, op: str, value: int) -> np.ndarray:
        """``size >= 100``: the call's (or, for a node, some call around it) measure compares
        true."""


Mask = Callable[[Subjects], np.ndarray]


COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
           ">": operator.gt, ">=": operator.ge}
"""The comparisons of measure selectors; they work on ints and on numpy arrays alike."""


def _pattern(kind: type[Glob], node: ast.PathSelector | ast.ClassSelector | ast.OpSelector) -> Glob:
    try:
        if isinstance(node, ast.PathSelector) and node.pattern.count("@") > 1:
            raise PatternError(f"more than one '@' in {node.pattern!r}: write path@index")
        if isinstance(node, ast.PathSelector) and "@" in node.pattern:
            for part in node.pattern.split("@"):
                Glob(part)
        return kind(node.pattern)
    except PatternError as e:
        raise RuleError([Diagnostic("error", f"bad pattern: {e}", node.span)]) from None


def compile_selector(node: ast.Selector) -> Predicate:
    """Turn a selector AST into a predicate; raises :class:`RuleError` on bad patterns."""
    if isinstance(node, ast.PathSelector):
        glob = _pattern(Glob, node)
        if "@" in node.pattern:
            return lambda f: any(glob(k) for k in f.keys)
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
    if isinstance(node, ast.MeasureSelector):
        compare, measure, value = COMPARE[node.op], node.measure, node.value
        return lambda f: any(compare(m[measure], value) for m in f.measures)
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


def compile_mask(node: ast.Selector) -> Mask:
    """Turn a selector AST into a function of :class:`Subjects` (same semantics as
    :func:`compile_selector`); raises :class:`RuleError` on bad patterns."""
    if isinstance(node, ast.PathSelector):
        glob = _pattern(Glob, node)
        if "@" in node.pattern:
            path, index = node.pattern.split("@", 1)
            path_glob, index_glob = Glob(path), Glob(index)
            return lambda s: s.key_mask(path_glob, index_glob)
        return lambda s: s.path_mask(glob)
    if isinstance(node, ast.ClassSelector):
        cglob = _pattern(ClassGlob, node)
        return lambda s: s.class_mask(cglob)
    if isinstance(node, ast.OpSelector):
        oglob = _pattern(OpGlob, node)
        return lambda s: s.op_mask(oglob)
    if isinstance(node, ast.TagSelector):
        key, value = node.key, node.value
        if node.negate:
            return lambda s: ~s.tag_mask(key, value)
        return lambda s: s.tag_mask(key, value)
    if isinstance(node, ast.MeasureSelector):
        measure, op, value = node.measure, node.op, node.value
        return lambda s: s.measure_mask(measure, op, value)
    if isinstance(node, ast.AnySelector):
        return lambda s: np.ones(s.size, dtype=bool)
    if isinstance(node, ast.NotSelector):
        inner = compile_mask(node.operand)
        return lambda s: ~inner(s)
    if isinstance(node, ast.BoolSelector):
        parts = tuple(compile_mask(o) for o in node.operands)
        combine = np.logical_and if node.op == "and" else np.logical_or

        def combined(s: Subjects) -> np.ndarray:
            out = parts[0](s)
            for part in parts[1:]:
                out = combine(out, part(s))
            return out

        return combined
    raise TypeError(f"unknown selector {node!r}")  # pragma: no cover
