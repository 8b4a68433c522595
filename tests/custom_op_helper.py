"""Another library's custom operator, as a test needs it: importing this module registers
``torch.ops.rewrite_test.scale2`` (no ONNX translation exists for it); ``unregister`` drops it."""

from __future__ import annotations

import torch

LIBRARY = torch.library.Library("rewrite_test", "DEF")
LIBRARY.define("scale2(Tensor x) -> Tensor")
LIBRARY.impl("scale2", lambda x: x * 2, "CompositeExplicitAutograd")
torch.library.register_fake("rewrite_test::scale2", lib=LIBRARY)(lambda x: torch.empty_like(x))


class Scaled(torch.nn.Module):
    """A Linear, then the custom operator."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.rewrite_test.scale2(self.proj(x)) + 1


def unregister() -> None:
    LIBRARY._destroy()
