"""``bench/lock.py``'s in-process measure (what ``rewrite lock`` costs beyond grouping, and how
much of the ``.pt2`` it reads), on a small model: lowering and the lock read none of the
weights."""

from __future__ import annotations

import torch
from torch import nn

from bench.lock import measure


def test_the_lock_reads_no_weight(tmp_path):
    """The measure, on blocks with 64 MB of weights: what lowering and the lock page in of the
    ``.pt2`` stays far below the weights (``apply`` would check them all)."""

    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(2048, 2048) for _ in range(4))

        def forward(self, x):
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    pt2 = tmp_path / "wide.pt2"
    program = torch.export.export(Wide().eval(), (torch.randn(1, 2048),))
    torch.export.save(program, str(pt2))
    assert pt2.stat().st_size > 64e6
    rules = tmp_path / "wide.rules"
    rules.write_text("group class *Linear\n")
    found = measure(pt2, rules=rules)
    assert found["lock (of_lowering + dumps)"][1] < 8  # MB of the file resident
    steps = [seconds for name, (seconds, _) in found.items() if name.startswith("lower: ")]
    assert len(steps) >= 3 and sum(steps) <= found["lower (no file)"][0]  # the backend's steps
