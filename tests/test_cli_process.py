"""The ``rewrite`` process's collector settings (rewrite/cli/process.py): set by the entry
points only, the command's result unchanged."""

from __future__ import annotations

import gc
import subprocess
import sys

import onnx
import pytest

from rewrite.cli.main import main
from rewrite.cli.process import THRESHOLDS
from tests.onnx_fixtures import GPT2_RULES, assert_matches_eager

PROBE = """
import atexit, gc, sys
from rewrite.cli.process import run
atexit.register(lambda: print(gc.isenabled(), gc.get_threshold(), gc.get_freeze_count() > 0))
sys.argv = ["rewrite", *sys.argv[1:]]
run()
print("not reached")
"""


def _probe(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True)


def test_entry_point_sets_the_collector_runs_the_command_and_exits():
    proc = _probe("check", str(GPT2_RULES))
    out = proc.stdout.splitlines()
    assert proc.returncode == 0
    assert ": ok (" in out[0]
    assert out[-1] == f"True {THRESHOLDS} True"  # the exit handlers ran


def test_entry_point_exits_with_the_commands_code(tmp_path):
    proc = _probe("check", str(tmp_path / "missing.rules"))
    assert proc.returncode == 2
    assert "missing.rules" in proc.stderr


@pytest.mark.slow  # a process
def test_python_dash_m_is_the_entry_point(gpt2_pt2, gpt2_model, tmp_path):
    out = tmp_path / "gpt2.onnx"
    proc = subprocess.run([sys.executable, "-m", "rewrite", "-q", "apply", str(GPT2_RULES),
                           str(gpt2_pt2), "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    onnx.checker.check_model(str(out), full_check=True)
    assert_matches_eager(out, gpt2_model)


def test_main_leaves_the_callers_collector_alone():
    before = (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count())
    assert main(["-q", "check", str(GPT2_RULES)]) == 0
    assert (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()) == before
