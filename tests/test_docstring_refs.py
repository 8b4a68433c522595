"""Every ``:mod:`` / ``:func:`` / ``:class:`` / ``:meth:`` / ``:attr:`` / ``:data:`` / ``:exc:``
reference in the docstrings of ``rewrite/`` names something that exists.

A reference resolves, as Sphinx would look it up from where it is written: in the enclosing
classes, the module itself (its own names and what it imports), then each enclosing package
(``lowering._perbody`` from ``rewrite.backends.onnx.pipeline``), then as an absolute name. An
attribute is a class attribute, an annotated field (attrs) or one its methods assign
(``self.name = ...``).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1] / "rewrite"
ROLE = re.compile(r":(mod|func|class|meth|attr|data|exc):`~?\.?([A-Za-z_][\w.]*)`")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _self_attributes() -> dict[tuple[str, str], set[str]]:
    """Per (module, class qualname), the names its methods assign on ``self``."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            names = found.setdefault((module, cls.name), set())
            for node in ast.walk(cls):
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) else [])
                names.update(t.attr for t in targets if isinstance(t, ast.Attribute)
                             and isinstance(t.value, ast.Name) and t.value.id == "self")
    return found


SELF = _self_attributes()


def _has(obj: Any, name: str) -> bool:
    if hasattr(obj, name):
        return True
    if not isinstance(obj, type):
        return False
    return any(name in getattr(k, "__annotations__", {}) or name in getattr(k, "__slots__", ())
               or name in SELF.get((k.__module__, k.__qualname__), ()) for k in obj.__mro__)


def _walk(obj: Any, parts: list[str]) -> bool:
    for name in parts:
        if not _has(obj, name):
            return False
        obj = getattr(obj, name, None)
        if obj is None:  # a field or instance attribute: nothing below it to check
            return True
    return True


def _absolute(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return _walk(module, parts[i:])
    return False


def _resolves(module: ModuleType, classes: list[str], name: str) -> bool:
    parts = name.split(".")
    scopes: list[Any] = [module]
    for cls in classes:  # a class made inside a function is not reachable: its module is
        if not hasattr(scopes[-1], cls):
            break
        scopes.append(getattr(scopes[-1], cls))
    if any(_walk(scope, parts) for scope in scopes):
        return True
    package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
    while package:
        if _absolute(f"{package}.{name}"):
            return True
        package = package.rpartition(".")[0]
    return _absolute(name)


class _References(ast.NodeVisitor):
    """The unresolved references of one module's docstrings (and attribute docstrings)."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.classes: list[str] = []
        self.unresolved: list[str] = []

    def _check(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                    and isinstance(stmt.value.value, str):
                for role, name in ROLE.findall(stmt.value.value):
                    if not _resolves(self.module, self.classes, name):
                        self.unresolved.append(f":{role}:`{name}`")

    def visit_Module(self, node: ast.Module) -> None:
        self._check(node.body)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self._check(node.body)
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._check(node.body[:1])
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]


def test_every_docstring_reference_resolves():
    unresolved = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__main__.py":  # importing it runs the command
            continue
        visitor = _References(importlib.import_module(_module_name(path)))
        visitor.visit(ast.parse(path.read_text()))
        unresolved += [f"{path.relative_to(PACKAGE.parent)}: {r}" for r in visitor.unresolved]
    assert not unresolved, "\n".join(unresolved)


def test_a_stale_reference_is_found():
    """The check fails on a module that no longer exists (so the test above can fail)."""
    module = importlib.import_module("rewrite.backends.onnx.pipeline")
    assert not _resolves(module, [], "lowering._gone")
    assert not _resolves(module, [], "outline.outline")
    assert _resolves(module, [], "lowering.functional")
