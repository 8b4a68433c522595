"""What a process freed goes back to the system before a check opens onnxruntime
(``rewrite._shared.heap``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rewrite._shared.heap import give_back_freed


def _anon_mb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no RssAnon")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux only")
def test_freed_heap_memory_is_given_back():
    """400 MB of 80 KB blocks (malloc's heap, not mapped one by one), every 50th kept:
    glibc keeps the freed ones resident until trimmed."""
    blocks = [np.ones(20_000, dtype=np.float32) for _ in range(5000)]
    kept = blocks[::50]
    del blocks
    before = _anon_mb()
    give_back_freed()
    assert _anon_mb() < before - 300, (before, _anon_mb())
    assert len(kept) == 100
