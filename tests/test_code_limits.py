"""The team's limits on the code, checked on its syntax: no function in ``rewrite/`` over 60
lines, no class over 150; no import of a ``_``-prefixed module from outside its package in
``rewrite/``, ``bench/`` and ``tools/`` (``a.b._c`` is for the modules of ``a.b``; a package
exposes what other stages use in its ``__init__``); the suite and the benchmarks share models
and tools through ``tools/``, never by importing each other."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION = 60
MAX_CLASS = 150


def _sources(*folders: str) -> list[tuple[str, ast.Module]]:
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found.append((path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())))
    return found


def _module(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(path: str) -> str:
    """The package a module belongs to (a package's ``__init__``: the package itself)."""
    module = _module(path)
    return module if path.endswith("__init__.py") else module.rpartition(".")[0]


def _imported(node: ast.AST, package: str) -> list[str]:
    """The absolute names of the modules (or module attributes) ``node`` imports."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parent = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(parent + ([base] if base else []))
        return [f"{base}.{alias.name}" for alias in node.names]
    return []


def _is_module(parts: list[str]) -> bool:
    """Whether ``parts`` name a module or package of this repository (not a function)."""
    where = ROOT.joinpath(*parts)
    return where.with_suffix(".py").is_file() or where.is_dir()


def private_imports(path: str, tree: ast.Module) -> list[str]:
    """``path: name`` for each import of a ``_``-prefixed module of ``rewrite``, ``bench`` or
    ``tools`` from outside the package that holds it."""
    package = _package(path)
    bad = []
    for node in ast.walk(tree):
        for name in _imported(node, package):
            parts = name.split(".")
            if parts[0] not in ("rewrite", "bench", "tools"):
                continue
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__") and _is_module(parts[:i + 1]):
                    owner = ".".join(parts[:i])
                    if package != owner and not package.startswith(owner + "."):
                        bad.append(f"{path}: {name}")
                    break
    return bad


def oversized(path: str, tree: ast.Module) -> list[str]:
    bad = []
    for node in ast.walk(tree):
        limit = MAX_CLASS if isinstance(node, ast.ClassDef) else MAX_FUNCTION if isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        if limit is not None:
            lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if lines > limit:
                bad.append(f"{path}:{node.lineno} {node.name}: {lines} lines")
    return bad


def test_no_function_over_60_lines_and_no_class_over_150():
    found = [line for path, tree in _sources("rewrite") for line in oversized(path, tree)]
    assert not found, "\n".join(found)


def test_no_private_module_imported_from_outside_its_package():
    found = [line for path, tree in _sources("rewrite", "bench", "tools")
             for line in private_imports(path, tree)]
    assert not found, "\n".join(found)


FORBIDDEN = {"tests": ("bench",), "bench": ("tests",), "tools": ("tests", "bench")}
"""Top-level folder -> the folders its modules never import: what tests and benchmarks share
lives in ``tools/`` (models, the browser, the zoo), which imports neither."""


def crossing_imports(path: str, tree: ast.Module) -> list[str]:
    """``path: name`` for each import of a folder that :data:`FORBIDDEN` keeps apart."""
    forbidden = FORBIDDEN.get(path.split("/")[0], ())
    return [f"{path}: {name}" for node in ast.walk(tree)
            for name in _imported(node, _package(path)) if name.split(".")[0] in forbidden]


def test_tests_and_bench_do_not_import_each_other():
    found = [line for path, tree in _sources(*FORBIDDEN) for line in crossing_imports(path, tree)]
    assert not found, "\n".join(found)


def test_the_checks_find_what_they_forbid():
    stage = "rewrite/backends/onnx/finishing/_merge.py"
    assert private_imports(stage, ast.parse(
        "from rewrite.backends.onnx.outlining._naming import function_name")) == [
        f"{stage}: rewrite.backends.onnx.outlining._naming.function_name"]
    assert private_imports(stage, ast.parse(
        "from rewrite.backends.onnx.finishing._optimize import optimize\n"
        "from rewrite._private.errors import library_code")) == []
    assert private_imports("bench/x.py", ast.parse("import rewrite._private.errors")) == [
        "bench/x.py: rewrite._private.errors"]
    assert crossing_imports("tests/test_x.py", ast.parse(
        "from tools import models\nimport rewrite")) == []
    assert crossing_imports("tests/test_x.py", ast.parse("from bench.weights import run")) == [
        "tests/test_x.py: bench.weights.run"]
    assert crossing_imports("tools/x.py", ast.parse("from tests import models")) == [
        "tools/x.py: tests.models"]
    body = "\n".join(["    x = 1"] * 60)
    assert oversized("m.py", ast.parse(f"def f():\n{body}\n")) == ["m.py:1 f: 61 lines"]
