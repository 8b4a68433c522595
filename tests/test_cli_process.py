"""The ``rewrite`` process's collector settings (rewrite/cli/process.py): set by the entry
points only, the command's result unchanged."""

from __future__ import annotations

import gc
import subprocess
import sys

from rewrite.cli.main import main
from rewrite.cli.process import THRESHOLDS
from tests.onnx_fixtures import GPT2_RULES

PROBE = """
import gc, sys
from rewrite.cli.process import run
sys.argv = ["rewrite", "check", sys.argv[1]]
code = run()
print(code, gc.isenabled(), gc.get_threshold(), gc.get_freeze_count() > 0)
"""


def test_entry_point_sets_the_collector_and_runs_the_command():
    out = subprocess.run([sys.executable, "-c", PROBE, str(GPT2_RULES)], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert ": ok (" in out[0]
    assert out[-1] == f"0 True {THRESHOLDS} True"


def test_python_dash_m_is_the_entry_point(gpt2_pt2, tmp_path):
    out = tmp_path / "gpt2.onnx"
    proc = subprocess.run([sys.executable, "-m", "rewrite", "-q", "apply", str(GPT2_RULES),
                           str(gpt2_pt2), "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0


def test_main_leaves_the_callers_collector_alone():
    before = (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count())
    assert main(["-q", "check", str(GPT2_RULES)]) == 0
    assert (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()) == before
