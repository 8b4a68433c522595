"""The benchmarks' harness (``bench.harness``, as ``python -m bench.weights`` runs it) measures
what it says.

The benchmark itself runs on models of 0.5-2.5 GB; here its two pieces run on a tiny one: the
memory sampler (a child's anonymous memory counts, a file it maps does not) and one round of
the ``cp`` and ``rewrite apply`` rows, whose step timings must name the weights part.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from bench.procmem import measure
from bench.weights import WEIGHT_STEPS, bench_model, targets_table, weights_part
from tools import models

ALLOCATING_CHILD = textwrap.dedent("""
    import mmap, subprocess, sys, time
    child = "import time; b = bytearray(300 * 2**20); time.sleep(0.5)"
    with open(sys.argv[1], "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        mapped.read()  # 64 MB file-backed, not anonymous
        subprocess.run([sys.executable, "-c", child], check=True)
""")


def test_sampler_counts_children_and_tells_anonymous_from_file_backed(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(b"\1" * 64 * 2**20)
    result = measure([sys.executable, "-c", ALLOCATING_CHILD, str(data)])
    assert result.returncode == 0
    assert 300 <= result.anon_mb < 300 + 150  # the child's bytearray, plus two interpreters
    assert result.file_mb >= 64  # the parent's mapping
    assert result.seconds >= 0.5


@pytest.mark.slow  # the benchmark's rows, whole processes
def test_apply_and_cp_rows_measure_check_and_split_out_the_weights_part(tmp_path):
    pt2 = tmp_path / "llama.pt2"
    torch.export.save(models.export(models.llama(head=True)), str(pt2))
    results = bench_model("tiny", pt2, ["cp", "apply"], {"cp": 1, "apply": 1}, tmp_path / "w",
                          keep=False)
    cp, apply = results["cp"], results["apply"]
    assert cp.runs[0].output_bytes == pt2.stat().st_size
    assert apply.failed is None and apply.checker == "passed"
    assert apply.runs[0].output_bytes > 0
    assert apply.peak("anon_mb") > 50  # a Python process with torch imported
    assert weights_part(apply.steps(), WEIGHT_STEPS)[0], apply.steps()
    rows = "\n".join(targets_table({"tiny": results}, WEIGHT_STEPS))
    assert "weights part / `cp`" in rows and "`apply` peak RssAnon" in rows
    assert not (tmp_path / "w" / "apply").exists()  # outputs removed after the check
