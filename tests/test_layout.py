"""The package's layout is the pipeline: import-linter's contracts (``.importlinter``) hold,
an upward import breaks them, no import cycle, and nothing loose at the package's top."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
FRONT_DOOR = {"__init__.py", "__main__.py", "api.py", "errors.py", "testing.py", "passes.py"}


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(lint), "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_import_contracts_hold():
    run = _lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "broken" in run.stdout and " 0 broken" in run.stdout


def test_an_upward_import_breaks_the_contracts(tmp_path):
    shutil.copytree(ROOT / "rewrite", tmp_path / "rewrite",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    tree = tmp_path / "rewrite" / "grouping" / "tree.py"
    tree.write_text(tree.read_text() + "\nimport rewrite.backends.onnx  # noqa: E402\n")
    run = _lint_imports(tmp_path)
    assert run.returncode != 0
    assert "rewrite.grouping.tree -> rewrite.backends.onnx" in run.stdout


def test_no_module_imports_itself_back():
    graph = grimp.build_graph("rewrite", cache_dir=None)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(imported, module):
                cycles.append(f"{module} -> {imported} -> ... -> {module}")
    assert not cycles, "\n".join(cycles)


def test_only_the_front_door_sits_at_the_package_top():
    loose = {p.name for p in (ROOT / "rewrite").glob("*.py")} - FRONT_DOOR
    assert not loose, f"modules at rewrite/'s top beside the front door: {sorted(loose)}"
